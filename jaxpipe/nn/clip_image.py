"""CLIP's image preprocessing (transformers' ``CLIPImageProcessor``) as array maths: resize the shortest edge,
centre crop, normalise. In JAX, so generated images are scored in-graph and rewards stay differentiable."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import validate

__all__ = ["OPENAI_MEAN", "OPENAI_STD", "ImageProcessing", "preprocess"]

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
"""CLIP's per-channel image mean (``OPENAI_CLIP_MEAN``), in [0, 1] units."""
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
"""CLIP's per-channel image standard deviation (``OPENAI_CLIP_STD``)."""


def _pair(value: Any, what: str) -> tuple[int, int]:
    if isinstance(value, Mapping):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        if "shortest_edge" in value:
            return int(value["shortest_edge"]), int(value["shortest_edge"])
        raise ValueError(f"preprocessor {what} {dict(value)} has neither height/width nor shortest_edge")
    return int(value), int(value)


@dataclasses.dataclass(frozen=True)
class ImageProcessing:
    """``CLIPImageProcessor``'s settings: resize the shortest edge to ``size`` (``None``: no resize), centre
    crop to ``crop`` ``(h, w)``, then ``(x - mean) / std`` per channel (images in [0, 1]).

    Raises:
      ValueError: on non-positive sizes, or a mean / std that is not three finite numbers (std > 0).
    """

    size: int | None = 224
    crop: tuple[int, int] = (224, 224)
    mean: tuple[float, float, float] = OPENAI_MEAN
    std: tuple[float, float, float] = OPENAI_STD

    def __post_init__(self):
        validate.counts(self, "size", optional=True)
        validate.rule(
            len(self.crop) == 2 and min(self.crop) >= 1, f"crop must be (height, width) > 0 (got {self.crop!r})"
        )
        for name in ("mean", "std"):
            value = getattr(self, name)
            validate.rule(
                len(value) == 3 and all(np.isfinite(value)), f"{name} must be three finite numbers (got {value!r})"
            )
        validate.rule(min(self.std) > 0, f"std must be positive (got {self.std!r})")

    @classmethod
    def openai(cls, size: int = 224) -> ImageProcessing:
        """CLIP's own preprocessing at ``size`` (224 for ViT-B/16, ViT-L/14, ViT-H/14)."""
        return cls(size=size, crop=(size, size))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ImageProcessing:
        """From a ``preprocessor_config.json`` (``CLIPImageProcessor``'s keys).

        Raises:
          ValueError: for a processor that does not rescale to [0, 1] by 1/255, or one that skips the crop
            or normalisation while resizing to a non-square size (not what CLIP models see).
        """
        factor = float(d.get("rescale_factor", 1 / 255))
        if d.get("do_rescale", True) and abs(factor - 1 / 255) > 1e-9:
            raise ValueError(f"rescale_factor {factor} is not 1/255; jaxpipe's images are in [0, 1]")
        size = _pair(d.get("size", 224), "size")[0] if d.get("do_resize", True) else None
        crop = _pair(d.get("crop_size", 224), "crop_size") if d.get("do_center_crop", True) else None
        if crop is None:
            if size is None:
                raise ValueError("a preprocessor that neither resizes nor crops has no fixed image size")
            crop = (size, size)
        if d.get("do_normalize", True):
            mean = tuple(float(x) for x in d.get("image_mean", OPENAI_MEAN))
            std = tuple(float(x) for x in d.get("image_std", OPENAI_STD))
        else:
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        return cls(size=size, crop=crop, mean=mean, std=std)

    @classmethod
    def from_folder(cls, folder: str | Path) -> ImageProcessing:
        """From ``folder/preprocessor_config.json``.

        Raises:
          FileNotFoundError: if the folder has none.
          ValueError: as ``from_json``.
        """
        path = Path(folder) / "preprocessor_config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{folder}: no preprocessor_config.json (a CLIPImageProcessor's settings)")
        return cls.from_json(json.loads(path.read_text()))


def _resized_shape(h: int, w: int, size: int) -> tuple[int, int]:
    """transformers' shortest-edge rule: the short side becomes ``size``, the long side ``int(size·long/short)``."""
    if h <= w:
        return size, int(size * w / h)
    return int(size * h / w), size


def preprocess(images: jax.Array, processing: ImageProcessing = ImageProcessing()) -> jax.Array:
    """CLIP's preprocessing of ``images`` ``(B, H, W, 3)`` in [0, 1] -> ``pixel_values`` ``(B, crop_h, crop_w, 3)``.

    Resizes the shortest edge (bicubic, antialiased when shrinking), centre crops as transformers does
    (offset ``(H - crop_h) // 2``), normalises; differentiable. Crop-sized images are not resampled, so
    they give exactly ``CLIPImageProcessor``'s values on the same uint8 images; otherwise the
    interpolation differs from PIL's in detail (PIL resamples rounded uint8 pixels).

    Args:
      images: ``(B, H, W, 3)`` in [0, 1].
      processing: the processor's settings.

    Returns:
      ``(B, crop_h, crop_w, 3)`` float32 pixel values.

    Raises:
      ValueError: if ``images`` is not ``(B, H, W, 3)``, or is smaller than the crop after resizing.
    """
    images = jnp.asarray(images, jnp.float32)
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (B, H, W, 3) in [0, 1] (got shape {tuple(images.shape)})")
    b, h, w, _ = images.shape
    if processing.size is not None:
        shape = _resized_shape(h, w, processing.size)
        if shape != (h, w):
            images = jax.image.resize(images, (b, *shape, 3), method="bicubic", antialias=True)
            h, w = shape
    ch, cw = processing.crop
    if ch > h or cw > w:
        raise ValueError(f"images of {h}×{w} (after resizing) are smaller than the {ch}×{cw} crop")
    top, left = (h - ch) // 2, (w - cw) // 2
    images = images[:, top : top + ch, left : left + cw]
    mean, std = jnp.asarray(processing.mean, jnp.float32), jnp.asarray(processing.std, jnp.float32)
    return (images - mean) / std
