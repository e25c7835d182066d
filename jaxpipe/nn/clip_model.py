"""The whole CLIP (transformers ``CLIPModel``) in Flax NNX: both towers, both projections and ``logit_scale``.

``image_features`` / ``text_features`` are transformers' ``get_image_features`` /
``get_text_features`` (unnormalised projections of the pooled outputs); ``similarity`` is the
CLIP logit ``exp(logit_scale) · cos``. Keys load as saved (``text_model.*``, ``vision_model.*``,
``visual_projection.weight``, ``text_projection.weight``, ``logit_scale``), so a PickScore or
an OpenAI / LAION CLIP folder loads as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn import hf
from jaxpipe.nn.clip import CLIPTextEncoder, CLIPTextEncoderConfig
from jaxpipe.nn.clip_vision import CLIPVisionConfig, CLIPVisionEncoder
from jaxpipe.nn.layers import check_sizes, compute_dtype

__all__ = ["CLIPConfig", "CLIPModel", "load", "param_count", "normalize"]


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
    """A ``CLIPModel``: its two towers, the shared ``projection_dim`` and ``logit_scale``'s initial value
    (both towers use the text config's ``dtype`` and the layout settings each carries).

    Raises:
      ValueError: if ``projection_dim`` is not a positive int.
    """

    text: CLIPTextEncoderConfig
    vision: CLIPVisionConfig
    projection_dim: int = 512
    logit_scale_init_value: float = 2.6592

    def __post_init__(self):
        check_sizes(self, ("projection_dim",))

    @classmethod
    def from_json(
        cls, d: Mapping[str, Any], *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none"
    ) -> CLIPConfig:
        """The model a transformers ``CLIPModel`` ``config.json`` (``model_type`` ``"clip"``) describes.

        Raises:
          ValueError: for another ``model_type``.
        """
        if d.get("model_type") != "clip":
            raise ValueError(f"config.json model_type must be 'clip' for a CLIPModel (got {d.get('model_type')!r})")
        text = CLIPTextEncoderConfig.from_json(
            {**d.get("text_config", {}), "model_type": "clip_text_model"}, dtype=dtype
        )
        vision = CLIPVisionConfig.from_json(d, dtype=dtype)
        layout = dict(scan_layers=scan_layers, remat=remat)
        return cls(
            dataclasses.replace(text, **layout),
            dataclasses.replace(vision, **layout),
            projection_dim=int(d.get("projection_dim", 512)),
            logit_scale_init_value=float(d.get("logit_scale_init_value", 2.6592)),
        )

    @classmethod
    def tiny(cls, **overrides) -> CLIPConfig:
        """Tiny towers (width 32) projecting to 16: for tests and tiny reward cards."""
        fields = dict(text=CLIPTextEncoderConfig.tiny(), vision=CLIPVisionConfig.tiny(), projection_dim=16)
        return cls(**{**fields, **overrides})

    @classmethod
    def vit_b16(cls, **overrides) -> CLIPConfig:
        """openai/clip-vit-base-patch16 (about 150 M parameters)."""
        text = CLIPTextEncoderConfig(
            vocab_size=49408,
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=8,
            eos_token_id=2,
        )
        return cls(**{"text": text, "vision": CLIPVisionConfig.vit_b16(), "projection_dim": 512, **overrides})

    @classmethod
    def vit_l14(cls, **overrides) -> CLIPConfig:
        """openai/clip-vit-large-patch14 (about 428 M parameters)."""
        return cls(
            **{
                "text": CLIPTextEncoderConfig.vit_l14(),
                "vision": CLIPVisionConfig.vit_l14(),
                "projection_dim": 768,
                **overrides,
            }
        )

    @classmethod
    def vit_h14(cls, **overrides) -> CLIPConfig:
        """laion/CLIP-ViT-H-14-laion2B-s32B-b79K, PickScore_v1's architecture (about 986 M parameters)."""
        text = CLIPTextEncoderConfig(
            vocab_size=49408,
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            hidden_act="gelu",
            eos_token_id=2,
        )
        return cls(**{"text": text, "vision": CLIPVisionConfig.vit_h14(), "projection_dim": 1024, **overrides})


def normalize(x: jax.Array) -> jax.Array:
    """``x / ‖x‖`` along the last axis (float32), as CLIP scores do before their dot products; a zero row stays zero.

    Args:
      x: ``(..., D)`` features.

    Returns:
      ``(..., D)`` float32 unit vectors.
    """
    x = jnp.asarray(x, jnp.float32)
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / jnp.where(norm == 0, 1.0, norm)


class CLIPModel(nnx.Module):
    """CLIP: ``image_features(pixels (B, H, W, 3)) -> (B, P)``, ``text_features(ids (B, T)) -> (B, P)``."""

    def __init__(self, config: CLIPConfig, *, rngs: nnx.Rngs):
        dtype = compute_dtype(config.text.dtype)
        self.config = config
        self.text_model = CLIPTextEncoder(config.text, rngs=rngs)
        self.vision_model = CLIPVisionEncoder(config.vision, rngs=rngs)
        self.visual_projection = nnx.Linear(
            config.vision.hidden_size, config.projection_dim, use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs
        )
        self.text_projection = nnx.Linear(
            config.text.hidden_size, config.projection_dim, use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs
        )
        self.logit_scale = nnx.Param(jnp.asarray(config.logit_scale_init_value, jnp.float32))

    def image_features(self, pixel_values: jax.Array) -> jax.Array:
        """transformers' ``get_image_features``: the projected pooled image output ``(B, P)`` float32.

        Args:
          pixel_values: ``(B, image_size, image_size, 3)``, preprocessed (``clip_vision.preprocess``).
        """
        _, pooled = self.vision_model(pixel_values)
        return self.visual_projection(pooled.astype(self.visual_projection.kernel.dtype)).astype(jnp.float32)

    def text_features(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
        """transformers' ``get_text_features``: the projected pooled text output ``(B, P)`` float32.

        Args:
          input_ids: ``(B, T)`` CLIP token ids.
          attention_mask: ``(B, T)`` (zero = padding) or None.
        """
        _, pooled = self.text_model(input_ids, attention_mask)
        return self.text_projection(pooled.astype(self.text_projection.kernel.dtype)).astype(jnp.float32)

    def similarity(self, image_features: jax.Array, text_features: jax.Array) -> jax.Array:
        """CLIP's row-wise logit ``exp(logit_scale) · cos(image_i, text_i)`` ``(B,)`` (PickScore's score)."""
        cos = jnp.sum(normalize(image_features) * normalize(text_features), axis=-1)
        return jnp.exp(self.logit_scale[...].astype(jnp.float32)) * cos


def _clip_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in tensors.items() if not k.endswith("embeddings.position_ids")}


def load(folder: str | Path, *, dtype: str = "float32", scan_layers: bool = True, remat: str = "none") -> CLIPModel:
    """A transformers ``CLIPModel`` folder (``config.json`` with ``model_type`` ``"clip"`` + safetensors).

    Args:
      folder: the model folder (PickScore_v1, openai/clip-vit-large-patch14, ...).
      dtype: the parameter and compute dtype's name.
      scan_layers: store both towers' layers stacked.
      remat: the layers' rematerialisation policy.

    Returns:
      The loaded ``CLIPModel``.

    Raises:
      ValueError: if ``config.json`` is not a ``clip`` config.
      hf.KeyMappingError: naming missing, unexpected or mis-shaped keys.
    """

    def build(config: dict[str, Any]) -> CLIPModel:
        return CLIPModel(
            CLIPConfig.from_json(config, dtype=dtype, scan_layers=scan_layers, remat=remat), rngs=nnx.Rngs(0)
        )

    return hf.load_module(folder, build, prepare=_clip_tensors)


def param_count(config: CLIPConfig) -> int:
    """The number of parameters of ``CLIPModel(config)`` (counted abstractly: nothing is allocated).

    Args:
      config: the model's sizes.

    Returns:
      The parameter count.
    """
    return hf.count_params(nnx.eval_shape(lambda: CLIPModel(config, rngs=nnx.Rngs(0))))
