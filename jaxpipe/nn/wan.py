"""The Wan 2.x video transformer (diffusers ``WanTransformer3DModel``) in Flax NNX, loadable from a
diffusers ``transformer/`` folder.

``WanTransformer.__call__`` is diffusers' forward on channels-first latents ``(B, C, F, H, W)`` with
diffusers-unit timesteps (0..1000); ``velocity`` is the jaxpipe ``Denoiser`` protocol on
channels-last latents ``(B, F, h, w, C)`` with ``sigma`` in [0, 1]. Wan predicts the flow-matching
velocity ``ε - x0``, so the output is the velocity as is. Blocks: ``wan_blocks``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn import hf
from jaxpipe.nn.attention import IMPLEMENTATIONS, check_implementation
from jaxpipe.nn.layers import check_sizes, compute_dtype
from jaxpipe.nn.stacked import Stacked, apply, blocks, check_layout
from jaxpipe.nn.wan_blocks import (
    F32,
    WanRotaryPosEmbed,
    WanTimeTextImageEmbedding,
    WanTransformerBlock,
    fp32_layer_norm,
    linear,
)

__all__ = ["IGNORED_KEYS", "LOGICAL_AXES", "RENAMES", "WanCond", "WanConfig", "WanTransformer", "load"]

RENAMES: tuple[tuple[str, str], ...] = ()
"""NNX path -> PyTorch key renames: none, every attribute mirrors diffusers' name."""

IGNORED_KEYS = re.compile(r".*\.norm_added_q\..*")
"""Checkpoint keys diffusers itself ignores on load (``_keys_to_ignore_on_load_unexpected``)."""

LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r".*/attn[12]/to_[qkv]/kernel", ("embed", "heads")),
    (r".*/attn[12]/to_[qkv]/bias", ("heads",)),
    (r".*/attn2/add_[kv]_proj/kernel", ("embed", "heads")),
    (r".*/attn2/add_[kv]_proj/bias", ("heads",)),
    (r".*/attn[12]/norm_(q|k|added_k)/scale", ("heads",)),
    (r".*/attn[12]/to_out/0/kernel", ("heads", "embed")),
    (r".*/ffn/net/0/proj/kernel", ("embed", "mlp")),
    (r".*/ffn/net/0/proj/bias", ("mlp",)),
    (r".*/ffn/net/2/kernel", ("mlp", "embed")),
    (r"blocks/\d+/scale_shift_table", (None, None, "embed")),
    (r"scale_shift_table", (None, None, "embed")),
    (r"condition_embedder/time_embedder/linear_1/kernel", (None, "embed")),
    (r"condition_embedder/time_embedder/linear_2/kernel", ("embed", None)),
    (r"condition_embedder/time_proj/kernel", ("embed", None)),
    (r"condition_embedder/text_embedder/linear_1/kernel", (None, "embed")),
    (r"condition_embedder/text_embedder/linear_2/kernel", ("embed", None)),
    (r"condition_embedder/image_embedder/ff/net/0/proj/kernel", (None, "mlp")),
    (r"condition_embedder/image_embedder/ff/net/2/kernel", ("mlp", "embed")),
    (r"patch_embedding/kernel", (None, None, None, None, "embed")),
    (r"proj_out/kernel", ("embed", None)),
)
"""(regex on the "/"-joined NNX param path, logical axis per dim); unmatched params are replicated."""


@dataclasses.dataclass(frozen=True)
class WanConfig:
    """``WanTransformer3DModel``'s config (same field names and defaults) plus jaxpipe's own: the parameter /
    activation ``dtype``, ``scan_layers`` (the blocks stored stacked and run by one ``lax.scan``: compiled once,
    not 40 times; ``False`` keeps diffusers' unrolled layout), ``remat`` (``stacked.REMAT_POLICIES``: what each
    block keeps for the backward pass) and ``attention`` (``attention.IMPLEMENTATIONS``; the backend is checked when
    the network first runs).

    ``qk_norm`` must be ``"rms_norm_across_heads"`` (the only norm diffusers builds); I2V models set
    ``image_dim`` (CLIP width) and ``added_kv_proj_dim`` (= the inner width heads·head_dim);
    first-last-frame models also set ``pos_embed_seq_len`` (two frames' image tokens).
    """

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int | None = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None
    rope_max_seq_len: int = 1024
    pos_embed_seq_len: int | None = None
    dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    attention: str = "xla"

    def __post_init__(self):
        patch = tuple(self.patch_size) if isinstance(self.patch_size, (list, tuple)) else (self.patch_size,)
        object.__setattr__(self, "patch_size", patch)
        if self.out_channels is None:  # diffusers: out_channels or in_channels
            object.__setattr__(self, "out_channels", self.in_channels)
        validate.rule(
            len(patch) == 3 and all(_positive(p) for p in patch),
            f"patch_size must be three positive ints (t, h, w) (got {self.patch_size!r})",
        )
        check_sizes(
            self,
            (
                "num_attention_heads",
                "attention_head_dim",
                "in_channels",
                "out_channels",
                "text_dim",
                "freq_dim",
                "ffn_dim",
                "num_layers",
                "rope_max_seq_len",
            ),
        )
        check_sizes(self, ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"), optional=True)
        validate.rule(
            self.attention_head_dim % 2 == 0,
            f"attention_head_dim must be even for the 3-D RoPE (got {self.attention_head_dim})",
        )
        validate.rule(
            self.qk_norm == "rms_norm_across_heads",
            f"qk_norm must be 'rms_norm_across_heads', the norm Wan uses (got {self.qk_norm!r})",
        )
        validate.positive(self, "eps")
        if self.added_kv_proj_dim is not None:
            validate.rule(
                self.image_dim is not None, "added_kv_proj_dim (I2V image K/V) needs image_dim (the image embedder)"
            )
            validate.rule(
                self.added_kv_proj_dim == self.inner_dim,
                f"added_kv_proj_dim must equal num_attention_heads * attention_head_dim = {self.inner_dim} "
                f"(it projects the embedded image tokens; got {self.added_kv_proj_dim})",
            )
        validate.rule(
            self.pos_embed_seq_len is None or (self.image_dim is not None and self.pos_embed_seq_len % 2 == 0),
            f"pos_embed_seq_len (two frames' image tokens) must be even and needs image_dim (got {self.pos_embed_seq_len})",
        )
        check_layout(self)
        validate.rule(
            self.attention in IMPLEMENTATIONS, f"attention must be one of {IMPLEMENTATIONS} (got {self.attention!r})"
        )
        compute_dtype(self.dtype)

    @property
    def inner_dim(self) -> int:
        """The model width, ``num_attention_heads · attention_head_dim``."""
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def t2v_1_3b(cls, **overrides) -> WanConfig:
        """Wan2.1-T2V-1.3B: 12 heads × 128, 30 layers, FFN 8960 (1,418,996,800 parameters)."""
        return cls(**{"num_attention_heads": 12, "num_layers": 30, "ffn_dim": 8960, **overrides})

    @classmethod
    def t2v_14b(cls, **overrides) -> WanConfig:
        """Wan2.1-T2V-14B (and each Wan2.2-T2V-A14B expert): 40 heads × 128, 40 layers, FFN 13824."""
        return cls(**{"num_attention_heads": 40, "num_layers": 40, "ffn_dim": 13824, **overrides})

    @classmethod
    def i2v_14b(cls, **overrides) -> WanConfig:
        """Wan2.1-I2V-14B: the 14B with 36 input channels (16 latent + 4 mask + 16 condition), CLIP image tokens (1280)
        and added image K/V projections (5120)."""
        return cls.t2v_14b(**{"in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120, **overrides})

    @classmethod
    def tiny(cls, **overrides) -> WanConfig:
        """2 heads × 16, 2 layers, 4 channels: for tests."""
        base = {
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "in_channels": 4,
            "out_channels": 4,
            "text_dim": 32,
            "freq_dim": 32,
            "ffn_dim": 64,
            "num_layers": 2,
        }
        return cls(**{**base, **overrides})

    @classmethod
    def from_json(cls, d: dict[str, Any], *, dtype: str | None = None) -> WanConfig:
        """From a diffusers ``config.json`` dict: ``_``-prefixed keys are ignored, unknown keys are a ValueError."""
        d = {k: v for k, v in d.items() if not k.startswith("_")}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown WanTransformer3DModel config key(s): {', '.join(unknown)}")
        if dtype is not None:
            d["dtype"] = dtype
        return cls(**d)


def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


class WanCond(NamedTuple):
    """What ``WanTransformer.velocity`` conditions on: text ``context`` ``(B, T, text_dim)``; CLIP
    ``image_embeds`` ``(B, S, image_dim)`` (I2V 2.1) or None; ``condition`` ``(B, F, h, w, C_cond)``
    concatenated to the latents on channels (I2V: 4 mask + 16 first-frame latent channels) or None."""

    context: jax.Array
    image_embeds: jax.Array | None = None
    condition: jax.Array | None = None


class WanTransformer(nnx.Module):
    """diffusers' ``WanTransformer3DModel``: 3-D patch embedding, RoPE, ``num_layers`` Wan blocks,
    modulated output norm and projection, unpatchify."""

    def __init__(self, config: WanConfig, *, rngs: nnx.Rngs):
        self.config = config
        dtype = compute_dtype(config.dtype)
        dim = config.inner_dim
        self.rope = WanRotaryPosEmbed(config.attention_head_dim, config.patch_size, config.rope_max_seq_len)
        self.patch_embedding = nnx.Conv(
            config.in_channels,
            dim,
            kernel_size=config.patch_size,
            strides=config.patch_size,
            padding="VALID",
            dtype=dtype,
            param_dtype=dtype,
            rngs=rngs,
        )
        self.condition_embedder = WanTimeTextImageEmbedding(
            dim, config.freq_dim, config.text_dim, config.image_dim, config.pos_embed_seq_len, dtype=dtype, rngs=rngs
        )
        self.blocks = blocks(
            lambda: WanTransformerBlock(
                dim,
                config.ffn_dim,
                config.num_attention_heads,
                cross_attn_norm=config.cross_attn_norm,
                eps=config.eps,
                added_kv_proj_dim=config.added_kv_proj_dim,
                dtype=dtype,
                rngs=rngs,
                implementation=config.attention,
            ),
            config.num_layers,
            scan=config.scan_layers,
        )
        self.norm_out = fp32_layer_norm(dim, config.eps, False, rngs)
        self.proj_out = linear(dim, config.out_channels * math.prod(config.patch_size), dtype, rngs)
        self.scale_shift_table = nnx.Param(jax.random.normal(rngs.params(), (1, 2, dim), F32) / dim**0.5)

    @classmethod
    def abstract(cls, config: WanConfig) -> WanTransformer:
        """The network with ``jax.ShapeDtypeStruct`` parameters (no allocation), as ``nnx.eval_shape`` builds it.

        ``nnx.eval_shape`` of the whole network costs time quadratic in its parameter count under
        JAX 0.10 (each RNG draw inspects every traced equation so far: 80 s for the 14B), so one
        block is traced and copied ``num_layers`` times (stacked, when ``scan_layers``); the structure is the same.
        """
        one = dataclasses.replace(config, num_layers=1, scan_layers=False)
        model = nnx.eval_shape(lambda: cls(one, rngs=nnx.Rngs(0)))
        block, n = model.blocks[0], config.num_layers
        if config.scan_layers:
            model.blocks = nnx.eval_shape(lambda b: Stacked([b] * n), block)
        else:
            model.blocks = nnx.List([block, *(nnx.clone(block) for _ in range(n - 1))])
        model.config = config
        return model

    def param_count(self) -> int:
        """Number of parameter elements (works on an ``nnx.eval_shape`` model)."""
        return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(self, nnx.Param)))

    def forward_channels_last(
        self,
        x: jax.Array,
        timestep: jax.Array,
        encoder_hidden_states: jax.Array,
        encoder_hidden_states_image: jax.Array | None = None,
    ) -> jax.Array:
        """``__call__`` on channels-last latents: ``x`` ``(B, F, H, W, in_channels)`` -> ``(B, F, H, W, out_channels)`` float32."""
        cfg = self.config
        chex.assert_rank(x, 5)
        b, f, hh, ww, c = x.shape
        pt, ph, pw = cfg.patch_size
        if c != cfg.in_channels or f % pt or hh % ph or ww % pw:
            raise ValueError(
                f"latents must have {cfg.in_channels} channels and (F, H, W) divisible by patch_size={cfg.patch_size}; "
                f"got channels-last shape {x.shape}"
            )
        timestep = jnp.broadcast_to(jnp.asarray(timestep, F32), (b,))
        chex.assert_shape(encoder_hidden_states, (b, None, cfg.text_dim))
        image = encoder_hidden_states_image
        if (image is None) != (cfg.image_dim is None):
            raise ValueError(
                "encoder_hidden_states_image is required by and only by an image-conditioned model "
                f"(image_dim={cfg.image_dim}; got {'None' if image is None else image.shape})"
            )
        if image is not None:
            chex.assert_rank(image, 3)
            s = cfg.pos_embed_seq_len or image.shape[1]
            if image.shape[-1] != cfg.image_dim or (image.shape[0] * image.shape[1]) != b * s:
                raise ValueError(
                    f"encoder_hidden_states_image must be (B={b}, S, {cfg.image_dim}) "
                    f"(S·B = {b}·pos_embed_seq_len when set); got {image.shape}"
                )
        dtype = compute_dtype(cfg.dtype)
        check_implementation(cfg.attention)
        grid = (f // pt, hh // ph, ww // pw)
        rope = tuple(jnp.asarray(t) for t in self.rope(grid))

        h = self.patch_embedding(x.astype(dtype)).reshape(b, math.prod(grid), cfg.inner_dim)
        temb, timestep_proj, context, image = self.condition_embedder(
            timestep, encoder_hidden_states.astype(dtype), image
        )
        timestep_proj = timestep_proj.reshape(b, 6, cfg.inner_dim)
        if image is not None and cfg.added_kv_proj_dim is None:
            # Without added K/V the image tokens join the text as one context (diffusers concatenates image first).
            context, image = jnp.concatenate([image, context], axis=1), None
        h = apply(self.blocks, lambda block, h: block(h, context, image, timestep_proj, rope), h, remat=cfg.remat)

        mods = self.scale_shift_table[...] + temb.astype(F32)[:, None]
        shift, scale = mods[:, 0:1], mods[:, 1:2]
        h = (self.norm_out(h.astype(F32)) * (1 + scale) + shift).astype(dtype)
        out = self.proj_out(h).reshape(b, *grid, pt, ph, pw, cfg.out_channels)
        out = out.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, f, hh, ww, cfg.out_channels)
        return out.astype(F32)

    def __call__(
        self,
        hidden_states: jax.Array,
        timestep: jax.Array,
        encoder_hidden_states: jax.Array,
        encoder_hidden_states_image: jax.Array | None = None,
    ) -> jax.Array:
        """diffusers' forward: latents ``(B, C, F, H, W)`` (channels first), ``timestep`` ``(B,)`` in 0..1000,
        text ``(B, T, text_dim)``, CLIP tokens ``(B, 257, image_dim)`` or None -> ``(B, out_channels, F, H, W)`` float32.

        I2V cross-attention splits image from text by the image token count (diffusers assumes 512
        text tokens, which its pipelines always pad to; with 512 tokens the two agree)."""
        chex.assert_rank(hidden_states, 5)
        x = jnp.moveaxis(hidden_states, 1, -1)
        out = self.forward_channels_last(x, timestep, encoder_hidden_states, encoder_hidden_states_image)
        return jnp.moveaxis(out, -1, 1)

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: WanCond) -> jax.Array:
        """The ``Denoiser`` protocol: velocity ``(B, F, h, w, out_channels)`` float32 of channels-last latents
        ``x`` ``(B, F, h, w, C)`` at noise level ``sigma`` (``(B,)`` or scalar, in [0, 1]; timestep = 1000·σ)."""
        chex.assert_rank(x, 5)
        if cond.condition is not None:
            chex.assert_shape(cond.condition, (*x.shape[:4], None))
            x = jnp.concatenate([x, cond.condition.astype(x.dtype)], axis=-1)
        timestep = 1000.0 * jnp.broadcast_to(jnp.asarray(sigma, F32), (x.shape[0],))
        return self.forward_channels_last(x, timestep, cond.context, cond.image_embeds)


def load(
    folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none", attention: str = "xla"
) -> WanTransformer:
    """A ``WanTransformer`` from a diffusers ``transformer/`` folder (``config.json`` + safetensors, sharded or not).

    Built abstractly, then every parameter is filled from the checkpoint; missing, unexpected or
    mis-shaped keys raise ``hf.KeyMappingError`` naming them. Keys diffusers ignores
    (``norm_added_q``, in some I2V conversions) are dropped first.

    Args:
      folder: the ``transformer/`` folder.
      dtype: the parameter and compute dtype's name.
      scan_layers: store the blocks stacked (diffusers' per-layer keys are stacked on load).
      remat: the blocks' rematerialisation policy (``stacked.REMAT_POLICIES``).
      attention: the attention implementation (``attention.IMPLEMENTATIONS``).

    Returns:
      The loaded ``WanTransformer``.

    Raises:
      FileNotFoundError: if ``config.json`` or the weights are missing.
      hf.KeyMappingError: naming missing, unexpected or mis-shaped keys.
    """
    folder = Path(folder)
    config = dataclasses.replace(
        WanConfig.from_json(hf.read_config(folder), dtype=dtype),
        scan_layers=scan_layers,
        remat=remat,
        attention=attention,
    )
    module = WanTransformer.abstract(config)
    tensors = {k: v for k, v in hf.read_tensors(folder).items() if not IGNORED_KEYS.fullmatch(k)}
    return hf.load_into(module, tensors, renames=RENAMES, where=str(folder))
