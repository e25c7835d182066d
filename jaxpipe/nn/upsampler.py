"""A learned latent upsampler: latent videos ``(B, T, h, w, C)`` -> ``(B, T, s·h, s·w, C)``, frame by frame.

LTX-2's two-stage pipeline denoises at a low latent resolution, upsamples the latents with a
small learned network and refines at full resolution. Here: a 3×3 conv stem, ``depth`` residual
conv blocks, and a zero-initialised 3×3 conv to ``C·s²`` channels rearranged to an ``s×`` larger
grid (pixel shuffle), added to the nearest-neighbour upsampling of the input. A fresh upsampler
is therefore exactly nearest-neighbour upsampling; training learns the detail on top.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx

from jaxpipe.nn.layers import check_sizes, compute_dtype

__all__ = ["LatentUpsamplerConfig", "LatentUpsampler"]


@dataclasses.dataclass(frozen=True)
class LatentUpsamplerConfig:
    """Sizes of the upsampler: ``latent_channels`` in and out, conv ``width``, ``depth`` residual blocks,
    spatial ``scale`` factor."""

    latent_channels: int = 4
    width: int = 32
    depth: int = 2
    scale: int = 2
    dtype: str = "float32"

    def __post_init__(self):
        check_sizes(self, ("latent_channels", "width", "scale"))
        check_sizes(self, ("depth",), minimum=0)
        compute_dtype(self.dtype)


def _conv(cin: int, cout: int, dtype, rngs: nnx.Rngs, *, zero: bool = False) -> nnx.Conv:
    init = {"kernel_init": nnx.initializers.zeros_init(), "bias_init": nnx.initializers.zeros_init()} if zero else {}
    return nnx.Conv(cin, cout, (3, 3), padding="SAME", dtype=dtype, rngs=rngs, **init)


class _ResBlock(nnx.Module):
    def __init__(self, width: int, dtype, rngs: nnx.Rngs):
        self.conv1 = _conv(width, width, dtype, rngs)
        self.conv2 = _conv(width, width, dtype, rngs)

    def __call__(self, h: jax.Array) -> jax.Array:
        return h + self.conv2(jax.nn.silu(self.conv1(jax.nn.silu(h))))


class LatentUpsampler(nnx.Module):
    """``(B, T, h, w, C)`` latents -> ``(B, T, scale·h, scale·w, C)`` float32, each frame on its own."""

    def __init__(self, cfg: LatentUpsamplerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = compute_dtype(cfg.dtype)
        self.stem = _conv(cfg.latent_channels, cfg.width, dtype, rngs)
        self.blocks = nnx.List([_ResBlock(cfg.width, dtype, rngs) for _ in range(cfg.depth)])
        self.head = _conv(cfg.width, cfg.latent_channels * cfg.scale**2, dtype, rngs, zero=True)

    def __call__(self, latents: jax.Array) -> jax.Array:
        cfg = self.cfg
        chex.assert_rank(latents, 5)
        b, t, hh, ww, c = latents.shape
        if c != cfg.latent_channels:
            raise ValueError(f"latents must be (B, T, h, w, {cfg.latent_channels}) (got {latents.shape})")
        s = cfg.scale
        frames = latents.reshape(b * t, hh, ww, c).astype(jnp.float32)
        h = self.stem(frames.astype(compute_dtype(cfg.dtype)))
        for block in self.blocks:
            h = block(h)
        detail = rearrange(self.head(jax.nn.silu(h)), "n h w (p q c) -> n (h p) (w q) c", p=s, q=s).astype(jnp.float32)
        nearest = jnp.repeat(jnp.repeat(frames, s, axis=1), s, axis=2)
        return (nearest + detail).reshape(b, t, s * hh, s * ww, c)
