"""The KL autoencoder of FLUX.1 and Stable Diffusion (diffusers ``AutoencoderKL``) in Flax NNX.

Images are channels-last ``(B, H, W, in_channels)`` with values in [-1, 1]; latents are
``(B, H/f, W/f, latent_channels)`` with ``f = 2 ** (len(block_out_channels) - 1)`` (8 for FLUX).
The encoder gives a diagonal Gaussian (``mean``, ``logvar``); ``encode`` / ``decode`` are exactly
diffusers' ``encode(x).latent_dist`` and ``decode(z).sample``, while ``encode_latents`` /
``decode_latents`` add the FLUX pipeline's normalisation ``(z - shift_factor) * scaling_factor``.

Attribute names mirror diffusers (``encoder.down_blocks.0.resnets.0.norm1``,
``decoder.mid_block.attentions.0.to_out.0``, ...), so ``hf.torch_key`` maps every parameter to
its checkpoint key with no renames; ``load(folder)`` reads a diffusers ``vae/`` folder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn import hf
from jaxpipe.nn.layers import compute_dtype

__all__ = ["AutoencoderKLConfig", "AutoencoderKL", "LOGICAL_AXES", "RENAMES", "load"]

# Every NNX name already is the diffusers name (GroupNorm scale -> weight is hf.torch_key's rule).
RENAMES: tuple[tuple[str, str], ...] = ()

# Replicated on purpose: the whole VAE is ~84 M parameters (335 MB in float32) and its memory is
# dominated by full-resolution activations, which shard with the batch over "data"; splitting
# conv channels across "model" would only add collectives to every layer.
LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = ()

_EPS = 1e-6  # every GroupNorm in the diffusers VAE (resnets, attention, output norms)
_LOGVAR_RANGE = (-30.0, 20.0)  # diffusers DiagonalGaussianDistribution clamps logvar here
# config.json keys of diffusers' AutoencoderKL that jaxpipe reads but that change nothing here:
# force_upcast only tells diffusers pipelines to run the VAE in float32 (ours is set by dtype).
_IGNORED_KEYS = frozenset({"force_upcast"})


@dataclasses.dataclass(frozen=True)
class AutoencoderKLConfig:
    """diffusers ``AutoencoderKL`` settings under their config.json names (FLUX.1's values by default)."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    act_fn: str = "silu"
    latent_channels: int = 16
    norm_num_groups: int = 32
    sample_size: int | tuple[int, ...] = 1024
    scaling_factor: float = 0.3611
    shift_factor: float | None = 0.1159
    latents_mean: tuple[float, ...] | None = None
    latents_std: tuple[float, ...] | None = None
    use_quant_conv: bool = False
    use_post_quant_conv: bool = False
    mid_block_add_attention: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("down_block_types", "up_block_types", "block_out_channels"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.sample_size, list):
            object.__setattr__(self, "sample_size", tuple(self.sample_size))
        n = len(self.block_out_channels)
        validate.rule(n > 0, "AutoencoderKLConfig.block_out_channels must name at least one width")
        for field, block in (("down_block_types", "DownEncoderBlock2D"), ("up_block_types", "UpDecoderBlock2D")):
            types = getattr(self, field)
            validate.rule(
                set(types) <= {block} and len(types) == n,
                f"{field} must be {n} x '{block}' (one per block_out_channels entry); got {types}",
            )
        validate.rule(
            self.act_fn in ("silu", "swish"), f"act_fn must be 'silu' (or its alias 'swish'); got {self.act_fn!r}"
        )
        groups = self.norm_num_groups
        validate.rule(
            groups > 0 and all(c > 0 and c % groups == 0 for c in self.block_out_channels),
            f"every block_out_channels entry must be a positive multiple of norm_num_groups "
            f"({groups}); got {self.block_out_channels}",
        )
        for name in ("in_channels", "out_channels", "latent_channels", "layers_per_block"):
            value = getattr(self, name)
            validate.rule(value > 0, f"AutoencoderKLConfig.{name} must be positive; got {value}")
        validate.rule(self.scaling_factor != 0, "AutoencoderKLConfig.scaling_factor must be nonzero")
        validate.rule(
            self.latents_mean is None and self.latents_std is None,
            "per-channel latents_mean / latents_std normalisation is not supported; this VAE "
            "normalises latents by shift_factor and scaling_factor only",
        )
        compute_dtype(self.dtype)

    @property
    def downsample(self) -> int:
        """The spatial factor between an image and its latent."""
        return 2 ** (len(self.block_out_channels) - 1)

    @classmethod
    def flux(cls, **overrides) -> AutoencoderKLConfig:
        """FLUX.1's VAE (``black-forest-labs/FLUX.1-dev`` ``vae/config.json``)."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> AutoencoderKLConfig:
        """A two-level VAE small enough for tests; block types follow ``block_out_channels``."""
        values: dict[str, Any] = dict(
            block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16
        )
        values.update(overrides)
        n = len(values["block_out_channels"])
        values.setdefault("down_block_types", ("DownEncoderBlock2D",) * n)
        values.setdefault("up_block_types", ("UpDecoderBlock2D",) * n)
        return cls(**values)

    @classmethod
    def from_json(cls, config: Mapping[str, Any], **overrides) -> AutoencoderKLConfig:
        """The config of a diffusers ``config.json`` dict; keys starting with ``_`` and
        ``force_upcast`` are ignored, any other unknown key is a ValueError. Keys the dict lacks
        take FLUX.1's values (diffusers writes every key). ``overrides`` (e.g. ``dtype``) win."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"dtype"}
        values = {}
        unknown = []
        for key, value in config.items():
            if key.startswith("_") or key in _IGNORED_KEYS:
                continue
            if key not in fields:
                unknown.append(key)
                continue
            values[key] = value
        if unknown:
            raise ValueError(f"AutoencoderKL config.json has keys this VAE does not know: {sorted(unknown)}")
        return cls(**{**values, **overrides})


def _conv(cin: int, cout: int, dtype, rngs: nnx.Rngs, *, kernel: int = 3, stride: int = 1, padding=None) -> nnx.Conv:
    pad = kernel // 2 if padding is None else padding
    padding = ((pad, pad), (pad, pad)) if isinstance(pad, int) else pad
    return nnx.Conv(
        cin,
        cout,
        (kernel, kernel),
        strides=(stride, stride),
        padding=padding,
        dtype=dtype,
        param_dtype=dtype,
        rngs=rngs,
    )


def _group_norm(channels: int, groups: int, dtype, rngs: nnx.Rngs) -> nnx.GroupNorm:
    # Two-pass variance like torch: E[x²]-E[x]² loses digits on large-mean activations.
    return nnx.GroupNorm(
        channels, groups, epsilon=_EPS, dtype=jnp.float32, param_dtype=dtype, use_fast_variance=False, rngs=rngs
    )


def _norm(norm: nnx.GroupNorm, x: jax.Array) -> jax.Array:
    """GroupNorm computed in float32, returned in the input's dtype."""
    return norm(x.astype(jnp.float32)).astype(x.dtype)


class ResnetBlock2D(nnx.Module):
    """``x + conv2(silu(norm2(conv1(silu(norm1(x))))))`` with a 1×1 ``conv_shortcut`` when widths differ."""

    def __init__(self, cin: int, cout: int, groups: int, dtype, rngs: nnx.Rngs):
        self.norm1 = _group_norm(cin, groups, dtype, rngs)
        self.conv1 = _conv(cin, cout, dtype, rngs)
        self.norm2 = _group_norm(cout, groups, dtype, rngs)
        self.conv2 = _conv(cout, cout, dtype, rngs)
        self.conv_shortcut = _conv(cin, cout, dtype, rngs, kernel=1) if cin != cout else None

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.conv1(jax.nn.silu(_norm(self.norm1, x)))
        h = self.conv2(jax.nn.silu(_norm(self.norm2, h)))
        skip = x if self.conv_shortcut is None else self.conv_shortcut(x)
        return skip + h


class Downsample2D(nnx.Module):
    """Stride-2 3×3 conv after a zero pad of one row / column at the bottom / right (diffusers ``padding=0``)."""

    def __init__(self, channels: int, dtype, rngs: nnx.Rngs):
        self.conv = _conv(channels, channels, dtype, rngs, stride=2, padding=((0, 1), (0, 1)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(x)


class Upsample2D(nnx.Module):
    """Nearest-neighbour 2× upsampling then a 3×3 conv."""

    def __init__(self, channels: int, dtype, rngs: nnx.Rngs):
        self.conv = _conv(channels, channels, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.conv(jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2))


class Attention(nnx.Module):
    """Single-head self-attention over all ``H·W`` positions of a group-normed map, plus the input."""

    def __init__(self, channels: int, groups: int, dtype, rngs: nnx.Rngs):
        self.group_norm = _group_norm(channels, groups, dtype, rngs)
        linear = lambda: nnx.Linear(channels, channels, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.to_q, self.to_k, self.to_v = linear(), linear(), linear()
        self.to_out = nnx.List([linear()])

    def __call__(self, x: jax.Array) -> jax.Array:
        b, h, w, c = x.shape
        tokens = _norm(self.group_norm, x).reshape(b, h * w, 1, c)
        # jax's reference attention takes the logits and softmax in float32 whatever the dtype.
        y = jax.nn.dot_product_attention(self.to_q(tokens), self.to_k(tokens), self.to_v(tokens))
        return x + self.to_out[0](y.reshape(b, h, w, c))


class UNetMidBlock2D(nnx.Module):
    """resnet → (attention →) resnet at the lowest resolution."""

    def __init__(self, channels: int, groups: int, add_attention: bool, dtype, rngs: nnx.Rngs):
        self.resnets = nnx.List([ResnetBlock2D(channels, channels, groups, dtype, rngs) for _ in range(2)])
        self.attentions = nnx.List([Attention(channels, groups, dtype, rngs)] if add_attention else [])

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.resnets[0](x)
        for attn in self.attentions:
            x = attn(x)
        return self.resnets[1](x)


class DownEncoderBlock2D(nnx.Module):
    """``num_layers`` resnets, then an optional stride-2 downsampler."""

    def __init__(self, cin: int, cout: int, num_layers: int, groups: int, downsample: bool, dtype, rngs: nnx.Rngs):
        self.resnets = nnx.List(
            [ResnetBlock2D(cin if i == 0 else cout, cout, groups, dtype, rngs) for i in range(num_layers)]
        )
        self.downsamplers = nnx.List([Downsample2D(cout, dtype, rngs)] if downsample else [])

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in [*self.resnets, *self.downsamplers]:
            x = layer(x)
        return x


class UpDecoderBlock2D(nnx.Module):
    """``num_layers`` resnets, then an optional 2× upsampler."""

    def __init__(self, cin: int, cout: int, num_layers: int, groups: int, upsample: bool, dtype, rngs: nnx.Rngs):
        self.resnets = nnx.List(
            [ResnetBlock2D(cin if i == 0 else cout, cout, groups, dtype, rngs) for i in range(num_layers)]
        )
        self.upsamplers = nnx.List([Upsample2D(cout, dtype, rngs)] if upsample else [])

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in [*self.resnets, *self.upsamplers]:
            x = layer(x)
        return x


class Encoder(nnx.Module):
    """Image ``(B, H, W, in_channels)`` -> Gaussian moments ``(B, H/f, W/f, 2·latent_channels)``."""

    def __init__(self, cfg: AutoencoderKLConfig, dtype, rngs: nnx.Rngs):
        widths, groups = cfg.block_out_channels, cfg.norm_num_groups
        self.conv_in = _conv(cfg.in_channels, widths[0], dtype, rngs)
        self.down_blocks = nnx.List(
            [
                DownEncoderBlock2D(
                    widths[max(i - 1, 0)], widths[i], cfg.layers_per_block, groups, i < len(widths) - 1, dtype, rngs
                )
                for i in range(len(widths))
            ]
        )
        self.mid_block = UNetMidBlock2D(widths[-1], groups, cfg.mid_block_add_attention, dtype, rngs)
        self.conv_norm_out = _group_norm(widths[-1], groups, dtype, rngs)
        self.conv_out = _conv(widths[-1], 2 * cfg.latent_channels, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(jax.nn.silu(_norm(self.conv_norm_out, x)))


class Decoder(nnx.Module):
    """Latent ``(B, h, w, latent_channels)`` -> image ``(B, h·f, w·f, out_channels)``."""

    def __init__(self, cfg: AutoencoderKLConfig, dtype, rngs: nnx.Rngs):
        widths, groups = tuple(reversed(cfg.block_out_channels)), cfg.norm_num_groups
        self.conv_in = _conv(cfg.latent_channels, widths[0], dtype, rngs)
        self.mid_block = UNetMidBlock2D(widths[0], groups, cfg.mid_block_add_attention, dtype, rngs)
        self.up_blocks = nnx.List(
            [
                UpDecoderBlock2D(
                    widths[max(i - 1, 0)], widths[i], cfg.layers_per_block + 1, groups, i < len(widths) - 1, dtype, rngs
                )
                for i in range(len(widths))
            ]
        )
        self.conv_norm_out = _group_norm(widths[-1], groups, dtype, rngs)
        self.conv_out = _conv(widths[-1], cfg.out_channels, dtype, rngs)

    def __call__(self, z: jax.Array) -> jax.Array:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(jax.nn.silu(_norm(self.conv_norm_out, x)))


class AutoencoderKL(nnx.Module):
    """diffusers ``AutoencoderKL``: channels-last images in [-1, 1] <-> latents, parameters only."""

    def __init__(self, config: AutoencoderKLConfig, *, rngs: nnx.Rngs):
        self.config = config
        dtype = compute_dtype(config.dtype)
        self.encoder = Encoder(config, dtype, rngs)
        self.decoder = Decoder(config, dtype, rngs)
        moments, latent = 2 * config.latent_channels, config.latent_channels
        self.quant_conv = _conv(moments, moments, dtype, rngs, kernel=1) if config.use_quant_conv else None
        self.post_quant_conv = _conv(latent, latent, dtype, rngs, kernel=1) if config.use_post_quant_conv else None

    def _check(self, x: jax.Array, channels: int, factor: int, what: str) -> None:
        chex.assert_rank(x, 4)
        if x.shape[-1] != channels or x.shape[1] % factor or x.shape[2] % factor:
            raise ValueError(
                f"{what} must be channels-last (B, H, W, {channels}) with H and W divisible by {factor}; got {x.shape}"
            )

    def encode(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(mean, logvar)`` of the posterior, each ``(B, H/f, W/f, latent_channels)`` float32, for
        images ``(B, H, W, in_channels)`` in [-1, 1]; logvar is clamped to [-30, 20] like diffusers."""
        cfg = self.config
        self._check(images, cfg.in_channels, cfg.downsample, "images")
        moments = self.encoder(images.astype(compute_dtype(cfg.dtype)))
        if self.quant_conv is not None:
            moments = self.quant_conv(moments)
        mean, logvar = jnp.split(moments.astype(jnp.float32), 2, axis=-1)
        return mean, jnp.clip(logvar, *_LOGVAR_RANGE)

    def encode_latents(self, images: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """Normalised latents ``(z - shift_factor) * scaling_factor`` ``(B, H/f, W/f, latent_channels)``,
        with ``z`` the posterior mode, or a posterior sample when ``key`` is given."""
        mean, logvar = self.encode(images)
        z = mean if key is None else mean + jnp.exp(0.5 * logvar) * jax.random.normal(key, mean.shape, jnp.float32)
        return (z - self._shift) * self.config.scaling_factor

    def decode(self, latents: jax.Array) -> jax.Array:
        """Images ``(B, h·f, w·f, out_channels)`` float32 from raw (unnormalised) latents
        ``(B, h, w, latent_channels)`` — diffusers ``decode(z).sample``, channels-last."""
        cfg = self.config
        self._check(latents, cfg.latent_channels, 1, "latents")
        z = latents.astype(compute_dtype(cfg.dtype))
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z).astype(jnp.float32)

    def decode_latents(self, latents: jax.Array) -> jax.Array:
        """Images from normalised latents: ``decode(latents / scaling_factor + shift_factor)``, as
        FluxPipeline does before ``vae.decode``."""
        return self.decode(jnp.asarray(latents, jnp.float32) / self.config.scaling_factor + self._shift)

    @property
    def _shift(self) -> float:
        return 0.0 if self.config.shift_factor is None else self.config.shift_factor

    @classmethod
    def load(cls, folder: str | Path, *, dtype: str = "float32") -> AutoencoderKL:
        """The VAE of a diffusers ``vae/`` folder (config.json + safetensors), parameters in ``dtype``;
        a checkpoint that does not fit raises ``hf.KeyMappingError`` naming the offending keys."""
        build = lambda config: cls(AutoencoderKLConfig.from_json(config, dtype=dtype), rngs=nnx.Rngs(0))
        return hf.load_module(folder, build, renames=RENAMES)

    def param_count(self) -> int:
        """Number of scalar parameters (works on an ``nnx.eval_shape`` module too)."""
        return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(self, nnx.Param)))


load = AutoencoderKL.load
