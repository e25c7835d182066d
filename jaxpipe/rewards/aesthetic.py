"""The LAION aesthetic predictor as a JAX reward: christophschuhmann/improved-aesthetic-predictor on CLIP ViT-L/14.

The predictor is a linear MLP ``768 -> 1024 -> 128 -> 64 -> 16 -> 1`` (dropout between the first
layers, inactive at inference; no activations) on the L2-normalised CLIP ViT-L/14 image
embedding; its published weights (``sac+logos+ava1-l14-linearMSE.pth``) are a PyTorch state dict
with keys ``layers.{0,2,4,6,7}.{weight,bias}``. The score is the predicted 1-10 rating::

    reward = jaxpipe.rewards.aesthetic.load("aesthetic")        # the folder below
    scores = jax.jit(reward)({"image": images}, prompts)         # (B,); the prompts are not read

The folder ``load`` reads::

    aesthetic/
      clip/                                 openai/clip-vit-large-patch14: a CLIPModel folder (only its
                                            vision tower and visual_projection are loaded) or a
                                            CLIPVisionModelWithProjection folder (config.json + *.safetensors),
                                            with its preprocessor_config.json (none: CLIP's own 224 preprocessing)
      sac+logos+ava1-l14-linearMSE.pth      the head: one *.pth (read with torch) or *.safetensors, same keys

Images are preprocessed in-graph (``clip_vision.preprocess``) and videos scored frame by frame and
averaged, as the CLIP rewards (``jaxpipe.rewards.clip``); the reward is differentiable in the images.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn import clip_model, hf
from jaxpipe.nn.clip_vision import CLIPVisionConfig, CLIPVisionWithProjection, ImageProcessing, preprocess
from jaxpipe.prompts import Prompts
from jaxpipe.rewards.clip import FOLDERS, _has_processor, frames, image_processing

__all__ = [
    "HEAD_LAYERS",
    "HEAD_SIZES",
    "AestheticScore",
    "check_head",
    "head_score",
    "load",
    "load_vision",
    "read_head",
]

HEAD_LAYERS = (0, 2, 4, 6, 7)
"""The indices of the head's ``nn.Linear`` s in its ``nn.Sequential`` (dropouts at 1, 3, 5)."""
HEAD_SIZES = (768, 1024, 128, 64, 16, 1)
"""The published head's widths: CLIP ViT-L/14's 768-d embedding down to one rating."""

_CONVERT = (
    'python -c "import torch; from safetensors.torch import save_file; '
    "save_file(torch.load('{pth}', map_location='cpu', weights_only=True), '{out}')\""
)


def read_head(path: str | Path) -> dict[str, np.ndarray]:
    """The head's tensors from a ``.pth`` state dict (needs torch) or a ``.safetensors`` file with the same keys.

    Args:
      path: the file.

    Returns:
      ``{key: float32 array}``.

    Raises:
      FileNotFoundError: no such file.
      ValueError: another suffix, or a ``.pth`` without torch installed (saying how to convert it to
        safetensors), or a ``.pth`` that is not a state dict.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no aesthetic head file {path}")
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        return {k: np.asarray(v, np.float32) for k, v in load_file(str(path)).items()}
    if path.suffix not in (".pth", ".pt", ".bin"):
        raise ValueError(
            f"{path}: the aesthetic head is a .pth state dict or a .safetensors file (got {path.suffix!r})"
        )
    try:
        import torch
    except ImportError:
        out = path.with_suffix(".safetensors")
        raise ValueError(
            f"{path} is a PyTorch file and torch is not installed; convert it once where torch is: "
            f"{_CONVERT.format(pth=path.name, out=out.name)} (then use {out.name})"
        ) from None
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: not a state dict of tensors (got {type(state).__name__})")
    return {k: v.detach().to(torch.float32).numpy() for k, v in state.items()}


def check_head(
    tensors: Mapping[str, np.ndarray], where: str = "aesthetic head"
) -> tuple[tuple[jax.Array, jax.Array], ...]:
    """The head's ``(weight (out, in), bias (out,))`` pairs in order, checked.

    The widths are read from the weights (the published head's are ``HEAD_SIZES``); they must chain,
    end in one output, and the keys must be exactly ``layers.{0,2,4,6,7}.{weight,bias}``.

    Args:
      tensors: the head's state dict (``read_head``).
      where: what the errors name (the file).

    Returns:
      Five ``(weight, bias)`` pairs, float32.

    Raises:
      ValueError: naming missing or unexpected keys, or mis-shaped tensors.
    """
    want = {f"layers.{i}.{p}" for i in HEAD_LAYERS for p in ("weight", "bias")}
    missing, unexpected = sorted(want - set(tensors)), sorted(set(tensors) - want)
    if missing or unexpected:
        raise ValueError(
            f"{where}: not the LAION aesthetic head (keys layers.{{0,2,4,6,7}}.weight|bias); "
            f"missing {missing}, unexpected {unexpected}"
        )
    pairs, width = [], None
    for i in HEAD_LAYERS:
        weight, bias = np.asarray(tensors[f"layers.{i}.weight"]), np.asarray(tensors[f"layers.{i}.bias"])
        if weight.ndim != 2 or bias.shape != (weight.shape[0],) or (width is not None and weight.shape[1] != width):
            raise ValueError(
                f"{where}: layers.{i} has weight {weight.shape} and bias {bias.shape}, which do not chain "
                f"(input width {width})"
            )
        width = weight.shape[0]
        pairs.append((jnp.asarray(weight, jnp.float32), jnp.asarray(bias, jnp.float32)))
    if width != 1:
        raise ValueError(f"{where}: the last layer gives {width} outputs, not one rating")
    return tuple(pairs)


def head_score(head: Sequence[tuple[jax.Array, jax.Array]], embeddings: jax.Array) -> jax.Array:
    """The head's rating ``(N,)`` of L2-normalised ``embeddings`` ``(N, D)`` (``x·Wᵀ + b`` per layer, no activations).

    Args:
      head: ``check_head``'s pairs.
      embeddings: ``(N, D)`` unit-norm CLIP image embeddings.

    Returns:
      ``(N,)`` float32 ratings.
    """
    x = jnp.asarray(embeddings, jnp.float32)
    for weight, bias in head:
        x = x @ weight.T + bias
    return x[:, 0]


class AestheticScore:
    """The LAION aesthetic predictor ``reward(artifacts, prompts) -> (B,)``: the head on normalised CLIP image embeddings.

    Args:
      vision: the CLIP vision tower with its projection (ViT-L/14 for the published head).
      head: ``check_head``'s pairs.
      processing: the image preprocessing.

    Raises:
      ValueError: if the head's input width is not the projection's, or the crop is not the tower's size.
    """

    kind = "aesthetic"

    def __init__(
        self, vision: CLIPVisionWithProjection, head: Sequence[tuple[jax.Array, jax.Array]], processing: ImageProcessing
    ):
        config = vision.config
        if head[0][0].shape[1] != config.projection_dim:
            raise ValueError(
                f"the aesthetic head takes {head[0][0].shape[1]}-d embeddings but the CLIP projects to "
                f"{config.projection_dim} (the published head needs CLIP ViT-L/14)"
            )
        if tuple(processing.crop) != (config.image_size, config.image_size):
            raise ValueError(
                f"the preprocessor crops to {tuple(processing.crop)} but the vision tower takes "
                f"{config.image_size}×{config.image_size} images"
            )
        self.config = config
        self.head = tuple(head)
        self.processing = processing
        self._graph, self._params = nnx.split(vision)
        self.__name__ = self.__qualname__ = self.kind

    def __repr__(self) -> str:
        return f"AestheticScore(projection_dim={self.config.projection_dim}, image_size={self.config.image_size})"

    @property
    def vision(self) -> CLIPVisionWithProjection:
        """The CLIP vision tower and projection (a fresh view of the same weights)."""
        return nnx.merge(self._graph, self._params)

    @property
    def weights(self) -> dict[str, Any]:
        """``{"vision": the tower's weights, "head": the head's pairs}``: what the trainers pass to their jitted step."""
        return {"vision": self._params, "head": self.head}

    def bind(self, weights: dict[str, Any]) -> AestheticScore:
        """This reward computing with ``weights`` (tracers inside a jitted step) in place of its own."""
        bound = copy.copy(self)
        bound._params, bound.head = weights["vision"], tuple(weights["head"])
        return bound

    def image_embeddings(self, images: jax.Array) -> jax.Array:
        """L2-normalised CLIP image embeddings ``(N, D)`` of ``images`` ``(N, H, W, 3)`` in [0, 1]."""
        return clip_model.normalize(self.vision(preprocess(images, self.processing)))

    def __call__(self, artifacts: Mapping[str, Any], prompts: Prompts | None = None) -> jax.Array:
        """The predicted rating ``(B,)`` float32 of ``artifacts["image"]`` (or ``["video"]``, frames averaged)."""
        images, t = frames(artifacts)
        scores = head_score(self.head, self.image_embeddings(images))
        return jnp.mean(scores.reshape(-1, t), axis=1)


def load_vision(folder: str | Path, *, dtype: str = "float32") -> CLIPVisionWithProjection:
    """CLIP's vision tower and ``visual_projection`` from a ``CLIPModel`` or ``CLIPVisionModelWithProjection`` folder.

    From a ``CLIPModel`` folder only the ``vision_model.*`` and ``visual_projection.*`` tensors are read.

    Args:
      folder: the CLIP folder (``config.json`` + ``*.safetensors``).
      dtype: the parameter and compute dtype.

    Returns:
      The ``CLIPVisionWithProjection``.

    Raises:
      FileNotFoundError: no ``config.json`` or weights.
      ValueError: a config that is neither.
      hf.KeyMappingError: weights that do not fit the config.
    """
    folder = Path(folder)
    config = hf.read_config(folder)
    kind = config.get("model_type")
    if kind not in ("clip", "clip_vision_model"):
        raise ValueError(
            f"{folder}: config.json model_type must be 'clip' (CLIPModel) or 'clip_vision_model' "
            f"(CLIPVisionModelWithProjection) for the aesthetic reward's CLIP (got {kind!r})"
        )
    sizes = CLIPVisionConfig.from_json(config, dtype=dtype)
    module = nnx.eval_shape(lambda: CLIPVisionWithProjection(sizes, rngs=nnx.Rngs(0)))
    tensors = {
        k: v
        for k, v in hf.read_tensors(folder).items()
        if k.startswith(("vision_model.", "visual_projection.")) and not k.endswith("embeddings.position_ids")
    }
    return hf.load_into(module, tensors, where=str(folder))


def _head_file(folder: Path) -> Path:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".pth", ".safetensors"))
    if len(files) != 1:
        found = ", ".join(p.name for p in files) or "none"
        raise FileNotFoundError(
            f"{folder}: the aesthetic reward needs exactly one head file (*.pth or *.safetensors, e.g. "
            f"sac+logos+ava1-l14-linearMSE.pth) beside its clip/ folder; found {found} (pass head=)"
        )
    return files[0]


def load(
    folder: str | Path,
    *,
    clip: str | Path | None = None,
    head: str | Path | None = None,
    processor: str | Path | None = None,
    dtype: str = "float32",
) -> AestheticScore:
    """The aesthetic reward of a folder laid out as the module docstring says (``clip/`` + one head file).

    Args:
      folder: the reward folder.
      clip: the CLIP folder instead of ``folder/clip``.
      head: the head file instead of the one ``*.pth`` / ``*.safetensors`` in ``folder``.
      processor: a folder whose ``preprocessor_config.json`` to use (default: the CLIP folder's, searched
        with its ``FOLDERS`` sub-folders; none there: ``ImageProcessing.openai`` at the tower's size).
      dtype: the CLIP tower's parameter and compute dtype (the head runs in float32).

    Returns:
      The ``AestheticScore`` reward.

    Raises:
      FileNotFoundError: no such folder, no ``clip/``, not exactly one head file.
      ValueError: a head that is not the LAION layout or does not fit the CLIP; a ``.pth`` without torch.
      hf.KeyMappingError: CLIP weights that do not fit their config.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no aesthetic reward folder {folder}")
    clip_folder = Path(clip) if clip is not None else folder / "clip"
    if not clip_folder.is_dir():
        hint = (
            " (it holds a config.json: put the CLIP in a clip/ sub-folder, the head beside it)"
            if (folder / "config.json").is_file()
            else ""
        )
        raise FileNotFoundError(f"{folder}: no clip/ folder (the CLIP ViT-L/14 the aesthetic head scores){hint}")
    head_path = Path(head) if head is not None else _head_file(folder)
    pairs = check_head(read_head(head_path), where=str(head_path))
    vision = load_vision(clip_folder, dtype=dtype)
    searched = [Path(processor)] if processor is not None else [clip_folder]
    found = next((f / s for f in searched for s in FOLDERS if _has_processor(f / s)), None)
    if found is None and processor is not None:
        raise FileNotFoundError(f"{processor}: no preprocessor_config.json")
    processing = image_processing(found) if found is not None else ImageProcessing.openai(vision.config.image_size)
    return AestheticScore(vision, pairs, processing)
