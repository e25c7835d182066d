"""Layers of the Wan 2.1 video VAE (diffusers ``autoencoder_kl_wan``), channels-last, whole clip at once.

Every layer maps a video ``(B, T, H, W, C)``. Diffusers runs the VAE chunk by chunk with a
feature cache; these layers compute the same numbers on the whole clip: a cached causal
convolution equals a zero-padded causal convolution over the clip, and the temporal resamplers
pass the clip's first frame through untouched (see ``Resample``). Attribute names mirror
diffusers so checkpoint keys follow from parameter paths (``resample_conv`` is ``resample.1``).
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "RMSNorm", "CausalConv3d", "FrameConv2d", "ResidualBlock", "AttentionBlock", "Resample", "MidBlock", "UpBlock",
]

_NORM_EPS = 1e-12  # torch.nn.functional.normalize's default


def _kernel(rngs: nnx.Rngs, shape: tuple[int, ...], dtype) -> nnx.Param:
    fan_in = math.prod(shape[:-1])
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype) / math.sqrt(fan_in))


class RMSNorm(nnx.Module):
    """``WanRMS_norm``: ``x / max(|x|_2, eps) * sqrt(dim) * gamma (+ bias)`` over channels, in float32.

    ``gamma`` is stored flat ``(dim,)``; diffusers' ``(dim, 1, 1[, 1])`` is reshaped on load."""

    def __init__(self, dim: int, *, bias: bool = False, dtype=jnp.float32):
        self.gamma = nnx.Param(jnp.ones((dim,), dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), dtype)) if bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        norm = jnp.sqrt(jnp.sum(jnp.square(x32), axis=-1, keepdims=True))
        y = x32 / jnp.maximum(norm, _NORM_EPS) * math.sqrt(x.shape[-1]) * self.gamma[...].astype(jnp.float32)
        if self.bias is not None:
            y = y + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)


class CausalConv3d(nnx.Module):
    """``WanCausalConv3d``: a 3-D convolution padded ``2 * padding[0]`` frames before the clip (none after)
    and ``padding[1:]`` symmetrically in space. ``(B, T, H, W, cin) -> (B, T', H', W', cout)``."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int, int],
        *,
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int] = 0,
        dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        as3 = lambda v: (v,) * 3 if isinstance(v, int) else tuple(v)
        self.stride, self.padding = as3(stride), as3(padding)
        self.kernel = _kernel(rngs, (*as3(kernel), cin, cout), dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        pt, ph, pw = self.padding
        k = self.kernel[...]
        y = jax.lax.conv_general_dilated(
            x.astype(k.dtype), k, self.stride, [(2 * pt, 0), (ph, ph), (pw, pw)],
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
        )
        return y + self.bias[...]


class FrameConv2d(nnx.Module):
    """A 2-D convolution applied to every frame: ``(B, T, H, W, cin) -> (B, T, H', W', cout)``.

    ``padding`` is ``((top, bottom), (left, right))``: diffusers' downsampler pads right and bottom only."""

    def __init__(self, cin: int, cout: int, kernel: int, *, stride: int = 1, padding=((0, 0), (0, 0)),
                 dtype=jnp.float32, rngs: nnx.Rngs):
        self.stride, self.padding = stride, tuple(tuple(p) for p in padding)
        self.kernel = _kernel(rngs, (kernel, kernel, cin, cout), dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t = x.shape[:2]
        k = self.kernel[...]
        y = jax.lax.conv_general_dilated(
            x.reshape(b * t, *x.shape[2:]).astype(k.dtype), k, (self.stride,) * 2, self.padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        return (y + self.bias[...]).reshape(b, t, *y.shape[1:])


class ResidualBlock(nnx.Module):
    """``WanResidualBlock``: ``shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))`` with causal 3x3x3 convs.

    Dropout is not applied: the VAE runs in inference mode (diffusers' ``eval()``)."""

    def __init__(self, cin: int, cout: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.norm1 = RMSNorm(cin, dtype=dtype)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1, dtype=dtype, rngs=rngs)
        self.norm2 = RMSNorm(cout, dtype=dtype)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1, dtype=dtype, rngs=rngs)
        self.conv_shortcut = CausalConv3d(cin, cout, 1, dtype=dtype, rngs=rngs) if cin != cout else None

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)
        x = self.conv1(jax.nn.silu(self.norm1(x)))
        x = self.conv2(jax.nn.silu(self.norm2(x)))
        return x + h


class AttentionBlock(nnx.Module):
    """``WanAttentionBlock``: single-head self-attention over each frame's ``H*W`` pixels, plus the input."""

    def __init__(self, dim: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.norm = RMSNorm(dim, dtype=dtype)
        self.to_qkv = FrameConv2d(dim, 3 * dim, 1, dtype=dtype, rngs=rngs)
        self.proj = FrameConv2d(dim, dim, 1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, h, w, c = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(b * t, h * w, 1, 3 * c).astype(jnp.float32)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        y = jax.nn.dot_product_attention(q, k, v)  # softmax in float32
        y = self.proj(y.reshape(b, t, h, w, c).astype(x.dtype))
        return x + y


class Resample(nnx.Module):
    """``WanResample`` in mode ``upsample2d | upsample3d | downsample2d | downsample3d``.

    Spatial: nearest x2 then a 3x3 conv to ``out_dim`` (up), or a stride-2 3x3 conv after padding
    right/bottom by one (down). Temporal (3d modes), reproducing diffusers' chunked cache exactly:
    the first frame is never touched by ``time_conv``. ``upsample3d`` runs ``time_conv`` (``dim ->
    2 dim``) causally over frames ``1..`` alone (zero history) and splits each output frame in two
    (``T -> 1 + 2 (T-1)``); ``downsample3d`` runs the stride-2 ``time_conv`` unpadded over the whole
    clip and keeps frame 0 in front (``T -> 1 + (T-1)/2``).
    """

    MODES = ("upsample2d", "upsample3d", "downsample2d", "downsample3d")

    def __init__(self, dim: int, mode: str, *, out_dim: int | None = None, dtype=jnp.float32, rngs: nnx.Rngs):
        if mode not in self.MODES:
            raise ValueError(f"Resample mode must be one of {self.MODES} (got {mode!r})")
        self.mode = mode
        if mode.startswith("up"):
            out_dim = dim // 2 if out_dim is None else out_dim
            self.resample_conv = FrameConv2d(dim, out_dim, 3, padding=((1, 1), (1, 1)), dtype=dtype, rngs=rngs)
            if mode == "upsample3d":
                self.time_conv = CausalConv3d(dim, 2 * dim, (3, 1, 1), padding=(1, 0, 0), dtype=dtype, rngs=rngs)
        else:
            self.resample_conv = FrameConv2d(dim, dim, 3, stride=2, padding=((0, 1), (0, 1)), dtype=dtype, rngs=rngs)
            if mode == "downsample3d":
                self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.mode == "upsample3d" and x.shape[1] > 1:
            b, t, h, w, c = x.shape
            rest = self.time_conv(x[:, 1:]).reshape(b, t - 1, h, w, 2, c)
            rest = jnp.moveaxis(rest, 4, 2).reshape(b, 2 * (t - 1), h, w, c)
            x = jnp.concatenate([x[:, :1], rest.astype(x.dtype)], axis=1)
        if self.mode.startswith("up"):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)  # nearest-exact at scale 2
        x = self.resample_conv(x)
        if self.mode == "downsample3d" and x.shape[1] > 1:
            x = jnp.concatenate([x[:, :1], self.time_conv(x)], axis=1)
        return x


class MidBlock(nnx.Module):
    """``WanMidBlock``: residual, attention, residual at constant width."""

    def __init__(self, dim: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.resnets = nnx.List([ResidualBlock(dim, dim, dtype=dtype, rngs=rngs) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, dtype=dtype, rngs=rngs)])

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.resnets[0](x)
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            x = resnet(attn(x))
        return x


class UpBlock(nnx.Module):
    """``WanUpBlock``: ``num_res_blocks + 1`` residual blocks, then an optional ``Resample`` up."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, upsample_mode: str | None, *,
                 dtype=jnp.float32, rngs: nnx.Rngs):
        dims = [cin] + [cout] * (num_res_blocks + 1)
        self.resnets = nnx.List([ResidualBlock(a, b, dtype=dtype, rngs=rngs) for a, b in itertools.pairwise(dims)])
        self.upsamplers = (
            None if upsample_mode is None else nnx.List([Resample(cout, upsample_mode, dtype=dtype, rngs=rngs)])
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.upsamplers is None else self.upsamplers[0](x)
