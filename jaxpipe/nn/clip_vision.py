"""The CLIP vision tower (transformers ``CLIPVisionModel`` / ``CLIPVisionModelWithProjection``) in Flax NNX,
and CLIP's image preprocessing in JAX.

Patch embedding (a stride-``patch`` convolution without bias) + a class token + learned position
embeddings -> ``pre_layrnorm`` -> pre-LayerNorm transformer layers (the text tower's, without a
mask) -> the pooled output ``post_layernorm(h[:, 0])``. Attribute names mirror transformers
(``embeddings.patch_embedding``, ``pre_layrnorm`` with its historical spelling), so checkpoints
load key for key. Images are channels-last ``(B, H, W, C)``. ``preprocess`` (``ImageProcessing``,
in ``clip_image``, re-exported here) is ``CLIPImageProcessor`` as array maths, so generated images are
scored in-graph and rewards stay differentiable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn import hf
from jaxpipe.nn.clip import CLIPEncoder, _layer_norm, builder, check_tower
from jaxpipe.nn.clip_image import OPENAI_MEAN, OPENAI_STD, ImageProcessing, preprocess
from jaxpipe.nn.layers import check_divisible, check_sizes, compute_dtype
from jaxpipe.nn.stacked import apply, prefix

__all__ = [
    "LOGICAL_AXES",
    "OPENAI_MEAN",
    "OPENAI_STD",
    "CLIPVisionConfig",
    "CLIPVisionEncoder",
    "CLIPVisionWithProjection",
    "ImageProcessing",
    "load",
    "load_with_projection",
    "param_count",
    "preprocess",
]

LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embeddings/patch_embedding/kernel", (None, None, None, "embed")),
    (r"embeddings/position_embedding/embedding", (None, "embed")),
    (r".*/self_attn/(q_proj|k_proj|v_proj)/kernel", ("embed", "heads")),
    (r".*/self_attn/out_proj/kernel", ("heads", "embed")),
    (r".*/mlp/fc1/kernel", ("embed", "mlp")),
    (r".*/mlp/fc2/kernel", ("mlp", "embed")),
)

# the transformers default CLIPVisionConfig, for keys a config.json leaves out
_JSON_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "projection_dim": 512,
}


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
    """Sizes of a CLIP vision tower; names as in transformers' ``CLIPVisionConfig``.

    ``projection_dim`` is the width of ``CLIPVisionWithProjection``'s image embeddings (unused by
    the bare tower). jaxpipe's own: the parameter / compute ``dtype``, ``scan_layers`` and ``remat``
    as the text tower's.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int = 224
    patch_size: int = 32
    num_channels: int = 3
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    projection_dim: int = 512
    dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"

    def __post_init__(self):
        check_sizes(
            self,
            (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "image_size",
                "patch_size",
                "num_channels",
                "projection_dim",
            ),
        )
        check_divisible(self, "image_size", "patch_size")
        check_tower(self)

    @property
    def head_dim(self) -> int:
        """The width of one attention head, ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_patches(self) -> int:
        """Patches per image, ``(image_size // patch_size)**2`` (the tokens are these plus the class token)."""
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, dtype: str = "float32") -> CLIPVisionConfig:
        """The tower a transformers ``CLIPVisionModel`` ``config.json`` describes (``model_type``
        ``"clip_vision_model"``), or a full ``CLIPModel`` config's ``vision_config``."""
        if d.get("model_type") == "clip":
            d = {**d.get("vision_config", {}), "projection_dim": d.get("projection_dim", 512)}
        elif d.get("model_type") not in ("clip_vision_model", None):
            raise ValueError(
                f"config.json model_type must be 'clip_vision_model' or 'clip' for a CLIP vision tower (got {d.get('model_type')!r})"
            )
        return cls(**{key: d.get(key, default) for key, default in _JSON_DEFAULTS.items()}, dtype=dtype)

    @classmethod
    def tiny(cls, **overrides) -> CLIPVisionConfig:
        """Two layers, width 32, 32² images in 8² patches: for tests and tiny reward / I2V cards."""
        return cls(
            **{
                "hidden_size": 32,
                "intermediate_size": 37,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": 32,
                "patch_size": 8,
                "projection_dim": 16,
                **overrides,
            }
        )

    @classmethod
    def vit_b16(cls, **overrides) -> CLIPVisionConfig:
        """openai/clip-vit-base-patch16's vision tower (about 86 M parameters)."""
        return cls(
            **{
                "hidden_size": 768,
                "intermediate_size": 3072,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "image_size": 224,
                "patch_size": 16,
                "projection_dim": 512,
                **overrides,
            }
        )

    @classmethod
    def vit_l14(cls, **overrides) -> CLIPVisionConfig:
        """openai/clip-vit-large-patch14's vision tower (about 303 M parameters): the LAION aesthetic predictor's."""
        return cls(
            **{
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "image_size": 224,
                "patch_size": 14,
                "projection_dim": 768,
                **overrides,
            }
        )

    @classmethod
    def vit_h14(cls, **overrides) -> CLIPVisionConfig:
        """laion/CLIP-ViT-H-14-laion2B-s32B-b79K's vision tower (about 632 M parameters): PickScore's and
        Wan 2.1 I2V's image encoder (plain GELU)."""
        return cls(
            **{
                "hidden_size": 1280,
                "intermediate_size": 5120,
                "num_hidden_layers": 32,
                "num_attention_heads": 16,
                "image_size": 224,
                "patch_size": 14,
                "hidden_act": "gelu",
                "projection_dim": 1024,
                **overrides,
            }
        )


class CLIPVisionEmbeddings(nnx.Module):
    def __init__(self, cfg: CLIPVisionConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.config = cfg
        self.class_embedding = nnx.Param(jax.random.normal(rngs.params(), (cfg.hidden_size,), dtype))
        self.patch_embedding = nnx.Conv(
            cfg.num_channels,
            cfg.hidden_size,
            (cfg.patch_size, cfg.patch_size),
            strides=cfg.patch_size,
            padding="VALID",
            use_bias=False,
            dtype=dtype,
            param_dtype=dtype,
            rngs=rngs,
        )
        self.position_embedding = nnx.Embed(
            cfg.num_patches + 1, cfg.hidden_size, dtype=dtype, param_dtype=dtype, rngs=rngs
        )

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        cfg = self.config
        b, h, w, c = pixel_values.shape
        if (h, w, c) != (cfg.image_size, cfg.image_size, cfg.num_channels):
            raise ValueError(
                f"pixel_values must be (B, {cfg.image_size}, {cfg.image_size}, {cfg.num_channels}) "
                f"(channels-last; preprocess resizes and crops) — got {tuple(pixel_values.shape)}"
            )
        patches = self.patch_embedding(pixel_values.astype(self.class_embedding.dtype)).reshape(b, -1, cfg.hidden_size)
        cls = jnp.broadcast_to(self.class_embedding[...], (b, 1, cfg.hidden_size))
        tokens = jnp.concatenate([cls, patches], axis=1).astype(jnp.float32)
        return tokens + self.position_embedding(jnp.arange(cfg.num_patches + 1))[None].astype(jnp.float32)


class CLIPVisionEncoder(nnx.Module):
    """CLIP vision tower: pixels ``(B, H, W, C)`` -> ``(last_hidden_state (B, 1+N, D), pooled (B, D))`` float32."""

    def __init__(self, config: CLIPVisionConfig, *, rngs: nnx.Rngs):
        dtype = compute_dtype(config.dtype)
        self.config = config
        self.embeddings = CLIPVisionEmbeddings(config, rngs)
        self.pre_layrnorm = _layer_norm(config.hidden_size, config.layer_norm_eps, dtype, rngs)
        self.encoder = CLIPEncoder(config, rngs)
        self.post_layernorm = _layer_norm(config.hidden_size, config.layer_norm_eps, dtype, rngs)

    def _hidden(self, pixel_values: jax.Array, layers: int) -> jax.Array:
        chex.assert_rank(pixel_values, 4)
        h = self.pre_layrnorm(self.embeddings(pixel_values))
        if layers == 0:
            return h
        blocks = self.encoder.layers if layers == self.config.num_hidden_layers else prefix(self.encoder.layers, layers)
        full = jnp.ones((1, 1, 1, 1), bool)  # vision tokens all see each other
        return apply(blocks, lambda layer, h: layer(h, full), h, remat=self.encoder.remat)

    def __call__(self, pixel_values: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``pixel_values`` ``(B, image_size, image_size, C)``, normalised (``preprocess``)."""
        h = self._hidden(pixel_values, self.config.num_hidden_layers)
        return h, self.post_layernorm(h[:, 0]).astype(jnp.float32)

    def hidden_state(self, pixel_values: jax.Array, index: int = -2) -> jax.Array:
        """transformers' ``output_hidden_states=True`` ``.hidden_states[index]`` ``(B, 1+N, D)``: entry 0 is the
        embeddings after ``pre_layrnorm``, entry ``i`` the output of layer ``i`` (Wan 2.1 I2V reads ``-2``).
        Only the layers up to it run.

        Raises:
          IndexError: if ``index`` is outside the ``num_hidden_layers + 1`` entries.
        """
        n = self.config.num_hidden_layers
        if not -(n + 1) <= index <= n:
            raise IndexError(f"hidden_state index {index} is outside the {n + 1} hidden states of this tower")
        return self._hidden(pixel_values, index % (n + 1))


class CLIPVisionWithProjection(nnx.Module):
    """``CLIPVisionModelWithProjection``: pixels ``(B, H, W, C)`` -> image embeddings ``(B, projection_dim)``."""

    def __init__(self, config: CLIPVisionConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.vision_model = CLIPVisionEncoder(config, rngs=rngs)
        self.visual_projection = nnx.Linear(
            config.hidden_size,
            config.projection_dim,
            use_bias=False,
            dtype=compute_dtype(config.dtype),
            param_dtype=compute_dtype(config.dtype),
            rngs=rngs,
        )

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        _, pooled = self.vision_model(pixel_values)
        return self.visual_projection(pooled.astype(self.visual_projection.kernel.dtype)).astype(jnp.float32)


def _vision_tensors(tensors: dict[str, np.ndarray], *, strip: bool) -> dict[str, np.ndarray]:
    """Checkpoint tensors without the ``position_ids`` buffer (and, for the bare tower, the ``vision_model.`` prefix)."""
    out = {}
    for key, value in tensors.items():
        if key.endswith("embeddings.position_ids"):
            continue
        out[key.removeprefix("vision_model.") if strip else key] = value
    return out


def load(
    folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none"
) -> CLIPVisionEncoder:
    """The vision tower of a transformers ``CLIPVisionModel`` folder (``config.json`` + safetensors).

    Args:
      folder: the model folder.
      dtype: the parameter and compute dtype's name.
      scan_layers: store the layers stacked (per-layer keys are stacked on load).
      remat: the layers' rematerialisation policy.

    Returns:
      The loaded ``CLIPVisionEncoder``.

    Raises:
      ValueError: if ``config.json`` is not a CLIP vision config.
      hf.KeyMappingError: naming missing, unexpected or mis-shaped keys (a ``CLIPVisionModelWithProjection``
        folder has a ``visual_projection``: use ``load_with_projection``).
    """
    return hf.load_module(
        folder,
        builder(CLIPVisionConfig.from_json, CLIPVisionEncoder, dtype, scan_layers, remat),
        prepare=lambda t: _vision_tensors(t, strip=True),
    )


def load_with_projection(
    folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none"
) -> CLIPVisionWithProjection:
    """A transformers ``CLIPVisionModelWithProjection`` folder, as ``load`` (the tower plus ``visual_projection``).

    Args:
      folder: the model folder.
      dtype: the parameter and compute dtype's name.
      scan_layers: store the layers stacked.
      remat: the layers' rematerialisation policy.

    Returns:
      The loaded ``CLIPVisionWithProjection``.

    Raises:
      ValueError, hf.KeyMappingError: as ``load``.
    """
    return hf.load_module(
        folder,
        builder(CLIPVisionConfig.from_json, CLIPVisionWithProjection, dtype, scan_layers, remat),
        prepare=lambda t: _vision_tensors(t, strip=False),
    )


def param_count(config: CLIPVisionConfig, *, projection: bool = False) -> int:
    """The number of parameters of ``CLIPVisionEncoder(config)`` (or ``CLIPVisionWithProjection``), counted abstractly.

    Args:
      config: the tower's sizes.
      projection: count ``CLIPVisionWithProjection`` (the tower plus ``visual_projection``).

    Returns:
      The parameter count.
    """
    cls = CLIPVisionWithProjection if projection else CLIPVisionEncoder
    return hf.count_params(nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0))))
