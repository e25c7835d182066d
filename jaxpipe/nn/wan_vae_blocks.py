"""Layers of the Wan 2.1 video VAE (diffusers ``autoencoder_kl_wan``), channels-last, whole clip or chunk by chunk.

Every layer maps a video ``(B, T, H, W, C)``. ``layer(x)`` runs a whole clip; ``layer.chunk(x,
cache)`` runs the next frames of a clip and returns ``(y, cache)``, the cache being a pytree of
the frames the layer's causal convolutions need from before the chunk (``None`` starts a clip).
Feeding a clip chunk by chunk gives the whole-clip numbers: a causal convolution's cache is the
last ``2 * padding[0]`` frames it read (zeros before the clip, as its causal padding), and the
temporal resamplers pass the clip's first frame through untouched (see ``Resample``), which is
what diffusers' chunked ``feat_cache`` computes. Caches have the same shapes whatever the chunk
length, so they can be the carry of a ``jax.lax.scan``. Attribute names mirror diffusers so
checkpoint keys follow from parameter paths (``resample_conv`` is ``resample.1``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = [
    "AttentionBlock",
    "CausalConv3d",
    "FrameConv2d",
    "MidBlock",
    "RMSNorm",
    "Resample",
    "ResidualBlock",
    "UpBlock",
    "sequence",
    "stateless",
]

_NORM_EPS = 1e-12  # torch.nn.functional.normalize's default

Cache = Any  # a pytree of arrays (None where a layer needs no history)


def _tail(x: jax.Array, n: int) -> jax.Array:
    """The last ``n`` frames of ``x``, zero frames in front where it has fewer."""
    t = x.shape[1]
    if t < n:
        x = jnp.pad(x, ((0, 0), (n - t, 0)) + ((0, 0),) * (x.ndim - 2))
    return x[:, x.shape[1] - n :]


def sequence(x: jax.Array, cache: Cache, steps: list[Callable]) -> tuple[jax.Array, tuple]:
    """Runs ``steps`` in order on the next frames of a clip, each with its own entry of the cache.

    Args:
      x: the chunk ``(B, T, H, W, C)``.
      cache: one entry per step, as the previous call returned it; ``None`` when ``x`` starts the clip.
      steps: callables ``(x, cache) -> (x, cache)`` (a layer's ``chunk``, or ``stateless(fn)``).

    Returns:
      ``(y, cache)``: the last step's output and the tuple of the steps' caches.
    """
    caches = (None,) * len(steps) if cache is None else cache
    out = []
    for step, c in zip(steps, caches, strict=True):
        x, c = step(x, c)
        out.append(c)
    return x, tuple(out)


def stateless(fn: Callable[[jax.Array], jax.Array]) -> Callable:
    """A per-frame layer as a ``sequence`` step that carries nothing.

    Args:
      fn: ``x -> y`` that mixes no frames.

    Returns:
      ``(x, cache) -> (fn(x), None)``.
    """
    return lambda x, cache: (fn(x), None)


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
    and ``padding[1:]`` symmetrically in space. ``(B, T, H, W, cin) -> (B, T', H', W', cout)``.

    Chunk by chunk, the ``history = 2 * padding[0]`` frames before a chunk replace the padding: the
    cache is those frames of the input, ``(B, history, H, W, cin)`` (``None`` when ``history`` is 0)."""

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

    @property
    def history(self) -> int:
        """How many frames before its input the convolution reads (its causal padding)."""
        return 2 * self.padding[0]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """The convolution of the next frames ``x`` of a clip.

        Args:
          x: ``(B, T, H, W, cin)``.
          cache: the ``history`` input frames before ``x``, ``(B, history, H, W, cin)``; ``None``
            when ``x`` starts the clip (zero padding).

        Returns:
          ``(y, cache)``: ``y`` as ``__call__`` on the clip gives for these frames, and the cache
          for the next chunk (``None`` when ``history`` is 0).
        """
        _, ph, pw = self.padding
        k = self.kernel[...]
        x = x.astype(k.dtype)
        if cache is not None:
            x = jnp.concatenate([cache, x], axis=1)
        front = self.history if cache is None else 0
        y = jax.lax.conv_general_dilated(
            x,
            k,
            self.stride,
            [(front, 0), (ph, ph), (pw, pw)],
            dimension_numbers=("NDHWC", "DHWIO", "NDHWC"),
        )
        return y + self.bias[...], (_tail(x, self.history) if self.history else None)


class FrameConv2d(nnx.Module):
    """A 2-D convolution applied to every frame: ``(B, T, H, W, cin) -> (B, T, H', W', cout)``.

    ``padding`` is ``((top, bottom), (left, right))``: diffusers' downsampler pads right and bottom only."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        *,
        stride: int = 1,
        padding=((0, 0), (0, 0)),
        dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        self.stride, self.padding = stride, tuple(tuple(p) for p in padding)
        self.kernel = _kernel(rngs, (kernel, kernel, cin, cout), dtype)
        self.bias = nnx.Param(jnp.zeros((cout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t = x.shape[:2]
        k = self.kernel[...]
        y = jax.lax.conv_general_dilated(
            x.reshape(b * t, *x.shape[2:]).astype(k.dtype),
            k,
            (self.stride,) * 2,
            self.padding,
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
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: Cache = None) -> tuple[jax.Array, Cache]:
        """The block on the next frames ``x`` ``(B, T, H, W, cin)``: ``(y, cache)``, the cache ``(conv1's, conv2's)``."""
        c1, c2 = (None, None) if cache is None else cache
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)
        x, c1 = self.conv1.chunk(jax.nn.silu(self.norm1(x)), c1)
        x, c2 = self.conv2.chunk(jax.nn.silu(self.norm2(x)), c2)
        return x + h, (c1, c2)


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

    Chunk by chunk (``chunk``), the 2d modes carry nothing; ``upsample3d`` carries ``time_conv``'s
    two input frames (zeros after the first chunk) and maps a later chunk ``T -> 2 T``;
    ``downsample3d`` carries the chunk's last frame after the spatial conv and maps a later chunk
    of even length ``T -> T / 2`` (its stride-2 windows start on the clip's even frames).
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
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """The resampler on the next frames ``x`` ``(B, T, H, W, dim)`` of a clip (``cache=None``: they start it).

        Returns:
          ``(y, cache)``: ``y`` as ``__call__`` on the clip gives for these frames, and the cache for
          the next chunk (``None`` for the 2d modes).
        """
        if self.mode == "upsample3d":
            x, cache = self._time_upsample(x, cache)
        if self.mode.startswith("up"):
            x = jnp.repeat(jnp.repeat(x, 2, axis=2), 2, axis=3)  # nearest-exact at scale 2
        x = self.resample_conv(x)
        if self.mode == "downsample3d":
            x, cache = self._time_downsample(x, cache)
        return x, cache

    def _time_upsample(self, x: jax.Array, cache: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        b, _, h, w, c = x.shape
        first = None
        if cache is None:
            first, x = x[:, :1], x[:, 1:]
            if x.shape[1] == 0:
                return first, jnp.zeros((b, self.time_conv.history, h, w, c), self.time_conv.kernel.dtype)
        y, cache = self.time_conv.chunk(x, cache)
        t = x.shape[1]
        y = jnp.moveaxis(y.reshape(b, t, h, w, 2, c), 4, 2).reshape(b, 2 * t, h, w, c).astype(x.dtype)
        return (y if first is None else jnp.concatenate([first, y], axis=1)), cache

    def _time_downsample(self, x: jax.Array, cache: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        last = x[:, -1:]
        if cache is not None:
            return self.time_conv(jnp.concatenate([cache, x], axis=1)), last
        return (x if x.shape[1] == 1 else jnp.concatenate([x[:, :1], self.time_conv(x)], axis=1)), last


class MidBlock(nnx.Module):
    """``WanMidBlock``: residual, attention, residual at constant width."""

    def __init__(self, dim: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.resnets = nnx.List([ResidualBlock(dim, dim, dtype=dtype, rngs=rngs) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(dim, dtype=dtype, rngs=rngs)])

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: Cache = None) -> tuple[jax.Array, Cache]:
        """The block on the next frames ``x`` ``(B, T, H, W, dim)``: ``(y, cache)`` (attention is per frame)."""
        steps = [self.resnets[0].chunk]
        for attn, resnet in zip(self.attentions, self.resnets[1:]):
            steps += [stateless(attn), resnet.chunk]
        return sequence(x, cache, steps)


class UpBlock(nnx.Module):
    """``WanUpBlock``: ``num_res_blocks + 1`` residual blocks, then an optional ``Resample`` up."""

    def __init__(
        self, cin: int, cout: int, num_res_blocks: int, upsample_mode: str | None, *, dtype=jnp.float32, rngs: nnx.Rngs
    ):
        dims = [cin] + [cout] * (num_res_blocks + 1)
        self.resnets = nnx.List([ResidualBlock(a, b, dtype=dtype, rngs=rngs) for a, b in itertools.pairwise(dims)])
        self.upsamplers = (
            None if upsample_mode is None else nnx.List([Resample(cout, upsample_mode, dtype=dtype, rngs=rngs)])
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: Cache = None) -> tuple[jax.Array, Cache]:
        """The block on the next frames ``x`` ``(B, T, H, W, cin)``: ``(y, cache)``."""
        steps = [resnet.chunk for resnet in self.resnets]
        if self.upsamplers is not None:
            steps.append(self.upsamplers[0].chunk)
        return sequence(x, cache, steps)
