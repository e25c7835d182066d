"""The Wan 2.1 video VAE (diffusers ``AutoencoderKLWan``) in Flax NNX: videos ``(B, F, H, W, 3)`` in
[-1, 1] <-> latents ``(B, 1 + (F-1)/4, H/8, W/8, z_dim)``, loaded from a diffusers ``vae/`` folder.

By default (``chunked=True``) ``encode`` runs the encoder on frame 0, then on chunks of
``ENCODE_CHUNK = 4`` frames, and ``decode`` runs the decoder one latent frame at a time, as
diffusers does; the causal convolutions' caches (the frames each needs from before the chunk,
see ``wan_vae_blocks``) are the carry of a ``jax.lax.scan`` over the chunks, so activations are
those of one chunk whatever the clip's length (compiled for 480p x 81 frames in float32 on CPU:
~6 GB of temporaries instead of ~48 GB). ``chunked=False`` runs the whole clip at once through the
same layers (zero causal padding in place of caches); both give diffusers' numbers. Wan 2.2's VAE (``is_residual``, ``patch_size``) is not covered.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn import hf
from jaxpipe.nn.layers import compute_dtype
from jaxpipe.nn.wan_vae_blocks import (
    CausalConv3d,
    MidBlock,
    Resample,
    ResidualBlock,
    RMSNorm,
    UpBlock,
    sequence,
    stateless,
)

__all__ = ["ENCODE_CHUNK", "LOGICAL_AXES", "RENAMES", "WanVAE", "WanVAEConfig", "load"]

ENCODE_CHUNK = 4  # frames per encoder chunk after frame 0, as diffusers; a multiple of any allowed temporal_factor

_WAN21_MEAN = (
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
)
_WAN21_STD = (
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.9160,
)

# diffusers config keys that only hint the pipeline (tiling, latent shapes); the network derives them.
_HINT_KEYS = ("scale_factor_temporal", "scale_factor_spatial")

# diffusers names the downsampler's conv by its place in an nn.Sequential.
RENAMES = ((r"\.resample_conv\.", ".resample.1."),)

# The VAE is ~127 M parameters of convolutions: replicated on every device (sharding it would
# only add collectives; its memory is the video activations, sharded by batch). The table lists
# every parameter kind so nothing is replicated by accident of an unmatched name.
LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r".*/(resample_conv|to_qkv|proj)/kernel", (None, None, None, None)),
    (r".*/kernel", (None, None, None, None, None)),
    (r".*/(bias|gamma)", (None,)),
)


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """Sizes of ``AutoencoderKLWan`` under diffusers' config names (Wan 2.1 defaults).

    ``temperal_downsample[i]`` halves time after encoder level ``i``; the decoder mirrors it.
    ``latents_mean`` / ``latents_std`` are the per-channel statistics the pipeline normalises with.
    """

    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = _WAN21_MEAN
    latents_std: tuple[float, ...] = _WAN21_STD
    decoder_base_dim: int | None = None
    in_channels: int = 3
    out_channels: int = 3
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("dim_mult", "attn_scales", "temperal_downsample", "latents_mean", "latents_std"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        validate.rule(
            bool(self.dim_mult)
            and min(self.dim_mult) >= 1
            and min(self.base_dim, self.z_dim, self.num_res_blocks) >= 1,
            f"WanVAEConfig: base_dim, z_dim, num_res_blocks and dim_mult must be positive ({self})",
        )
        validate.rule(
            len(self.temperal_downsample) == len(self.dim_mult) - 1,
            f"WanVAEConfig: temperal_downsample needs one entry per downsampling level "
            f"(len(dim_mult) - 1 = {len(self.dim_mult) - 1}), got {self.temperal_downsample}",
        )
        validate.rule(
            sum(map(bool, self.temperal_downsample)) <= 2,
            "WanVAEConfig: at most two temporal downsamplings (diffusers encodes chunks of 4 frames)",
        )
        validate.rule(
            not self.attn_scales,
            "WanVAEConfig: attn_scales must be empty (diffusers' Wan encoder cannot run attention in its "
            f"down blocks), got {self.attn_scales}",
        )
        validate.rule(
            len(self.latents_mean) == self.z_dim and len(self.latents_std) == self.z_dim,
            f"WanVAEConfig: latents_mean and latents_std need z_dim = {self.z_dim} values each",
        )
        compute_dtype(self.dtype)

    @classmethod
    def wan21(cls, **overrides) -> WanVAEConfig:
        """The Wan 2.1 VAE (``Wan-AI/Wan2.1-*-Diffusers/vae``)."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> WanVAEConfig:
        """A ~200 k-parameter VAE with every layer kind and the 2.1 shape (8x spatial, 4x temporal)."""
        fields = {
            "base_dim": 8,
            "z_dim": 4,
            "dim_mult": (1, 2, 2, 2),
            "num_res_blocks": 1,
            "latents_mean": _WAN21_MEAN[:4],
            "latents_std": _WAN21_STD[:4],
        }
        return cls(**{**fields, **overrides})

    @classmethod
    def from_json(cls, d: dict[str, Any], **overrides) -> WanVAEConfig:
        """A config from a diffusers ``config.json`` dict: ``_``-keys ignored, unknown keys a ValueError."""
        known = {f.name for f in dataclasses.fields(cls)} - {"dtype"}
        d = {k: v for k, v in d.items() if not k.startswith("_")}
        if d.pop("is_residual", False) or d.pop("patch_size", None) is not None:
            raise ValueError(
                "WanVAEConfig.from_json: is_residual / patch_size mean Wan 2.2's VAE, which is not supported"
            )
        unknown = sorted(set(d) - known - set(_HINT_KEYS))
        if unknown:
            raise ValueError(f"WanVAEConfig.from_json: unknown config key(s) {unknown}")
        return cls(**{k: v for k, v in d.items() if k in known}, **overrides)

    @property
    def spatial_factor(self) -> int:
        """The spatial downsampling factor, ``2 ** (len(dim_mult) - 1)`` (8 for Wan 2.1)."""
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_factor(self) -> int:
        """The temporal downsampling factor, 2 per true entry of ``temperal_downsample`` (4 for Wan 2.1)."""
        return 2 ** sum(map(bool, self.temperal_downsample))


class Encoder3d(nnx.Module):
    """``WanEncoder3d``: video ``(B, F, H, W, in_channels) -> (B, f, h, w, 2 z_dim)`` (mean and logvar)."""

    def __init__(self, cfg: WanVAEConfig, *, dtype, rngs: nnx.Rngs):
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(cfg.in_channels, dims[0], 3, padding=1, dtype=dtype, rngs=rngs)
        blocks: list[nnx.Module] = []
        for i, (cin, cout) in enumerate(itertools.pairwise(dims)):
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResidualBlock(cin, cout, dtype=dtype, rngs=rngs))
                cin = cout
            if i < len(cfg.dim_mult) - 1:
                mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
                blocks.append(Resample(cout, mode, dtype=dtype, rngs=rngs))
        self.down_blocks = nnx.List(blocks)
        self.mid_block = MidBlock(dims[-1], dtype=dtype, rngs=rngs)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: Any = None) -> tuple[jax.Array, Any]:
        """The encoder on the next frames ``x`` of a clip (``cache=None``: they start it): ``(h, cache)``.

        A later chunk's frame count must be a multiple of ``temporal_factor``; it gives
        ``T / temporal_factor`` latent frames (the first chunk ``1 + (T-1) / temporal_factor``)."""
        steps = [
            self.conv_in.chunk,
            *(block.chunk for block in self.down_blocks),
            self.mid_block.chunk,
            stateless(lambda x: jax.nn.silu(self.norm_out(x))),
            self.conv_out.chunk,
        ]
        return sequence(x, cache, steps)


class Decoder3d(nnx.Module):
    """``WanDecoder3d``: latents ``(B, f, h, w, z_dim) -> (B, 1 + 4 (f-1), 8 h, 8 w, out_channels)`` (unclamped)."""

    def __init__(self, cfg: WanVAEConfig, *, dtype, rngs: nnx.Rngs):
        base = cfg.base_dim if cfg.decoder_base_dim is None else cfg.decoder_base_dim
        dims = [base * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
        temperal_upsample = cfg.temperal_downsample[::-1]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1, dtype=dtype, rngs=rngs)
        self.mid_block = MidBlock(dims[0], dtype=dtype, rngs=rngs)
        blocks = []
        for i, (cin, cout) in enumerate(itertools.pairwise(dims)):
            cin = cin // 2 if i > 0 else cin  # the previous upsampler halved the width
            mode = None
            if i < len(cfg.dim_mult) - 1:
                mode = "upsample3d" if temperal_upsample[i] else "upsample2d"
            blocks.append(UpBlock(cin, cout, cfg.num_res_blocks, mode, dtype=dtype, rngs=rngs))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = RMSNorm(dims[-1], dtype=dtype)
        self.conv_out = CausalConv3d(dims[-1], cfg.out_channels, 3, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.chunk(x)[0]

    def chunk(self, x: jax.Array, cache: Any = None) -> tuple[jax.Array, Any]:
        """The decoder on the next latent frames ``x`` of a clip (``cache=None``: they start it): ``(video, cache)``.

        The first chunk of ``T`` latent frames gives ``1 + temporal_factor (T-1)`` frames, a later one
        ``temporal_factor T``."""
        steps = [
            self.conv_in.chunk,
            self.mid_block.chunk,
            *(block.chunk for block in self.up_blocks),
            stateless(lambda x: jax.nn.silu(self.norm_out(x))),
            self.conv_out.chunk,
        ]
        return sequence(x, cache, steps)


def _scan_chunks(step: Callable, x: jax.Array, size: int) -> jax.Array:
    """``step`` (``(x, cache) -> (y, cache)``) over frame 0 of ``x`` ``(B, 1 + size k, ...)`` alone, then
    over its ``k`` chunks of ``size`` frames in a ``jax.lax.scan`` carrying the cache; the outputs
    concatenated along time."""
    y0, cache = step(x[:, :1], None)
    b, t, *rest = x.shape
    k = (t - 1) // size
    if k == 0:
        return y0

    def body(cache, chunk):
        y, cache = step(chunk, cache)
        return cache, y

    chunks = jnp.moveaxis(x[:, 1:].reshape(b, k, size, *rest), 1, 0)
    _, ys = jax.lax.scan(body, cache, chunks)  # (k, B, t', ...)
    ys = jnp.moveaxis(ys, 0, 1)
    return jnp.concatenate([y0, ys.reshape(b, k * ys.shape[2], *ys.shape[3:])], axis=1)


class WanVAE(nnx.Module):
    """``AutoencoderKLWan`` (Wan 2.1): ``encode`` videos to a diagonal Gaussian, ``decode`` latents to videos.

    Both run chunk by chunk in a ``jax.lax.scan`` by default (``chunked=True``: diffusers' chunks,
    memory of one chunk) or on the whole clip at once (``chunked=False``); the results agree to
    float rounding."""

    def __init__(self, config: WanVAEConfig, *, rngs: nnx.Rngs):
        dtype = compute_dtype(config.dtype)
        z = config.z_dim
        self.config, self.dtype = config, dtype
        self.encoder = Encoder3d(config, dtype=dtype, rngs=rngs)
        self.quant_conv = CausalConv3d(2 * z, 2 * z, 1, dtype=dtype, rngs=rngs)
        self.post_quant_conv = CausalConv3d(z, z, 1, dtype=dtype, rngs=rngs)
        self.decoder = Decoder3d(config, dtype=dtype, rngs=rngs)

    def _check_video(self, video: jax.Array) -> None:
        cfg, shape = self.config, tuple(video.shape)
        if len(shape) != 5 or shape[-1] != cfg.in_channels:
            raise ValueError(f"WanVAE.encode: video must be (B, F, H, W, {cfg.in_channels}), got {shape}")
        if (shape[1] - 1) % 4:
            raise ValueError(f"WanVAE.encode: the frame count must be 1 + 4k (1, 5, 9, ...), got {shape[1]}")
        if shape[2] % cfg.spatial_factor or shape[3] % cfg.spatial_factor:
            raise ValueError(
                f"WanVAE.encode: height and width must be multiples of {cfg.spatial_factor}, got {shape[2:4]}"
            )

    def encode(self, video: jax.Array, *, chunked: bool = True) -> tuple[jax.Array, jax.Array]:
        """The posterior of a video in [-1, 1].

        Args:
          video: ``(B, F, H, W, C)`` with ``F = 1 + 4k`` and ``H``, ``W`` multiples of ``spatial_factor``.
          chunked: encode frame 0, then ``k`` chunks of ``ENCODE_CHUNK`` frames in a ``jax.lax.scan``
            (activations of one chunk); ``False`` encodes the whole clip at once (activations of all
            ``F`` frames).

        Returns:
          ``(mean, logvar)``, each ``(B, 1 + (F-1)/4, H/8, W/8, z_dim)`` float32 (for Wan 2.1's factors),
          logvar clipped to [-30, 20] as diffusers does.

        Raises:
          ValueError: for a video of another rank, channel count, frame count or size.
        """
        self._check_video(video)
        x = jnp.asarray(video, self.dtype)
        h = _scan_chunks(self.encoder.chunk, x, ENCODE_CHUNK) if chunked else self.encoder(x)
        mean, logvar = jnp.split(self.quant_conv(h).astype(jnp.float32), 2, axis=-1)
        return mean, jnp.clip(logvar, -30.0, 20.0)

    def decode(self, latents: jax.Array, *, chunked: bool = True) -> jax.Array:
        """The video of latents.

        Args:
          latents: ``(B, f, h, w, z_dim)``.
          chunked: decode one latent frame at a time in a ``jax.lax.scan`` (activations of one
            latent frame's video frames); ``False`` decodes all ``f`` at once.

        Returns:
          ``(B, 1 + 4 (f-1), 8 h, 8 w, C)`` float32 clipped to [-1, 1] (for Wan 2.1's factors).

        Raises:
          ValueError: for latents of another rank or channel count.
        """
        if latents.ndim != 5 or latents.shape[-1] != self.config.z_dim:
            raise ValueError(
                f"WanVAE.decode: latents must be (B, f, h, w, {self.config.z_dim}), got {tuple(latents.shape)}"
            )
        x = self.post_quant_conv(jnp.asarray(latents, self.dtype))
        video = _scan_chunks(self.decoder.chunk, x, 1) if chunked else self.decoder(x)
        return jnp.clip(video.astype(jnp.float32), -1.0, 1.0)

    def encode_latents(self, video: jax.Array, key: jax.Array | None = None, *, chunked: bool = True) -> jax.Array:
        """Normalised latents as the Wan pipelines use them: ``(z - latents_mean) * (1 / latents_std)``
        with ``z`` the posterior mode, or a posterior sample when ``key`` is given (``chunked`` as ``encode``)."""
        mean, logvar = self.encode(video, chunked=chunked)
        z = mean if key is None else mean + jnp.exp(0.5 * logvar) * jax.random.normal(key, mean.shape)
        m, inv_std = self._stats()
        return (z - m) * inv_std

    def decode_latents(self, latents: jax.Array, *, chunked: bool = True) -> jax.Array:
        """The video of normalised latents: ``decode(latents / (1 / latents_std) + latents_mean)``, as WanPipeline
        (``chunked`` as ``decode``)."""
        m, inv_std = self._stats()
        return self.decode(jnp.asarray(latents, jnp.float32) / inv_std + m, chunked=chunked)

    def _stats(self) -> tuple[jax.Array, jax.Array]:
        mean = jnp.asarray(self.config.latents_mean, jnp.float32)
        return mean, 1.0 / jnp.asarray(self.config.latents_std, jnp.float32)

    def param_count(self) -> int:
        """Number of parameters (works on an abstract ``nnx.eval_shape`` module too)."""
        return int(sum(x.size for x in jax.tree.leaves(nnx.state(self, nnx.Param))))


def load(folder: str | Path, *, dtype: str = "float32") -> WanVAE:
    """A ``WanVAE`` with the weights of a diffusers ``AutoencoderKLWan`` folder (``config.json`` + safetensors).

    Args:
      folder: the ``vae/`` folder.
      dtype: the parameter and compute dtype's name.

    Returns:
      The loaded ``WanVAE``.

    Raises:
      hf.KeyMappingError: naming any missing, unexpected or mis-shaped key.
    """
    build = lambda config: WanVAE(WanVAEConfig.from_json(config, dtype=dtype), rngs=nnx.Rngs(0))
    return hf.load_module(folder, build, prepare=_flat_gammas, renames=RENAMES)


def _flat_gammas(tensors: dict) -> dict:
    """diffusers keeps the RMS gammas broadcastable, ``(dim, 1, 1[, 1])``; here they are flat ``(dim,)``."""
    return {key: value.reshape(-1) if key.endswith(".gamma") else value for key, value in tensors.items()}
