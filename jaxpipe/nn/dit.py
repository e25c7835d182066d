"""A diffusion transformer over latent videos (an image is a 1-frame video).

Patchify -> timestep + pooled-text conditioning -> adaLN-zero blocks (self-attention over
latent tokens, cross-attention to text, MLP) -> adaLN final layer -> unpatchify. An optional
first-frame input conditions image-to-video generation: its latent is concatenated to every
frame's tokens, with a flag channel marking frame 0. Per-row ``skip_blocks`` drop chosen blocks'
self-attention residual: the perturbed forward of spatio-temporal guidance (``policies.STG``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx

from jaxpipe.nn.layers import MLP, Attention, compute_dtype, sincos_1d, sincos_grid
from jaxpipe.nn.stacked import blocks, check_layout, scan

__all__ = ["DiTConfig", "DiTCond", "DiTBlock", "DiT", "LOGICAL_AXES", "LORA_TARGETS"]


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    """Sizes of the DiT.

    Attributes:
      latent_channels: channels of the latents it denoises.
      patch_size: the side of a square latent patch (one token).
      dim: the model width.
      depth: the number of blocks.
      heads: attention heads.
      mlp_ratio: the MLP hidden width as a multiple of ``dim``.
      text_dim: the width of the text context it cross-attends to.
      frame_cond: adds the first-frame conditioning input (image-to-video).
      time_embed_dim: the width of the sinusoidal timestep features.
      dtype: the compute dtype's name (``"float32"`` or ``"bfloat16"``).
      scan_layers: store the blocks stacked (``blocks/stacked/...``, one leading layer axis) and run them
        by one ``lax.scan``: compiled once, not ``depth`` times. ``False`` (the default) keeps one
        parameter set per block (``blocks/3/...``), the layout the bundled cards are saved in.
      remat: what each block keeps for the backward pass (``stacked.REMAT_POLICIES``).

    Raises:
      ValueError: on a non-bool ``scan_layers`` or an unknown ``remat``.
    """

    latent_channels: int = 4
    patch_size: int = 2
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    text_dim: int = 32
    frame_cond: bool = False
    time_embed_dim: int = 256
    dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"

    def __post_init__(self):
        check_layout(self)

    @classmethod
    def tiny(cls, **overrides) -> DiTConfig:
        """The CPU-test size (the defaults), with ``overrides`` of any field."""
        return cls(**overrides)

    @classmethod
    def small(cls, **overrides) -> DiTConfig:
        """Width 128, 4 blocks, 4 heads, with ``overrides`` of any field."""
        return cls(**{"dim": 128, "depth": 4, "heads": 4, **overrides})

    @classmethod
    def xl_1b(cls, **overrides) -> DiTConfig:
        """About a billion parameters; for abstract construction and real accelerators."""
        return cls(**{"latent_channels": 16, "dim": 2048, "depth": 12, "heads": 16, "text_dim": 1024, **overrides})

    @property
    def patch_features(self) -> int:
        """Features of one patch token before embedding: ``patch_size² · latent_channels``."""
        return self.patch_size**2 * self.latent_channels


LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"blocks/\d+/(?:attn|cross)/(?:q|kv)/kernel", ("embed", "heads")),
    (r"blocks/\d+/(?:attn|cross)/out/kernel", ("heads", "embed")),
    (r"blocks/\d+/mlp/fc1/kernel", ("embed", "mlp")),
    (r"blocks/\d+/mlp/fc1/bias", ("mlp",)),
    (r"blocks/\d+/mlp/fc2/kernel", ("mlp", "embed")),
    (r"(?:blocks/\d+/ada|ada_out)/kernel", ("embed", "mlp")),
    (r"(?:blocks/\d+/ada|ada_out)/bias", ("mlp",)),
    (r"(?:patch_embed|time_in|text_pool)/kernel", (None, "embed")),
    (r"(?:time_out|proj_out)/kernel", ("embed", None)),
)
"""Sharding (``jaxpipe.distributed``): logical axes per param dim; the first regex that fullmatches the
"/"-joined param path (from the DiT's root) wins, unmatched params are replicated."""

LORA_TARGETS: tuple[str, ...] = (
    "attn.q",
    "attn.kv",
    "attn.out",
    "cross.q",
    "cross.kv",
    "cross.out",
    "mlp.fc1",
    "mlp.fc2",
)
"""LoRA's default targets (``lora.LoRAConfig.target_modules=None``), as FLUX's: every attention projection
(self and cross) and the MLP of each block; the adaLN modulations, embedders and output layer stay as they are."""


def _modulate(h, shift, scale):
    return h * (1.0 + scale[:, None]) + shift[:, None]


def _zero_linear(din: int, dout: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        din,
        dout,
        dtype=dtype,
        kernel_init=nnx.initializers.zeros_init(),
        bias_init=nnx.initializers.zeros_init(),
        rngs=rngs,
    )


class DiTBlock(nnx.Module):
    """adaLN-zero block: modulated self-attention, cross-attention to text, modulated MLP."""

    def __init__(self, cfg: DiTConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.norm1 = nnx.LayerNorm(cfg.dim, use_bias=False, use_scale=False, dtype=dtype, rngs=rngs)
        self.attn = Attention(cfg.dim, cfg.heads, dtype=dtype, rngs=rngs)
        self.norm_cross = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.cross = Attention(cfg.dim, cfg.heads, context_dim=cfg.text_dim, dtype=dtype, rngs=rngs)
        self.norm2 = nnx.LayerNorm(cfg.dim, use_bias=False, use_scale=False, dtype=dtype, rngs=rngs)
        self.mlp = MLP(cfg.dim, int(cfg.dim * cfg.mlp_ratio), dtype=dtype, rngs=rngs)
        self.ada = _zero_linear(cfg.dim, 6 * cfg.dim, dtype, rngs)

    def __call__(self, h, c, context, context_mask, skip_attn=None):
        """``skip_attn`` ``(B,)`` bool (or ``None``): rows whose self-attention residual is dropped (STG's perturbed forward)."""
        shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(self.ada(jax.nn.silu(c)), 6, axis=-1)
        attn = gate1[:, None] * self.attn(_modulate(self.norm1(h), shift1, scale1))
        if skip_attn is not None:
            attn = jnp.where(skip_attn[:, None, None], jnp.zeros_like(attn), attn)
        h = h + attn
        h = h + self.cross(self.norm_cross(h), context, context_mask)
        return h + gate2[:, None] * self.mlp(_modulate(self.norm2(h), shift2, scale2))


class DiTCond(NamedTuple):
    """What a ``DiT`` conditions on (the ``cond`` of the denoiser protocol): text ``context``
    ``(B, L, text_dim)`` with ``context_mask`` ``(B, L)``, an optional ``first_frame`` latent
    ``(B, h, w, C)`` for image-to-video, and optional ``skip_blocks`` ``(B, K)`` int32: per row, the
    blocks whose self-attention is skipped (padded with -1; spatio-temporal guidance's perturbed
    forward). Being data, one compiled forward serves rows with different skips."""

    context: jax.Array
    context_mask: jax.Array
    first_frame: jax.Array | None = None
    skip_blocks: jax.Array | None = None

    def skipping(self, blocks: Sequence[int], width: int | None = None) -> DiTCond:
        """This conditioning with self-attention skipped in ``blocks`` on every row: ``skip_blocks``
        ``(B, width)`` (default ``len(blocks)``) holding ``blocks`` then -1 padding. ``skipping((), k)``
        skips nothing and computes the plain forward."""
        blocks = tuple(int(i) for i in blocks)
        width = len(blocks) if width is None else width
        if any(i < 0 for i in blocks) or width < len(blocks):
            raise ValueError(f"blocks must be non-negative block indices, at most width={width} of them (got {blocks})")
        row = jnp.asarray(blocks + (-1,) * (width - len(blocks)), jnp.int32)
        return self._replace(skip_blocks=jnp.broadcast_to(row, (self.context.shape[0], width)))


class DiT(nnx.Module):
    """Velocity network ``v(x, σ, text[, first frame])`` for latent videos ``(B, T, H, W, C)``."""

    LORA_TARGETS = LORA_TARGETS

    def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = compute_dtype(cfg.dtype)
        p2 = cfg.patch_size**2
        in_features = cfg.patch_features + (cfg.patch_features + p2 if cfg.frame_cond else 0)
        self.patch_embed = nnx.Linear(in_features, cfg.dim, dtype=dtype, rngs=rngs)
        self.time_in = nnx.Linear(cfg.time_embed_dim, cfg.dim, dtype=dtype, rngs=rngs)
        self.time_out = nnx.Linear(cfg.dim, cfg.dim, dtype=dtype, rngs=rngs)
        self.text_pool = nnx.Linear(cfg.text_dim, cfg.dim, dtype=dtype, rngs=rngs)
        self.blocks = blocks(lambda: DiTBlock(cfg, rngs), cfg.depth, scan=cfg.scan_layers)
        self.norm_out = nnx.LayerNorm(cfg.dim, use_bias=False, use_scale=False, dtype=dtype, rngs=rngs)
        self.ada_out = _zero_linear(cfg.dim, 2 * cfg.dim, dtype, rngs)
        self.proj_out = _zero_linear(cfg.dim, cfg.patch_features, dtype, rngs)

    def _tokens(self, x, first_frame):
        p = self.cfg.patch_size
        tokens = rearrange(x, "b t (h p) (w q) c -> b (t h w) (p q c)", p=p, q=p)
        if not self.cfg.frame_cond:
            if first_frame is not None:
                raise ValueError("first_frame was given but this DiT has no frame conditioning (frame_cond=False)")
            return tokens
        b, t, hh, ww, c = x.shape
        cond = jnp.zeros_like(x)
        flag = jnp.zeros((b, t, hh, ww, 1), x.dtype)
        if first_frame is not None:
            chex.assert_shape(first_frame, (b, hh, ww, c))
            # Every frame sees the given frame at its own location (as in Stable Video Diffusion), so
            # producing frame t is a local edit of what is under it; the flag marks frame 0 itself.
            cond = jnp.broadcast_to(first_frame.astype(x.dtype)[:, None], x.shape)
            flag = flag.at[:, 0].set(1.0)
        extra = rearrange(jnp.concatenate([cond, flag], -1), "b t (h p) (w q) c -> b (t h w) (p q c)", p=p, q=p)
        return jnp.concatenate([tokens, extra], axis=-1)

    def __call__(
        self,
        x: jax.Array,
        sigma: jax.Array,
        context: jax.Array,
        context_mask: jax.Array | None = None,
        first_frame: jax.Array | None = None,
        skip_blocks: jax.Array | None = None,
    ) -> jax.Array:
        """Velocity ``(B, T, H, W, C)`` float32 for latents ``x``, noise level ``sigma`` (scalar or ``(B,)``),
        text ``context`` ``(B, L, text_dim)`` with ``context_mask`` ``(B, L)``, optional ``first_frame`` ``(B, H, W, C)``
        and optional ``skip_blocks`` ``(B, K)`` (per row, the blocks whose self-attention residual is dropped; -1 pads)."""
        cfg = self.cfg
        chex.assert_rank(x, 5)
        b, t, hh, ww, c = x.shape
        p = cfg.patch_size
        if c != cfg.latent_channels or hh % p or ww % p:
            raise ValueError(
                f"x must be (B, T, H, W, {cfg.latent_channels}) with H, W divisible by patch_size={p}; got {x.shape}"
            )
        chex.assert_shape(context, (b, None, cfg.text_dim))
        if skip_blocks is not None:
            chex.assert_shape(skip_blocks, (b, None))
        dtype = compute_dtype(cfg.dtype)
        h = self.patch_embed(self._tokens(x.astype(dtype), first_frame))
        h = h + sincos_grid(t, hh // p, ww // p, cfg.dim).astype(h.dtype)

        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (b,))
        t_emb = self.time_out(jax.nn.silu(self.time_in(sincos_1d(sigma * 1000.0, cfg.time_embed_dim))))
        if context_mask is None:
            pooled = jnp.mean(context, axis=1)
        else:
            w = jnp.asarray(context_mask, jnp.float32)[..., None]
            pooled = jnp.sum(context * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)
        cond = t_emb + self.text_pool(pooled)

        context = context.astype(dtype)
        skips = None if skip_blocks is None else [jnp.any(skip_blocks == i, axis=-1) for i in range(cfg.depth)]
        h, _ = scan(
            self.blocks,
            lambda block, h, skip: (block(h, cond, context, context_mask, skip), None),
            h,
            skips,
            remat=cfg.remat,
        )
        shift, scale = jnp.split(self.ada_out(jax.nn.silu(cond)), 2, axis=-1)
        out = self.proj_out(_modulate(self.norm_out(h), shift, scale))
        v = rearrange(out, "b (t h w) (p q c) -> b t (h p) (w q) c", t=t, h=hh // p, w=ww // p, p=p, q=p)
        return v.astype(jnp.float32)

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: DiTCond) -> jax.Array:
        """The denoiser protocol (``jaxpipe.loops.denoise.Denoiser``): ``self(x, sigma, *cond)``."""
        return self(x, sigma, cond.context, cond.context_mask, cond.first_frame, cond.skip_blocks)
