"""T5 / UMT5 text encoders (transformers ``T5EncoderModel`` / ``UMT5EncoderModel``) in Flax NNX.

FLUX's ``text_encoder_2`` is google/t5-v1_1-xxl's encoder, Wan's ``text_encoder`` is umt5-xxl's.
Pre-norm blocks: ``h += SelfAttention(rms(h))``, ``h += DenseReluDense(rms(h))``, then a final RMS
norm. Attention has no ``1/sqrt(d)`` scaling; instead a learned relative position bias
``(heads, T, T)`` is added to the scores — computed once from one table and shared by every block
(T5), or computed by every block from its own table (UMT5). Attribute names mirror transformers
(``shared``, ``encoder.block.0.layer.0.SelfAttention.q``, ``encoder.block.0.layer.1.DenseReluDense.wi_0``,
``encoder.final_layer_norm``), so ``hf.torch_key`` maps every parameter; the one exception is T5's
shared table, which transformers keeps in block 0 and jaxpipe in the stack (``encoder.relative_attention_bias``,
renamed by ``RENAMES``) so that every block has one structure and the blocks can be stored stacked
(``nn.stacked``: ``scan_layers``) and run by one ``lax.scan``.

Numerics follow transformers: RMS norms and softmax in float32; the residual stream is float32
(transformers keeps ``wo`` in float32 — ``_keep_in_fp32_modules`` — which promotes it there too);
projections run in the configured ``dtype``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn import hf
from jaxpipe.nn.layers import check_sizes, compute_dtype
from jaxpipe.nn.stacked import apply, blocks, check_layout

__all__ = [
    "ACTIVATIONS",
    "LOGICAL_AXES",
    "RENAMES",
    "T5Encoder",
    "T5EncoderConfig",
    "load",
    "param_count",
    "position_bias",
    "relative_position_bucket",
]

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    # transformers' ACT2FN names; "gelu_new" / "gelu_pytorch_tanh" are the tanh approximation
    "relu": jax.nn.relu,
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_new": partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
}

LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"shared/embedding", ("vocab", "embed")),
    (r".*/SelfAttention/(q|k|v)/kernel", ("embed", "heads")),
    (r".*/SelfAttention/o/kernel", ("heads", "embed")),
    (r".*relative_attention_bias/embedding", (None, None)),
    (r".*/DenseReluDense/(wi|wi_0|wi_1)/kernel", ("embed", "mlp")),
    (r".*/DenseReluDense/wo/kernel", ("mlp", "embed")),
)

# T5's shared position-bias table lives in the stack, transformers keeps it in block 0's attention
RENAMES: tuple[tuple[str, str], ...] = (
    (
        r"^encoder\.relative_attention_bias\.weight$",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
    ),
)

# transformers' T5Config / UMT5Config defaults, for keys a config.json leaves out
_JSON_DEFAULTS = {
    "t5": {
        "vocab_size": 32128,
        "d_model": 512,
        "d_kv": 64,
        "d_ff": 2048,
        "num_layers": 6,
        "num_heads": 8,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "feed_forward_proj": "relu",
        "layer_norm_epsilon": 1e-6,
    },
    "umt5": {
        "vocab_size": 250112,
        "d_model": 512,
        "d_kv": 64,
        "d_ff": 1024,
        "num_layers": 8,
        "num_heads": 6,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "feed_forward_proj": "gated-gelu",
        "layer_norm_epsilon": 1e-6,
    },
}


@dataclasses.dataclass(frozen=True)
class T5EncoderConfig:
    """Sizes of a T5 (or, with ``umt5=True``, UMT5) encoder; names as in transformers' ``T5Config``.

    ``feed_forward_proj`` is ``"<act>"`` (``wi -> act -> wo``) or ``"gated-<act>"``
    (``act(wi_0 x) * wi_1 x -> wo``; ``"gated-gelu"`` means the tanh-approximate ``gelu_new``).
    jaxpipe's own: the parameter / compute ``dtype``, ``scan_layers`` (the blocks stored stacked and run
    by one ``lax.scan``; ``False`` keeps them unrolled) and ``remat`` (``stacked.REMAT_POLICIES``).
    """

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    feed_forward_proj: str = "gated-gelu"
    layer_norm_epsilon: float = 1e-6
    umt5: bool = False
    dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"

    def __post_init__(self):
        check_sizes(self, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"))
        buckets, distance = self.relative_attention_num_buckets, self.relative_attention_max_distance
        validate.rule(
            isinstance(buckets, int) and buckets >= 4,
            f"relative_attention_num_buckets must be an int >= 4 (got {buckets!r})",
        )
        validate.rule(
            isinstance(distance, int) and distance > buckets // 4,
            f"relative_attention_max_distance ({distance!r}) must be an int above the exact range "
            f"relative_attention_num_buckets // 4 = {buckets // 4}",
        )
        parts = self.feed_forward_proj.split("-")
        validate.rule(
            len(parts) <= 2 and (len(parts) == 1 or parts[0] == "gated"),
            f"feed_forward_proj must be '<act>' or 'gated-<act>' (got {self.feed_forward_proj!r})",
        )
        validate.rule(
            self.act in ACTIVATIONS,
            f"feed_forward_proj {self.feed_forward_proj!r}: activation {parts[-1]!r} is not one of {sorted(ACTIVATIONS)}",
        )
        validate.positive(self, "layer_norm_epsilon")
        check_layout(self)
        compute_dtype(self.dtype)

    @property
    def is_gated(self) -> bool:
        """Whether the feed-forward is gated (``feed_forward_proj`` ``"gated-..."``, T5 v1.1 and UMT5)."""
        return self.feed_forward_proj.startswith("gated-")

    @property
    def act(self) -> str:
        """The activation's transformers name (``gated-gelu`` uses ``gelu_new``, as ``T5Config`` does)."""
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]

    @property
    def inner_dim(self) -> int:
        """The attention width, ``num_heads · d_kv``."""
        return self.num_heads * self.d_kv

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, dtype: str = "float32") -> T5EncoderConfig:
        """The encoder described by a transformers ``config.json`` (``model_type`` ``"t5"`` or
        ``"umt5"``). Only the fields above are read (transformers' defaults where absent); the
        other keys — decoder sizes (``num_decoder_layers``), dropout, token ids, generation and
        tying settings — do not change the encoder's computation and are deliberately ignored."""
        model_type = d.get("model_type")
        if model_type not in _JSON_DEFAULTS:
            raise ValueError(f"config.json model_type must be 't5' or 'umt5' for a T5 encoder (got {model_type!r})")
        if d.get("is_decoder", False):
            raise ValueError("config.json describes a decoder (is_decoder=true); a T5 encoder needs an encoder config")
        values = {key: d.get(key, default) for key, default in _JSON_DEFAULTS[model_type].items()}
        return cls(**values, umt5=model_type == "umt5", dtype=dtype)

    @classmethod
    def tiny(cls, **overrides) -> T5EncoderConfig:
        """One layer, width 32: for tests and the tiny real-family cards."""
        return cls(
            **{
                "vocab_size": 100,
                "d_model": 32,
                "d_kv": 8,
                "d_ff": 48,
                "num_layers": 1,
                "num_heads": 2,
                "relative_attention_num_buckets": 8,
                "relative_attention_max_distance": 16,
                **overrides,
            }
        )

    @classmethod
    def t5_xxl(cls, **overrides) -> T5EncoderConfig:
        """google/t5-v1_1-xxl's encoder: FLUX.1's ``text_encoder_2`` (about 4.76 B parameters)."""
        return cls(
            **{
                "vocab_size": 32128,
                "d_model": 4096,
                "d_kv": 64,
                "d_ff": 10240,
                "num_layers": 24,
                "num_heads": 64,
                "feed_forward_proj": "gated-gelu",
                **overrides,
            }
        )

    @classmethod
    def umt5_xxl(cls, **overrides) -> T5EncoderConfig:
        """umt5-xxl's encoder: Wan's ``text_encoder`` (about 5.68 B parameters)."""
        return cls.t5_xxl(**{"vocab_size": 256384, "umt5": True, **overrides})


def relative_position_bucket(
    relative_position: np.ndarray, *, num_buckets: int, max_distance: int, bidirectional: bool = True
) -> np.ndarray:
    """T5's bucket ``[0, num_buckets)`` of each ``key - query`` offset (same shape, int32).

    Half the buckets (per direction when bidirectional) are exact offsets, the rest grow
    logarithmically up to ``max_distance``. Computed in NumPy float32 on static offsets, the way
    transformers computes it in torch float32, so the buckets at the log-bin edges agree.

    Args:
      relative_position: ``key - query`` offsets, any shape.
      num_buckets: the number of buckets.
      max_distance: the offset where the log-spaced buckets end (farther offsets share the last).
      bidirectional: separate buckets for positive and negative offsets (the encoder's case).

    Returns:
      The buckets, shaped like ``relative_position``, int32.
    """
    rel = np.asarray(relative_position, np.int64)
    buckets = np.zeros(rel.shape, np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).astype(np.int64) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log(rel.astype(np.float32) / np.float32(max_exact)) / np.float32(
            math.log(max_distance / max_exact)
        )
        large = max_exact + np.nan_to_num(log_ratio * np.float32(num_buckets - max_exact), neginf=0.0).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return (buckets + np.where(rel < max_exact, rel, large)).astype(np.int32)


def position_bias(table: jax.Array, length: int, *, num_buckets: int, max_distance: int) -> jax.Array:
    """The ``(heads, length, length)`` float32 bias of query ``i`` attending to key ``j``.

    Args:
      table: ``(num_buckets, heads)`` the learned bias per offset bucket.
      length: the sequence length.
      num_buckets: the number of buckets.
      max_distance: where the log-spaced buckets end.

    Returns:
      The bias, float32.
    """
    offsets = np.arange(length)[None, :] - np.arange(length)[:, None]
    buckets = relative_position_bucket(offsets, num_buckets=num_buckets, max_distance=max_distance)
    return jnp.transpose(jnp.take(table, jnp.asarray(buckets), axis=0), (2, 0, 1)).astype(jnp.float32)


def _linear(din: int, dout: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(din, dout, use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs)


def _bias_table(cfg: T5EncoderConfig, rngs: nnx.Rngs) -> nnx.Embed:
    dtype = compute_dtype(cfg.dtype)
    return nnx.Embed(cfg.relative_attention_num_buckets, cfg.num_heads, dtype=dtype, param_dtype=dtype, rngs=rngs)


class T5LayerNorm(nnx.Module):
    """RMS norm without mean subtraction or bias, in float32: ``weight * x / rms(x)`` in the param dtype."""

    def __init__(self, dim: int, eps: float, dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + self.eps)
        return self.scale[...] * h.astype(self.scale[...].dtype)


class T5Attention(nnx.Module):
    """Unscaled multi-head self-attention with an additive position bias (its own, from its own table, if it has one)."""

    def __init__(self, cfg: T5EncoderConfig, *, has_relative_attention_bias: bool, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.heads, self.d_kv = cfg.num_heads, cfg.d_kv
        self.num_buckets, self.max_distance = cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        self.q = _linear(cfg.d_model, cfg.inner_dim, dtype, rngs)
        self.k = _linear(cfg.d_model, cfg.inner_dim, dtype, rngs)
        self.v = _linear(cfg.d_model, cfg.inner_dim, dtype, rngs)
        self.o = _linear(cfg.inner_dim, cfg.d_model, dtype, rngs)
        self.relative_attention_bias = _bias_table(cfg, rngs) if has_relative_attention_bias else None

    def __call__(self, x: jax.Array, bias: jax.Array | None, key_mask: jax.Array | None) -> jax.Array:
        b, t, _ = x.shape
        if self.relative_attention_bias is not None:
            bias = position_bias(
                self.relative_attention_bias.embedding[...],
                t,
                num_buckets=self.num_buckets,
                max_distance=self.max_distance,
            )
        q, k, v = (proj(x).reshape(b, t, self.heads, self.d_kv) for proj in (self.q, self.k, self.v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) + bias
        if key_mask is not None:
            scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return self.o(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, self.heads * self.d_kv))


class T5LayerSelfAttention(nnx.Module):
    def __init__(self, cfg: T5EncoderConfig, *, has_relative_attention_bias: bool, rngs: nnx.Rngs):
        self.SelfAttention = T5Attention(cfg, has_relative_attention_bias=has_relative_attention_bias, rngs=rngs)
        self.layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon, compute_dtype(cfg.dtype))

    def __call__(self, h: jax.Array, bias: jax.Array, key_mask: jax.Array | None) -> jax.Array:
        return h + self.SelfAttention(self.layer_norm(h), bias, key_mask).astype(jnp.float32)


class T5DenseActDense(nnx.Module):
    """``wo(act(wi x))``; ``wo`` stays float32 like transformers' ``_keep_in_fp32_modules``."""

    def __init__(self, cfg: T5EncoderConfig, rngs: nnx.Rngs):
        self.act = cfg.act
        self.wi = _linear(cfg.d_model, cfg.d_ff, compute_dtype(cfg.dtype), rngs)
        self.wo = _linear(cfg.d_ff, cfg.d_model, jnp.float32, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.wo(ACTIVATIONS[self.act](self.wi(x)).astype(jnp.float32))


class T5DenseGatedActDense(nnx.Module):
    """``wo(act(wi_0 x) * wi_1 x)``; ``wo`` stays float32 like transformers' ``_keep_in_fp32_modules``."""

    def __init__(self, cfg: T5EncoderConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.act = cfg.act
        self.wi_0 = _linear(cfg.d_model, cfg.d_ff, dtype, rngs)
        self.wi_1 = _linear(cfg.d_model, cfg.d_ff, dtype, rngs)
        self.wo = _linear(cfg.d_ff, cfg.d_model, jnp.float32, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.wo((ACTIVATIONS[self.act](self.wi_0(x)) * self.wi_1(x)).astype(jnp.float32))


class T5LayerFF(nnx.Module):
    def __init__(self, cfg: T5EncoderConfig, rngs: nnx.Rngs):
        self.DenseReluDense = T5DenseGatedActDense(cfg, rngs) if cfg.is_gated else T5DenseActDense(cfg, rngs)
        self.layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon, compute_dtype(cfg.dtype))

    def __call__(self, h: jax.Array) -> jax.Array:
        return h + self.DenseReluDense(self.layer_norm(h))


class T5Block(nnx.Module):
    def __init__(self, cfg: T5EncoderConfig, *, has_relative_attention_bias: bool, rngs: nnx.Rngs):
        self.layer = nnx.List(
            [
                T5LayerSelfAttention(cfg, has_relative_attention_bias=has_relative_attention_bias, rngs=rngs),
                T5LayerFF(cfg, rngs),
            ]
        )

    def __call__(self, h: jax.Array, bias: jax.Array, key_mask: jax.Array | None) -> jax.Array:
        return self.layer[1](self.layer[0](h, bias, key_mask))


class T5Stack(nnx.Module):
    """The encoder blocks and final norm (the token table is ``T5Encoder.shared``: transformers ties them),
    and T5's position-bias table, shared by every block (a UMT5 block has its own)."""

    def __init__(self, cfg: T5EncoderConfig, rngs: nnx.Rngs):
        self.remat = cfg.remat
        self.num_buckets, self.max_distance = cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        self.relative_attention_bias = None if cfg.umt5 else _bias_table(cfg, rngs)
        self.block = blocks(
            lambda: T5Block(cfg, has_relative_attention_bias=cfg.umt5, rngs=rngs), cfg.num_layers, scan=cfg.scan_layers
        )
        self.final_layer_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon, compute_dtype(cfg.dtype))

    def __call__(self, h: jax.Array, key_mask: jax.Array | None) -> jax.Array:
        bias = None
        if self.relative_attention_bias is not None:
            bias = position_bias(
                self.relative_attention_bias.embedding[...],
                h.shape[1],
                num_buckets=self.num_buckets,
                max_distance=self.max_distance,
            )
        h = apply(self.block, lambda block, h: block(h, bias, key_mask), h, remat=self.remat)
        return self.final_layer_norm(h)


class T5Encoder(nnx.Module):
    """T5 / UMT5 encoder: token ids ``(B, T)`` -> ``last_hidden_state`` ``(B, T, d_model)`` float32."""

    def __init__(self, config: T5EncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        dtype = compute_dtype(config.dtype)
        self.shared = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.encoder = T5Stack(config, rngs)

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """``input_ids`` ``(B, T)`` int, each below ``vocab_size`` (not checked under jit);
        ``attention_mask`` ``(B, T)`` (nonzero = a real token, zero = padding no token attends
        to) or None: every token attends to every token (how FLUX's pipeline calls its T5)."""
        chex.assert_rank(input_ids, 2)
        key_mask = None
        if attention_mask is not None:
            chex.assert_shape(attention_mask, input_ids.shape)
            key_mask = jnp.asarray(attention_mask) != 0
        h = self.shared(jnp.asarray(input_ids, jnp.int32)).astype(jnp.float32)
        return self.encoder(h, key_mask).astype(jnp.float32)


def _encoder_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A T5 checkpoint's tensors as ``T5Encoder`` keys: the tied token table under ``shared.weight``
    (whether saved as ``shared``, ``encoder.embed_tokens`` or both), a full seq2seq checkpoint's
    decoder and LM head dropped (as ``T5EncoderModel.from_pretrained`` does)."""
    out = {k: v for k, v in tensors.items() if not k.startswith(("decoder.", "lm_head."))}
    tied = out.pop("encoder.embed_tokens.weight", None)
    if "shared.weight" not in out and tied is not None:
        out["shared.weight"] = tied
    return out


def load(folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none") -> T5Encoder:
    """The T5 / UMT5 encoder of a transformers folder (``config.json`` + safetensors).

    Args:
      folder: the model folder.
      dtype: the parameter and compute dtype's name.
      scan_layers: store the blocks stacked (transformers' per-layer keys are stacked on load).
      remat: the blocks' rematerialisation policy (``stacked.REMAT_POLICIES``).

    Returns:
      The loaded ``T5Encoder``.

    Raises:
      ValueError: if ``config.json`` is not a T5 / UMT5 encoder.
      hf.KeyMappingError: naming missing, unexpected or mis-shaped keys.
    """

    def build(config: dict[str, Any]) -> T5Encoder:
        sizes = dataclasses.replace(
            T5EncoderConfig.from_json(config, dtype=dtype), scan_layers=scan_layers, remat=remat
        )
        return T5Encoder(sizes, rngs=nnx.Rngs(0))

    return hf.load_module(folder, build, prepare=_encoder_tensors, renames=RENAMES)


def param_count(config: T5EncoderConfig) -> int:
    """The number of parameters of ``T5Encoder(config)`` (counted abstractly: nothing is allocated).

    Args:
      config: the encoder's sizes.

    Returns:
      The parameter count.
    """
    return hf.count_params(nnx.eval_shape(lambda: T5Encoder(config, rngs=nnx.Rngs(0))))
