"""CLIP rewards, scored in-graph: CLIPScore (Hessel et al. 2021) and PickScore (Kirstain et al. 2023).

Both are JAX rewards built from a transformers ``CLIPModel`` folder, traced into the trainers'
jitted step and differentiable with respect to the images::

    reward = jaxpipe.rewards.clip.pickscore("PickScore_v1", processor="CLIP-ViT-H-14-laion2B-s32B-b79K")
    scores = jax.jit(reward)({"image": images}, prompts)           # (B,) float32

* ``CLIPScore``: ``w · max(cos(image_features, text_features), 0)``, ``w = 2.5`` by default.
* ``PickScore``: ``exp(logit_scale) · cos(image_features, text_features)``, as PickScore's README
  scores (``model.logit_scale.exp() * text_embs @ image_embs.T`` of L2-normalised embeddings).

Images are ``artifacts["image"]`` ``(B, H, W, C)`` in [0, 1] (C = 3, or 1: grey repeated to RGB);
videos ``artifacts["video"]`` ``(B, T, H, W, C)`` are scored frame by frame and averaged. Pixels
are preprocessed in-graph (``clip_vision.preprocess``: the folder's ``preprocessor_config.json``).
The prompt texts are tokenised on the host, through ``jax.pure_callback``, from the prompts' UTF-8
bytes into a fixed ``(B, max_length)`` (the text tower's positions, 77 for real CLIPs), so the step
stays one ``jax.jit``.

The folder: a ``CLIPModel`` folder (``config.json`` with ``model_type`` ``"clip"`` +
``*.safetensors``), its tokenizer (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``) and its
``preprocessor_config.json`` at its root or in a ``processor/``, ``tokenizer/``,
``feature_extractor/`` or ``image_processor/`` sub-folder (``FOLDERS``). PickScore_v1 ships
neither: its processor is ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``'s, so pass that folder as
``processor=`` (or copy its tokenizer and ``preprocessor_config.json`` into ``PickScore_v1/processor``).

The model's weights are the reward's ``weights`` (``bind`` swaps them): the trainers pass them to their jitted step
as an argument, so they are not compiled into it as constants (``jaxpipe.rewards.weighted``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn import clip_model, hf
from jaxpipe.nn.clip_vision import ImageProcessing, preprocess
from jaxpipe.nn.tokenizer import HFTokenizer
from jaxpipe.prompts import Prompts, check, decode_text

__all__ = [
    "CLIPSCORE_WEIGHT",
    "FOLDERS",
    "CLIPReward",
    "CLIPScore",
    "PickScore",
    "HostTokenizer",
    "clipscore",
    "pickscore",
    "find_processor",
    "find_tokenizer",
    "frames",
    "image_processing",
]

CLIPSCORE_WEIGHT = 2.5
"""CLIPScore's ``w`` (Hessel et al. 2021); torchmetrics' ``CLIPScore`` reports ``w = 100``."""

FOLDERS = ("", "processor", "tokenizer", "feature_extractor", "image_processor")
"""Where, inside a folder, a CLIP reward looks for the tokenizer and ``preprocessor_config.json``, in order."""


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (
        (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    )


def _has_processor(folder: Path) -> bool:
    return (folder / "preprocessor_config.json").is_file() or "image_processor" in _read_json(
        folder / "processor_config.json"
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


def _find(folders: list[Path], test, what: str) -> Path:
    for root in folders:
        for sub in FOLDERS:
            if test(root / sub):
                return root / sub
    looked = ", ".join(str(f) for f in folders)
    raise FileNotFoundError(
        f"no {what} in {looked} (nor in their {', '.join(s + '/' for s in FOLDERS[1:])} sub-folders)"
    )


def find_tokenizer(*folders: str | Path) -> Path:
    """The first of ``folders`` (each, then its ``FOLDERS`` sub-folders) holding a tokenizer.

    Args:
      folders: the folders to search, in order.

    Returns:
      The folder with ``tokenizer.json`` (or ``vocab.json`` + ``merges.txt``).

    Raises:
      FileNotFoundError: naming the folders searched.
    """
    return _find(
        [Path(f) for f in folders], _has_tokenizer, "CLIP tokenizer (tokenizer.json, or vocab.json + merges.txt)"
    )


def find_processor(*folders: str | Path) -> Path:
    """The first of ``folders`` (each, then its ``FOLDERS`` sub-folders) holding the image processor's settings:
    ``preprocessor_config.json``, or transformers 5's ``processor_config.json`` with an ``"image_processor"``.

    Raises:
      FileNotFoundError: naming the folders searched.
    """
    return _find([Path(f) for f in folders], _has_processor, "preprocessor_config.json (CLIPImageProcessor settings)")


def image_processing(folder: str | Path) -> ImageProcessing:
    """The ``ImageProcessing`` of a folder ``find_processor`` found (``preprocessor_config.json`` first).

    Args:
      folder: the folder.

    Returns:
      Its ``ImageProcessing``.

    Raises:
      FileNotFoundError: the folder has neither file.
      ValueError: as ``ImageProcessing.from_json``.
    """
    folder = Path(folder)
    if (folder / "preprocessor_config.json").is_file():
        return ImageProcessing.from_folder(folder)
    settings = _read_json(folder / "processor_config.json").get("image_processor")
    if not isinstance(settings, dict):
        raise FileNotFoundError(
            f"{folder}: no preprocessor_config.json (nor a processor_config.json with an image_processor)"
        )
    return ImageProcessing.from_json(settings)


def frames(artifacts: Mapping[str, Any]) -> tuple[jax.Array, int]:
    """The frames a CLIP reward scores: ``(B·T, H, W, 3)`` float32 and ``T`` (1 for images).

    ``artifacts["video"]`` ``(B, T, H, W, C)`` if present, else ``artifacts["image"]`` ``(B, H, W, C)``;
    one channel (grey) is repeated to RGB, as PIL's ``convert("RGB")`` does.

    Args:
      artifacts: the rendered artifacts.

    Returns:
      ``(frames, T)``.

    Raises:
      ValueError: no image or video, another rank, or a channel count other than 1 or 3.
    """
    if "video" in artifacts:
        video = jnp.asarray(artifacts["video"], jnp.float32)
        if video.ndim != 5:
            raise ValueError(f"artifacts['video'] must be (B, T, H, W, C) (got shape {tuple(video.shape)})")
        b, t = video.shape[:2]
        images = video.reshape(b * t, *video.shape[2:])
    elif "image" in artifacts:
        images, t = jnp.asarray(artifacts["image"], jnp.float32), 1
        if images.ndim != 4:
            raise ValueError(f"artifacts['image'] must be (B, H, W, C) (got shape {tuple(images.shape)})")
    else:
        raise ValueError(f"an image reward scores artifacts['image'] or artifacts['video'] (got {sorted(artifacts)})")
    if images.shape[-1] == 1:
        images = jnp.repeat(images, 3, axis=-1)
    if images.shape[-1] != 3:
        raise ValueError(f"images must have 3 channels (or 1, grey) to be scored by CLIP (got {images.shape[-1]})")
    return images, t


class HostTokenizer:
    """Prompt bytes ``(..., W)`` uint8 -> CLIP ``(ids, mask)`` ``(..., max_length)`` int32, on the host via ``jax.pure_callback``.

    Each prompt is padded (and truncated) to ``max_length`` with its start / end-of-text tokens, as
    ``tokenizer(texts, padding="max_length", truncation=True, max_length=max_length)``; under a causal
    mask and the attention mask this gives the pooled features of transformers' ``padding=True``.
    """

    def __init__(self, tokenizer: HFTokenizer, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = int(max_length)

    def __call__(self, text: jax.Array) -> tuple[jax.Array, jax.Array]:
        """The token ids and attention mask of ``text`` (``(..., W)`` uint8, zero-padded UTF-8)."""
        shape = jax.ShapeDtypeStruct((*np.shape(text)[:-1], self.max_length), jnp.int32)
        return jax.pure_callback(self._on_host, (shape, shape), text, vmap_method="broadcast_all")

    def _on_host(self, text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        text = np.asarray(text)
        strings = decode_text(text.reshape(-1, text.shape[-1]))
        distinct = {s: i for i, s in enumerate(dict.fromkeys(strings))}  # RL batches repeat each prompt K times
        ids, mask = self.tokenizer(list(distinct), self.max_length)
        rows = np.asarray([distinct[s] for s in strings], np.int64)
        lead = text.shape[:-1]
        return ids[rows].reshape(*lead, self.max_length), mask[rows].reshape(*lead, self.max_length)


class CLIPReward:
    """A CLIP model, its tokenizer and image preprocessing: the part CLIPScore and PickScore share.

    ``cosines(artifacts, prompts)`` is ``cos(image_features, text_features)`` ``(B, T)``, per row and
    frame. A subclass's ``__call__`` makes the ``(B,)`` reward of it.
    """

    kind = "clip"

    def __init__(
        self,
        model: clip_model.CLIPModel,
        tokenizer: HFTokenizer,
        processing: ImageProcessing,
        *,
        max_length: int | None = None,
    ):
        positions = model.config.text.max_position_embeddings
        max_length = positions if max_length is None else max_length
        if (
            isinstance(max_length, bool)
            or not isinstance(max_length, (int, np.integer))
            or not 2 < max_length <= positions
        ):
            raise ValueError(
                f"max_length must be an int in (2, {positions}] (the text tower's positions), got {max_length!r}"
            )
        vision = model.config.vision.image_size
        if tuple(processing.crop) != (vision, vision):
            raise ValueError(
                f"the preprocessor crops to {tuple(processing.crop)} but the vision tower takes {vision}×{vision} images"
            )
        self.config = model.config
        self.processing = processing
        self.tokens = HostTokenizer(tokenizer, int(max_length))
        self._graph, self._params = nnx.split(model)
        self.__name__ = self.__qualname__ = self.kind

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(projection_dim={self.config.projection_dim}, max_length={self.tokens.max_length})"
        )

    @property
    def model(self) -> clip_model.CLIPModel:
        """The ``CLIPModel`` (a fresh view of the same weights)."""
        return nnx.merge(self._graph, self._params)

    @property
    def weights(self) -> nnx.State:
        """The CLIP model's weights: what the trainers pass to their jitted step (``jaxpipe.rewards.weighted``)."""
        return self._params

    def bind(self, weights: nnx.State) -> CLIPReward:
        """This reward computing with ``weights`` (tracers inside a jitted step) in place of its own."""
        bound = copy.copy(self)
        bound._params = weights
        return bound

    def image_embeddings(self, images: jax.Array) -> jax.Array:
        """L2-normalised image features ``(N, P)`` of ``images`` ``(N, H, W, 3)`` in [0, 1] (preprocessed here)."""
        return clip_model.normalize(self.model.image_features(preprocess(images, self.processing)))

    def text_embeddings(self, prompts: Prompts) -> jax.Array:
        """L2-normalised text features ``(B, P)`` of the prompts' texts (tokenised on the host)."""
        ids, mask = self.tokens(check(prompts).text)
        return clip_model.normalize(self.model.text_features(ids, mask))

    def cosines(self, artifacts: Mapping[str, Any], prompts: Prompts) -> jax.Array:
        """``cos(image_features, text_features)`` ``(B, T)``: each row's frames against its prompt.

        Raises:
          ValueError: as ``frames``, or when the artifacts' rows differ from the prompts'.
        """
        images, t = frames(artifacts)
        rows = len(prompts)
        if images.shape[0] != rows * t:
            raise ValueError(
                f"{self.kind}: {images.shape[0] // t} rendered rows but {rows} prompt rows "
                "(repeat the prompts to the rendered rows: prompts.repeat(K))"
            )
        image = self.image_embeddings(images).reshape(rows, t, -1)
        text = self.text_embeddings(prompts)
        return jnp.sum(image * text[:, None], axis=-1)


class CLIPScore(CLIPReward):
    """CLIPScore: ``weight · max(cos(image, text), 0)`` ``(B,)``, averaged over a video's frames.

    Args:
      model: a ``CLIPModel`` (e.g. openai/clip-vit-large-patch14).
      tokenizer: its tokenizer.
      processing: its image preprocessing.
      weight: ``w``; 2.5 as Hessel et al. (torchmetrics reports ``w = 100``).
      max_length: the token length (default: the text tower's positions, 77).
    """

    kind = "clipscore"

    def __init__(
        self,
        model: clip_model.CLIPModel,
        tokenizer: HFTokenizer,
        processing: ImageProcessing,
        *,
        weight: float = CLIPSCORE_WEIGHT,
        max_length: int | None = None,
    ):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not np.isfinite(weight):
            raise ValueError(f"weight must be a finite number (got {weight!r})")
        super().__init__(model, tokenizer, processing, max_length=max_length)
        self.weight = float(weight)

    def __call__(self, artifacts: Mapping[str, Any], prompts: Prompts) -> jax.Array:
        """The reward ``(B,)`` float32 of ``artifacts["image"]`` (or ``["video"]``) against ``prompts``."""
        return jnp.mean(self.weight * jnp.maximum(self.cosines(artifacts, prompts), 0.0), axis=1)


class PickScore(CLIPReward):
    """PickScore: ``exp(logit_scale) · cos(image, text)`` ``(B,)``, averaged over a video's frames.

    Args:
      model: the PickScore ``CLIPModel`` (yuvalkirstain/PickScore_v1).
      tokenizer: its tokenizer (laion/CLIP-ViT-H-14-laion2B-s32B-b79K's).
      processing: its image preprocessing (the same processor's).
      max_length: the token length (default: the text tower's positions, 77, as PickScore's README).
    """

    kind = "pickscore"

    def __call__(self, artifacts: Mapping[str, Any], prompts: Prompts) -> jax.Array:
        """The reward ``(B,)`` float32 of ``artifacts["image"]`` (or ``["video"]``) against ``prompts``."""
        scale = jnp.exp(self.model.logit_scale[...].astype(jnp.float32))
        return jnp.mean(scale * self.cosines(artifacts, prompts), axis=1)


def _parts(
    folder: str | Path,
    processor: str | Path | None,
    tokenizer: str | Path | None,
    dtype: str,
    model: clip_model.CLIPModel | None,
) -> tuple[clip_model.CLIPModel, HFTokenizer, ImageProcessing]:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no CLIP model folder {folder}")
    if model is None:  # the model's config first: a folder of another kind is named as such
        clip_model.CLIPConfig.from_json(hf.read_config(folder))
    searched = [Path(p) for p in (processor,) if p is not None] + [folder]
    tokenizer_folder = find_tokenizer(tokenizer) if tokenizer is not None else find_tokenizer(*searched)
    processing = image_processing(find_processor(*searched))
    text = HFTokenizer.from_folder(tokenizer_folder)
    if model is None:
        model = clip_model.load(folder, dtype=dtype)
    return model, text, processing


def clipscore(
    folder: str | Path,
    *,
    processor: str | Path | None = None,
    tokenizer: str | Path | None = None,
    weight: float = CLIPSCORE_WEIGHT,
    dtype: str = "float32",
    max_length: int | None = None,
    model: clip_model.CLIPModel | None = None,
) -> CLIPScore:
    """The CLIPScore reward of a transformers ``CLIPModel`` folder.

    Args:
      folder: the ``CLIPModel`` folder (``config.json`` + ``*.safetensors``).
      processor: a folder whose tokenizer and ``preprocessor_config.json`` to use first (a CLIPProcessor
        folder; searched with its ``FOLDERS`` sub-folders before ``folder``).
      tokenizer: a tokenizer folder to use instead of searching.
      weight: CLIPScore's ``w`` (2.5).
      dtype: the model's parameter and compute dtype.
      max_length: the token length (default: the text tower's positions).
      model: the folder's ``CLIPModel`` if already loaded (its weights are not read again).

    Returns:
      The ``CLIPScore`` reward.

    Raises:
      FileNotFoundError: no such folder, or no tokenizer / preprocessor config (naming where it looked).
      ValueError: a config that is not a ``clip`` one, a preprocessor that does not fit the vision tower.
      hf.KeyMappingError: weights that do not fit the config.
    """
    return CLIPScore(*_parts(folder, processor, tokenizer, dtype, model), weight=weight, max_length=max_length)


def pickscore(
    folder: str | Path,
    *,
    processor: str | Path | None = None,
    tokenizer: str | Path | None = None,
    dtype: str = "float32",
    max_length: int | None = None,
    model: clip_model.CLIPModel | None = None,
) -> PickScore:
    """The PickScore reward of a ``CLIPModel`` folder (yuvalkirstain/PickScore_v1).

    Args:
      folder: the ``CLIPModel`` folder.
      processor: a folder whose tokenizer and ``preprocessor_config.json`` to use first (PickScore's
        is laion/CLIP-ViT-H-14-laion2B-s32B-b79K).
      tokenizer: a tokenizer folder to use instead of searching.
      dtype: the model's parameter and compute dtype.
      max_length: the token length (default: the text tower's positions, 77).
      model: the folder's ``CLIPModel`` if already loaded.

    Returns:
      The ``PickScore`` reward.

    Raises:
      FileNotFoundError, ValueError, hf.KeyMappingError: as ``clipscore``.
    """
    return PickScore(*_parts(folder, processor, tokenizer, dtype, model), max_length=max_length)
