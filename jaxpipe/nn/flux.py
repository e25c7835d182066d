"""The FLUX.1 transformer (diffusers ``FluxTransformer2DModel``) in Flax NNX, loadable from a
diffusers ``transformer/`` folder.

Text tokens ``(B, T, joint_attention_dim)`` and packed image tokens ``(B, L, in_channels)`` are
embedded to ``inner = heads·head_dim``; ``num_layers`` double-stream blocks (separate weights per
stream, joint attention) then ``num_single_layers`` single-stream blocks over ``[text, image]``;
an adaLN output norm and projection give the image tokens' velocity. Conditioning ``temb`` sums
embeddings of the timestep, the guidance scale (FLUX.1-dev) and the pooled CLIP vector; positions
enter only through a 3-axis RoPE of ``txt_ids`` / ``img_ids``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn import hf
from jaxpipe.nn.attention import IMPLEMENTATIONS, check_implementation
from jaxpipe.nn.flux_blocks import (
    AdaLayerNorm,
    FluxSingleTransformerBlock,
    FluxTransformerBlock,
    KeyStream,
    Linear,
    TimeTextEmbed,
    modulate,
    rope,
)
from jaxpipe.nn.layers import check_sizes, compute_dtype
from jaxpipe.nn.stacked import apply, blocks, check_layout

__all__ = ["LOGICAL_AXES", "LORA_TARGETS", "RENAMES", "FluxCond", "FluxConfig", "FluxTransformer", "image_ids", "load"]

# The NNX tree mirrors diffusers' names exactly (dropout slots are None list entries), so no key needs renaming.
RENAMES: tuple[tuple[str, str], ...] = ()

# Logical sharding axes by NNX parameter path (re.fullmatch on the "/"-joined path); unmatched -> replicated.
LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r".*attn/(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)/kernel", ("embed", "heads")),
    (r".*attn/(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)/bias", ("heads",)),
    (r".*attn/(to_out/0|to_add_out)/kernel", ("heads", "embed")),
    (r".*(ff|ff_context)/net/0/proj/kernel", ("embed", "mlp")),
    (r".*(ff|ff_context)/net/0/proj/bias", ("mlp",)),
    (r".*(ff|ff_context)/net/2/kernel", ("mlp", "embed")),
    (r"single_transformer_blocks/\d+/proj_mlp/kernel", ("embed", "mlp")),
    (r"single_transformer_blocks/\d+/proj_mlp/bias", ("mlp",)),
    # its input is [attention (heads) | MLP (mlp)] concatenated; the MLP part dominates (4:1)
    (r"single_transformer_blocks/\d+/proj_out/kernel", ("mlp", "embed")),
    # adaLN modulations (dim -> k·dim) are as large as an FFN matrix in total: split their wide output
    (r".*(norm1|norm1_context|norm|norm_out)/linear/kernel", ("embed", "mlp")),
    (r".*(norm1|norm1_context|norm|norm_out)/linear/bias", ("mlp",)),
    (r"(x_embedder|context_embedder)/kernel", (None, "embed")),
    (r"time_text_embed/\w+/linear_1/kernel", (None, "embed")),
    (r"time_text_embed/\w+/linear_2/kernel", ("embed", None)),
    (r"proj_out/kernel", ("embed", None)),
)

# LoRA's default targets (lora.LoRAConfig.target_modules=None): diffusers' FLUX LoRA training default
# (train_dreambooth_lora_flux.py, peft-style suffixes): every attention projection of both block kinds and
# the double blocks' feed-forwards; the adaLN modulations and embedders stay as they are.
LORA_TARGETS: tuple[str, ...] = (
    "attn.to_k",
    "attn.to_q",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_k_proj",
    "attn.add_q_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
)


@dataclasses.dataclass(frozen=True)
class FluxConfig:
    """diffusers ``FluxTransformer2DModel`` config (same field names; defaults are FLUX.1-dev's) plus jaxpipe's
    own: the parameter / activation ``dtype`` (``"float32"`` or ``"bfloat16"``), ``scan_layers`` (each kind of
    block stored stacked and run by one ``lax.scan``: compiled once, not 19 + 38 times; ``False`` keeps the
    unrolled form), ``remat`` (``stacked.REMAT_POLICIES``: what each block keeps for the backward pass) and
    ``attention`` (``attention.IMPLEMENTATIONS``; the backend is checked when the network first runs)."""

    patch_size: int = 1
    in_channels: int = 64
    out_channels: int | None = None
    num_layers: int = 19
    num_single_layers: int = 38
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 4096
    pooled_projection_dim: int = 768
    guidance_embeds: bool = True
    axes_dims_rope: tuple[int, ...] = (16, 56, 56)
    dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    attention: str = "xla"

    def __post_init__(self):
        object.__setattr__(self, "axes_dims_rope", tuple(self.axes_dims_rope))
        check_sizes(
            self,
            (
                "patch_size",
                "in_channels",
                "attention_head_dim",
                "num_attention_heads",
                "joint_attention_dim",
                "pooled_projection_dim",
            ),
        )
        check_sizes(self, ("num_layers", "num_single_layers"), minimum=0)
        check_sizes(self, ("out_channels",), optional=True)
        check_layout(self)
        validate.rule(
            self.attention in IMPLEMENTATIONS,
            f"FluxConfig.attention must be one of {IMPLEMENTATIONS} (got {self.attention!r})",
        )
        validate.rule(
            isinstance(self.guidance_embeds, bool),
            f"FluxConfig.guidance_embeds must be a bool (got {self.guidance_embeds!r})",
        )
        axes = self.axes_dims_rope
        validate.rule(
            bool(axes) and all(isinstance(d, int) and d >= 2 and d % 2 == 0 for d in axes),
            f"FluxConfig.axes_dims_rope must be positive even ints, one per position axis (got {axes!r})",
        )
        validate.rule(
            sum(axes) == self.attention_head_dim,
            f"FluxConfig.axes_dims_rope {axes} sums to {sum(axes)}, but RoPE rotates a whole head: "
            f"it must equal attention_head_dim={self.attention_head_dim}",
        )
        compute_dtype(self.dtype)

    @classmethod
    def dev(cls, **overrides) -> FluxConfig:
        """FLUX.1-dev (guidance-distilled): 19 double + 38 single blocks, width 3072, about 11.9 B parameters."""
        return cls(**overrides)

    @classmethod
    def schnell(cls, **overrides) -> FluxConfig:
        """FLUX.1-schnell: FLUX.1-dev without the guidance embedder."""
        return cls(**{"guidance_embeds": False, **overrides})

    @classmethod
    def tiny(cls, **overrides) -> FluxConfig:
        """The smallest config with every code path: one block of each kind, 2 heads of 16, guidance on."""
        sizes = dict(
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 6, 6),
        )
        return cls(**{**sizes, **overrides})

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FluxConfig:
        """From a diffusers ``config.json`` dict: ``_``-prefixed keys (``_class_name``, ...) are ignored,
        lists become tuples, an unknown key is a ``ValueError`` naming it."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if not k.startswith("_")}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise ValueError(f"FluxConfig: unknown config key(s) {unknown}; known: {sorted(fields)}")
        return cls(**kwargs)

    @property
    def inner_dim(self) -> int:
        """The model width, ``num_attention_heads · attention_head_dim``."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def output_channels(self) -> int:
        """Channels per output token: ``patch_size² · (out_channels or in_channels)``."""
        return self.patch_size**2 * (self.out_channels or self.in_channels)


class FluxCond(NamedTuple):
    """What ``FluxTransformer.velocity`` conditions on: T5 ``text`` ``(B, T, joint_attention_dim)``, the pooled
    CLIP vector ``pooled`` ``(B, pooled_projection_dim)``, and the distilled ``guidance`` scale ``(B,)``
    (e.g. 3.5; FLUX.1-dev needs it, schnell ignores it)."""

    text: jax.Array
    pooled: jax.Array
    guidance: jax.Array | None = None


def image_ids(rows: int, cols: int) -> np.ndarray:
    """Position ids of a packed token grid, row-major: ``[0, row, col]``.

    As diffusers' ``FluxPipeline._prepare_latent_image_ids``.

    Args:
      rows: the grid's token rows.
      cols: its token columns.

    Returns:
      ``(rows·cols, 3)`` float32.
    """
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return np.stack([np.zeros_like(r), r, c], axis=-1).reshape(rows * cols, 3).astype(np.float32)


class FluxTransformer(nnx.Module):
    """FLUX.1's velocity network (``FluxTransformer2DModel``); parameters only, named like diffusers'."""

    LORA_TARGETS = LORA_TARGETS

    def __init__(self, config: FluxConfig, *, rngs: nnx.Rngs):
        self.config = config
        dtype = compute_dtype(config.dtype)
        dim, heads, head_dim = config.inner_dim, config.num_attention_heads, config.attention_head_dim
        keys = KeyStream(rngs.params())
        self.time_text_embed = TimeTextEmbed(dim, config.pooled_projection_dim, config.guidance_embeds, dtype, keys)
        self.context_embedder = Linear(config.joint_attention_dim, dim, dtype, keys)
        self.x_embedder = Linear(config.in_channels, dim, dtype, keys)
        self.transformer_blocks = blocks(
            lambda: FluxTransformerBlock(dim, heads, head_dim, dtype, keys, config.attention),
            config.num_layers,
            scan=config.scan_layers,
        )
        self.single_transformer_blocks = blocks(
            lambda: FluxSingleTransformerBlock(dim, heads, head_dim, dtype, keys, config.attention),
            config.num_single_layers,
            scan=config.scan_layers,
        )
        self.norm_out = AdaLayerNorm(dim, 2, dtype, keys)
        self.proj_out = Linear(dim, config.output_channels, dtype, keys)

    def __call__(
        self,
        hidden_states: jax.Array,
        encoder_hidden_states: jax.Array,
        pooled_projections: jax.Array,
        timestep: jax.Array,
        img_ids: jax.Array | np.ndarray,
        txt_ids: jax.Array | np.ndarray,
        guidance: jax.Array | None = None,
    ) -> jax.Array:
        """diffusers' forward: image tokens ``(B, L, in_channels)``, text ``(B, T, joint_attention_dim)``,
        ``pooled_projections`` ``(B, P)``, ``timestep`` ``(B,)`` in sigma units (×1000 inside), ``img_ids``
        ``(L, 3)``, ``txt_ids`` ``(T, 3)``, ``guidance`` ``(B,)`` scale (×1000 inside) -> ``(B, L, output_channels)`` float32."""
        cfg = self.config
        dtype = compute_dtype(cfg.dtype)
        check_implementation(cfg.attention)
        chex.assert_rank([hidden_states, encoder_hidden_states, pooled_projections], [3, 3, 2])
        b, n_img, t = hidden_states.shape[0], hidden_states.shape[1], encoder_hidden_states.shape[1]
        naxes = len(cfg.axes_dims_rope)
        for name, value, shape in (
            ("hidden_states", hidden_states, (b, n_img, cfg.in_channels)),
            ("encoder_hidden_states", encoder_hidden_states, (b, t, cfg.joint_attention_dim)),
            ("pooled_projections", pooled_projections, (b, cfg.pooled_projection_dim)),
            ("timestep", timestep, (b,)),
            ("img_ids", img_ids, (n_img, naxes)),
            ("txt_ids", txt_ids, (t, naxes)),
        ):
            if tuple(np.shape(value)) != shape:
                raise ValueError(f"FluxTransformer: {name} must have shape {shape}; got {tuple(np.shape(value))}")
        if cfg.guidance_embeds != (guidance is not None):
            need = (
                "needs a guidance scale (B,)" if cfg.guidance_embeds else "has no guidance embedder: pass guidance=None"
            )
            raise ValueError(f"FluxTransformer: this model (guidance_embeds={cfg.guidance_embeds}) {need}")
        if guidance is not None:
            chex.assert_shape(guidance, (b,))
            guidance = jnp.asarray(guidance, jnp.float32) * 1000.0

        x = self.x_embedder(hidden_states.astype(dtype))
        temb = self.time_text_embed(jnp.asarray(timestep, jnp.float32) * 1000.0, guidance, pooled_projections)
        context = self.context_embedder(encoder_hidden_states.astype(dtype))
        if isinstance(txt_ids, np.ndarray) and isinstance(img_ids, np.ndarray):
            ids = np.concatenate([txt_ids, img_ids], axis=0)
        else:
            ids = jnp.concatenate([jnp.asarray(txt_ids), jnp.asarray(img_ids)], axis=0)
        cos, sin = rope(ids, cfg.axes_dims_rope)

        context, x = apply(
            self.transformer_blocks, lambda block, c: block(c[1], c[0], temb, cos, sin), (context, x), remat=cfg.remat
        )
        h = jnp.concatenate([context, x], axis=1)
        h = apply(self.single_transformer_blocks, lambda block, h: block(h, temb, cos, sin), h, remat=cfg.remat)
        scale, shift = self.norm_out(temb)
        out = self.proj_out(modulate(h[:, t:], shift, scale))
        return out.astype(jnp.float32)

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: FluxCond) -> jax.Array:
        """The denoiser protocol: latents ``x`` ``(B, h, w, in_channels/4)`` channels-last, noise level ``sigma``
        (scalar or ``(B,)``) -> velocity ``(B, h, w, out_channels/4)`` float32. Packs 2×2 patches and builds
        positions exactly like ``FluxPipeline`` (token channel ``c·4 + 2·dy + dx``, ids ``[0, row, col]``, zero text ids)."""
        cfg = self.config
        chex.assert_rank(x, 4)
        b, hh, ww, c = x.shape
        if cfg.patch_size != 1 or cfg.in_channels % 4 or cfg.output_channels % 4:
            raise ValueError(
                f"velocity packs 2x2 latent patches: needs patch_size=1 and in/out channels divisible by 4 (config {cfg})"
            )
        if c * 4 != cfg.in_channels or hh % 2 or ww % 2:
            raise ValueError(
                f"velocity: x must be (B, h, w, {cfg.in_channels // 4}) with even h, w; got {tuple(x.shape)}"
            )
        guidance = None
        if cfg.guidance_embeds:
            if cond.guidance is None:
                raise ValueError("velocity: this FLUX model is guidance-distilled: FluxCond.guidance (B,) is required")
            guidance = jnp.broadcast_to(jnp.asarray(cond.guidance, jnp.float32), (b,))
        tokens = rearrange(x, "b (h p) (w q) c -> b (h w) (c p q)", p=2, q=2)
        txt_ids = np.zeros((cond.text.shape[1], 3), np.float32)
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (b,))
        out = self(tokens, cond.text, cond.pooled, sigma, image_ids(hh // 2, ww // 2), txt_ids, guidance)
        return rearrange(out, "b (h w) (c p q) -> b (h p) (w q) c", h=hh // 2, w=ww // 2, p=2, q=2)

    def param_count(self) -> int:
        """Number of parameters (works on an abstract ``nnx.eval_shape`` module too)."""
        return sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(self, nnx.Param)))


def load(
    folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none", attention: str = "xla"
) -> FluxTransformer:
    """A ``FluxTransformer`` from a diffusers ``transformer/`` folder (``config.json`` + safetensors, sharded
    or not).

    Args:
      folder: the ``transformer/`` folder.
      dtype: the parameter and compute dtype's name (parameters are cast to it).
      scan_layers: store each kind of block stacked (diffusers' per-layer keys are stacked on load).
      remat: the blocks' rematerialisation policy (``stacked.REMAT_POLICIES``).
      attention: the attention implementation (``attention.IMPLEMENTATIONS``).

    Returns:
      The loaded ``FluxTransformer``.

    Raises:
      hf.KeyMappingError: naming missing, unexpected or mis-shaped keys.
    """

    def build(config: dict[str, Any]) -> FluxTransformer:
        fields = {**config, "dtype": dtype, "scan_layers": scan_layers, "remat": remat, "attention": attention}
        return FluxTransformer(FluxConfig.from_json(fields), rngs=nnx.Rngs(0))

    return hf.load_module(folder, build, renames=RENAMES)
