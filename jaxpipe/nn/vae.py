"""A small convolutional autoencoder: images ``(B, H, W, C)`` <-> latents ``(B, H/f, W/f, latent_channels)``."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.nn.layers import compute_dtype

__all__ = ["AutoencoderConfig", "Autoencoder", "LatentStats"]


@dataclasses.dataclass(frozen=True)
class AutoencoderConfig:
    """Sizes of the autoencoder; the spatial downsampling factor is ``2 ** (len(widths) - 1)``.

    Attributes:
      image_channels: channels of the images (1: grey).
      latent_channels: channels of the latents.
      widths: the conv widths per resolution level, finest first (at least one).
      dtype: the compute dtype's name.
    """

    image_channels: int = 1
    latent_channels: int = 4
    widths: tuple[int, ...] = (32, 64)
    dtype: str = "float32"

    @classmethod
    def tiny(cls, **overrides) -> AutoencoderConfig:
        """The CPU-test size (the defaults), with ``overrides`` of any field."""
        return cls(**overrides)

    @classmethod
    def large(cls, **overrides) -> AutoencoderConfig:
        """RGB, 16 latent channels, widths ``(128, 256, 512, 512)`` (8× downsampling), with ``overrides``."""
        return cls(**{"image_channels": 3, "latent_channels": 16, "widths": (128, 256, 512, 512), **overrides})

    @property
    def downsample(self) -> int:
        """The spatial downsampling factor ``f = 2 ** (len(widths) - 1)``."""
        return 2 ** (len(self.widths) - 1)


class LatentStats(nnx.Variable):
    """Per-channel latent mean and std, fitted after training (not a trainable parameter)."""


def _conv(cin, cout, dtype, rngs, *, kernel=3, stride=1):
    return nnx.Conv(cin, cout, (kernel, kernel), strides=(stride, stride), padding="SAME", dtype=dtype, rngs=rngs)


class Autoencoder(nnx.Module):
    """Deterministic conv autoencoder with ``encode`` and ``decode``; videos go frame by frame."""

    def __init__(self, cfg: AutoencoderConfig, *, rngs: nnx.Rngs):
        if not cfg.widths:
            raise ValueError("AutoencoderConfig.widths must name at least one width")
        self.cfg = cfg
        dt = compute_dtype(cfg.dtype)
        w = cfg.widths
        self.enc_in = _conv(cfg.image_channels, w[0], dt, rngs)
        self.enc_down = nnx.List([_conv(w[i], w[i + 1], dt, rngs, stride=2) for i in range(len(w) - 1)])
        self.enc_mix = nnx.List([_conv(w[i + 1], w[i + 1], dt, rngs) for i in range(len(w) - 1)])
        self.enc_out = _conv(w[-1], cfg.latent_channels, dt, rngs, kernel=1)
        self.dec_in = _conv(cfg.latent_channels, w[-1], dt, rngs)
        self.dec_up = nnx.List([_conv(w[i + 1], w[i], dt, rngs) for i in reversed(range(len(w) - 1))])
        self.dec_mix = nnx.List([_conv(w[i], w[i], dt, rngs) for i in reversed(range(len(w) - 1))])
        self.dec_out = _conv(w[0], cfg.image_channels, dt, rngs)
        # Diffusion wants roughly unit-variance latents: encode() whitens by these, decode() undoes it.
        self.latent_mean = LatentStats(jnp.zeros((cfg.latent_channels,), jnp.float32))
        self.latent_std = LatentStats(jnp.ones((cfg.latent_channels,), jnp.float32))

    def encode(self, images: jax.Array) -> jax.Array:
        """Images ``(B, H, W, image_channels)`` in [-1, 1] -> latents ``(B, H/f, W/f, latent_channels)``."""
        chex.assert_rank(images, 4)
        f = self.cfg.downsample
        if images.shape[-1] != self.cfg.image_channels or images.shape[1] % f or images.shape[2] % f:
            raise ValueError(
                f"images must be (B, H, W, {self.cfg.image_channels}) with H, W divisible by {f}; got {images.shape}"
            )
        h = jax.nn.silu(self.enc_in(images))
        for down, mix in zip(self.enc_down, self.enc_mix):
            h = jax.nn.silu(down(h))
            h = h + jax.nn.silu(mix(h))
        return (self.enc_out(h).astype(jnp.float32) - self.latent_mean[...]) / self.latent_std[...]

    def decode(self, latents: jax.Array) -> jax.Array:
        """Latents ``(B, h, w, latent_channels)`` -> images ``(B, h·f, w·f, image_channels)`` (unclipped)."""
        chex.assert_rank(latents, 4)
        if latents.shape[-1] != self.cfg.latent_channels:
            raise ValueError(f"latents must have {self.cfg.latent_channels} channels; got {latents.shape}")
        h = jax.nn.silu(self.dec_in(latents * self.latent_std[...] + self.latent_mean[...]))
        for up, mix in zip(self.dec_up, self.dec_mix):
            b, hh, ww, c = h.shape
            h = jax.image.resize(h, (b, 2 * hh, 2 * ww, c), "nearest")
            h = jax.nn.silu(up(h))
            h = h + jax.nn.silu(mix(h))
        return self.dec_out(h).astype(jnp.float32)

    def fit_latent_stats(self, images: jax.Array) -> Autoencoder:
        """A copy whose ``encode`` maps ``images`` to zero-mean, unit-std latents per channel."""
        model = nnx.clone(self)
        z = model.encode(images) * self.latent_std[...] + self.latent_mean[...]
        model.latent_mean[...] = jnp.mean(z, axis=(0, 1, 2))
        model.latent_std[...] = jnp.std(z, axis=(0, 1, 2)) + 1e-6
        return model

    def encode_video(self, video: jax.Array) -> jax.Array:
        """``(B, T, H, W, C)`` frames -> ``(B, T, h, w, latent_channels)``."""
        b, t = video.shape[:2]
        z = self.encode(video.reshape((b * t,) + video.shape[2:]))
        return z.reshape((b, t) + z.shape[1:])

    def decode_video(self, latents: jax.Array) -> jax.Array:
        """``(B, T, h, w, latent_channels)`` -> ``(B, T, H, W, image_channels)``."""
        b, t = latents.shape[:2]
        x = self.decode(latents.reshape((b * t,) + latents.shape[2:]))
        return x.reshape((b, t) + x.shape[1:])
