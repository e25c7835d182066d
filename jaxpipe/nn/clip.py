"""The CLIP text tower (transformers ``CLIPTextModel``) in Flax NNX: FLUX.1's ``text_encoder``.

Token + learned position embeddings -> pre-LayerNorm causal transformer layers (``quick_gelu``
MLP) -> final LayerNorm. The pooled output is the final hidden state at each row's end-of-text
token. Attribute names mirror transformers (``embeddings.token_embedding``,
``encoder.layers.0.self_attn.q_proj``, ``final_layer_norm``); ``load`` also reads the hub layout,
whose keys carry a ``text_model.`` prefix. LayerNorms and softmax run in float32 and so does the
residual stream; projections run in the configured ``dtype``. The layers are stored stacked and run by
one ``lax.scan`` (``nn.stacked``) unless ``scan_layers=False``; checkpoints keep per-layer keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn import hf
from jaxpipe.nn.layers import check_divisible, check_sizes, compute_dtype
from jaxpipe.nn.stacked import apply, blocks, check_layout
from jaxpipe.nn.t5 import ACTIVATIONS

__all__ = [
    "LOGICAL_AXES",
    "CLIPTextEncoder",
    "CLIPTextEncoderConfig",
    "builder",
    "check_tower",
    "load",
    "param_count",
    "pool_eos",
]

LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embeddings/token_embedding/embedding", ("vocab", "embed")),
    (r"embeddings/position_embedding/embedding", (None, "embed")),
    (r".*/self_attn/(q_proj|k_proj|v_proj)/kernel", ("embed", "heads")),
    (r".*/self_attn/out_proj/kernel", ("heads", "embed")),
    (r".*/mlp/fc1/kernel", ("embed", "mlp")),
    (r".*/mlp/fc2/kernel", ("mlp", "embed")),
)

# the transformers default CLIPTextConfig, for keys a config.json leaves out
_JSON_DEFAULTS = {
    "vocab_size": 49408,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 8,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "eos_token_id": 49407,
}


@dataclasses.dataclass(frozen=True)
class CLIPTextEncoderConfig:
    """Sizes of a CLIP text tower; names as in transformers' ``CLIPTextConfig``.

    ``eos_token_id`` picks the pooling rule exactly as transformers does: the legacy value 2
    (openai's configs, FLUX's) pools at the largest token id of each row, any other value at the
    first occurrence of that id. jaxpipe's own: the parameter / compute ``dtype``, ``scan_layers`` (the
    layers stored stacked and run by one ``lax.scan``; ``False`` keeps them unrolled) and ``remat``
    (``stacked.REMAT_POLICIES``).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 49407
    dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"

    def __post_init__(self):
        check_sizes(
            self,
            (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "max_position_embeddings",
            ),
        )
        check_tower(self)
        validate.instances(self, int, "eos_token_id")

    @property
    def head_dim(self) -> int:
        """The width of one attention head, ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, dtype: str = "float32") -> CLIPTextEncoderConfig:
        """The text tower a transformers ``CLIPTextModel`` ``config.json`` describes (``model_type``
        ``"clip_text_model"``); projection and vision settings do not matter here."""
        if d.get("model_type") != "clip_text_model":
            hint = " (a full CLIPModel: load its text tower's folder instead)" if d.get("model_type") == "clip" else ""
            raise ValueError(
                f"config.json model_type must be 'clip_text_model' for a CLIP text encoder (got {d.get('model_type')!r}){hint}"
            )
        return cls(**{key: d.get(key, default) for key, default in _JSON_DEFAULTS.items()}, dtype=dtype)

    @classmethod
    def tiny(cls, **overrides) -> CLIPTextEncoderConfig:
        """One layer, width 32, 16 positions: for tests and the tiny real-family cards."""
        return cls(
            **{
                "vocab_size": 99,
                "hidden_size": 32,
                "intermediate_size": 37,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "max_position_embeddings": 16,
                "eos_token_id": 2,
                **overrides,
            }
        )

    @classmethod
    def vit_l14(cls, **overrides) -> CLIPTextEncoderConfig:
        """openai/clip-vit-large-patch14's text tower: FLUX.1's ``text_encoder`` (about 123 M parameters);
        its config keeps the legacy ``eos_token_id`` 2 (pool at the largest id, the end-of-text token)."""
        return cls(
            **{
                "vocab_size": 49408,
                "hidden_size": 768,
                "intermediate_size": 3072,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "max_position_embeddings": 77,
                "eos_token_id": 2,
                **overrides,
            }
        )


def check_tower(config) -> None:
    """Checks what CLIP's text and vision tower configs share: the heads divide the width, a known
    ``hidden_act``, a positive ``layer_norm_eps``, the layer layout and the dtype (sizes checked before).

    Args:
      config: a ``CLIPTextEncoderConfig`` or ``clip_vision.CLIPVisionConfig``.

    Raises:
      ValueError: naming the first field that fails.
    """
    check_divisible(config, "hidden_size", "num_attention_heads")
    validate.rule(
        config.hidden_act in ACTIVATIONS, f"hidden_act must be one of {sorted(ACTIVATIONS)} (got {config.hidden_act!r})"
    )
    validate.positive(config, "layer_norm_eps")
    check_layout(config)
    compute_dtype(config.dtype)


def builder(from_json: Callable, module: type, dtype: str, scan_layers: bool, remat: str) -> Callable:
    """What ``hf.load_module`` builds a CLIP tower with: ``module`` of the sizes ``from_json`` reads from a
    ``config.json``, in ``dtype`` and the given layer layout.

    Args:
      from_json: a config class's ``from_json``.
      module: the network class built from that config.
      dtype: the parameter and compute dtype's name.
      scan_layers: store the layers stacked.
      remat: the layers' rematerialisation policy.

    Returns:
      ``config.json`` dict -> the (randomly initialised) network.
    """

    def build(config: dict[str, Any]):
        sizes = dataclasses.replace(from_json(config, dtype=dtype), scan_layers=scan_layers, remat=remat)
        return module(sizes, rngs=nnx.Rngs(0))

    return build


def pool_eos(hidden: jax.Array, input_ids: jax.Array, eos_token_id: int) -> jax.Array:
    """Each row of ``hidden`` at its end-of-text position (CLIP's pooled output).

    The position is the largest id when ``eos_token_id == 2`` (transformers' legacy rule), else the
    first ``eos_token_id``.

    Args:
      hidden: ``(B, T, D)`` hidden states.
      input_ids: ``(B, T)`` the token ids.
      eos_token_id: the config's end-of-text id.

    Returns:
      ``(B, D)``.
    """
    ids = jnp.asarray(input_ids, jnp.int32)
    position = jnp.argmax(ids, axis=-1) if eos_token_id == 2 else jnp.argmax(ids == eos_token_id, axis=-1)
    return jnp.take_along_axis(hidden, position[:, None, None], axis=1)[:, 0]


def _linear(din: int, dout: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(din, dout, dtype=dtype, param_dtype=dtype, rngs=rngs)


def _layer_norm(dim: int, eps: float, dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # float32 statistics and output whatever the parameter dtype, two-pass variance like torch
    return nnx.LayerNorm(dim, epsilon=eps, dtype=jnp.float32, param_dtype=dtype, use_fast_variance=False, rngs=rngs)


class CLIPTextEmbeddings(nnx.Module):
    def __init__(self, cfg: CLIPTextEncoderConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.token_embedding = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.position_embedding = nnx.Embed(
            cfg.max_position_embeddings, cfg.hidden_size, dtype=dtype, param_dtype=dtype, rngs=rngs
        )

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        positions = jnp.arange(input_ids.shape[1])
        return self.token_embedding(input_ids).astype(jnp.float32) + self.position_embedding(positions)[None].astype(
            jnp.float32
        )


class CLIPAttention(nnx.Module):
    """Multi-head self-attention scaled by ``head_dim**-0.5``, with biases."""

    def __init__(self, cfg: CLIPTextEncoderConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.k_proj = _linear(cfg.hidden_size, cfg.hidden_size, dtype, rngs)
        self.v_proj = _linear(cfg.hidden_size, cfg.hidden_size, dtype, rngs)
        self.q_proj = _linear(cfg.hidden_size, cfg.hidden_size, dtype, rngs)
        self.out_proj = _linear(cfg.hidden_size, cfg.hidden_size, dtype, rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        b, t, d = x.shape
        # heads-major before the two batched matmuls: XLA:CPU runs them ~1.4x faster than the token-major einsums
        q, k, v = (
            proj(x).reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * (self.head_dim**-0.5)
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return self.out_proj(jnp.einsum("bhqk,bhkd->bhqd", probs, v).transpose(0, 2, 1, 3).reshape(b, t, d))


class CLIPMLP(nnx.Module):
    def __init__(self, cfg: CLIPTextEncoderConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.act = cfg.hidden_act
        self.fc1 = _linear(cfg.hidden_size, cfg.intermediate_size, dtype, rngs)
        self.fc2 = _linear(cfg.intermediate_size, cfg.hidden_size, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(ACTIVATIONS[self.act](self.fc1(x)))


class CLIPEncoderLayer(nnx.Module):
    def __init__(self, cfg: CLIPTextEncoderConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.dtype = dtype
        self.self_attn = CLIPAttention(cfg, rngs)
        self.layer_norm1 = _layer_norm(cfg.hidden_size, cfg.layer_norm_eps, dtype, rngs)
        self.mlp = CLIPMLP(cfg, rngs)
        self.layer_norm2 = _layer_norm(cfg.hidden_size, cfg.layer_norm_eps, dtype, rngs)

    def __call__(self, h: jax.Array, mask: jax.Array) -> jax.Array:
        h = h + self.self_attn(self.layer_norm1(h).astype(self.dtype), mask).astype(jnp.float32)
        return h + self.mlp(self.layer_norm2(h).astype(self.dtype)).astype(jnp.float32)


class CLIPEncoder(nnx.Module):
    def __init__(self, cfg: CLIPTextEncoderConfig, rngs: nnx.Rngs):
        self.remat = cfg.remat
        self.layers = blocks(lambda: CLIPEncoderLayer(cfg, rngs), cfg.num_hidden_layers, scan=cfg.scan_layers)

    def __call__(self, h: jax.Array, mask: jax.Array) -> jax.Array:
        return apply(self.layers, lambda layer, h: layer(h, mask), h, remat=self.remat)


class CLIPTextEncoder(nnx.Module):
    """CLIP text tower: ids ``(B, T)`` -> ``(last_hidden_state (B, T, D), pooled (B, D))`` float32."""

    def __init__(self, config: CLIPTextEncoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = CLIPTextEmbeddings(config, rngs)
        self.encoder = CLIPEncoder(config, rngs)
        self.final_layer_norm = _layer_norm(
            config.hidden_size, config.layer_norm_eps, compute_dtype(config.dtype), rngs
        )

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """``input_ids`` ``(B, T)`` int with ``T <= max_position_embeddings``; ``attention_mask``
        ``(B, T)`` (zero = padding no token attends to) on top of the causal mask, or None."""
        chex.assert_rank(input_ids, 2)
        b, t = input_ids.shape
        if t > self.config.max_position_embeddings:
            raise ValueError(
                f"input_ids has {t} tokens; this CLIP text encoder takes at most {self.config.max_position_embeddings}"
            )
        input_ids = jnp.asarray(input_ids, jnp.int32)
        mask = jnp.tril(jnp.ones((t, t), bool))[None, None]
        if attention_mask is not None:
            chex.assert_shape(attention_mask, (b, t))
            mask = mask & (jnp.asarray(attention_mask) != 0)[:, None, None, :]
        h = self.encoder(self.embeddings(input_ids), mask)
        h = self.final_layer_norm(h).astype(jnp.float32)
        return h, pool_eos(h, input_ids, self.config.eos_token_id)


def _text_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint tensors as ``CLIPTextEncoder`` keys: the hub's ``text_model.`` prefix removed
    (transformers 5 saves without it) and the non-parameter ``position_ids`` buffer dropped."""
    out = {}
    for key, value in tensors.items():
        key = key.removeprefix("text_model.")
        if key != "embeddings.position_ids":
            out[key] = value
    return out


def load(
    folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none"
) -> CLIPTextEncoder:
    """The CLIP text tower of a transformers ``CLIPTextModel`` folder (``config.json`` + safetensors).

    Args:
      folder: the model folder.
      dtype: the parameter and compute dtype's name.
      scan_layers: store the layers stacked (transformers' per-layer keys are stacked on load).
      remat: the layers' rematerialisation policy (``stacked.REMAT_POLICIES``).

    Returns:
      The loaded ``CLIPTextEncoder``.

    Raises:
      ValueError: if ``config.json`` is not a ``clip_text_model``.
      hf.KeyMappingError: naming missing, unexpected or mis-shaped keys.
    """
    build = builder(CLIPTextEncoderConfig.from_json, CLIPTextEncoder, dtype, scan_layers, remat)
    return hf.load_module(folder, build, prepare=_text_tensors)


def param_count(config: CLIPTextEncoderConfig) -> int:
    """The number of parameters of ``CLIPTextEncoder(config)`` (counted abstractly: nothing is allocated).

    Args:
      config: the encoder's sizes.

    Returns:
      The parameter count.
    """
    return hf.count_params(nnx.eval_shape(lambda: CLIPTextEncoder(config, rngs=nnx.Rngs(0))))
