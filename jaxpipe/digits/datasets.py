"""The digits world's dataset records and how they are batched: ``ImageDataset`` and ``VideoDataset`` (captioned,
labelled arrays with a leading ``N`` axis), ``batches`` (shuffled fixed-size batches for ``jit``) and ``concat``.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["ImageDataset", "VideoDataset", "batches", "check_seed", "concat"]


def check_seed(seed) -> int:
    """The seed of a digits-world draw, checked.

    Args:
      seed: a non-negative int.

    Returns:
      ``seed`` as an int.

    Raises:
      ValueError: naming the seed when it is not a non-negative int.
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int (got {seed!r})")
    return int(seed)


class _Dataset:
    """Common behaviour of the dataset records: length, subsets, field access."""

    def __len__(self) -> int:
        return len(self.caption)

    def fields(self) -> dict[str, object]:
        """Every field by name: arrays with a leading ``N`` axis and ``"caption"`` (a tuple of str)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def take(self, index) -> _Dataset:
        """The samples at ``index`` (ints, a slice or a boolean mask), as the same dataset type."""
        index = np.arange(len(self))[index]
        out = {}
        for name, value in self.fields().items():
            out[name] = tuple(value[i] for i in index) if name == "caption" else value[index]
        return type(self)(**out)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v.shape}" for k, v in self.fields().items() if isinstance(v, np.ndarray))
        return f"{type(self).__name__}(n={len(self)}, {shapes})"


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class ImageDataset(_Dataset):
    """Captioned, attribute-labelled digit images; every array has ``N`` rows.

    The fields are also the keys of the batches ``batches`` yields.

    Attributes:
        image: ``(N, 16, 16, 1)`` float32 in ``[-1, 1]``, background ``-1``.
        caption: ``N`` strings, e.g. ``"seven thick left bright"`` or, with dropped words, ``"seven left"``.
        digit: ``(N,)`` int32, 0..9 (index into ``DIGIT_WORDS``).
        stroke: ``(N,)`` int32, 0 thin / 1 thick.
        position: ``(N,)`` int32, 0 left / 1 center / 2 right.
        brightness: ``(N,)`` int32, 0 dim / 1 bright.
        mentioned: ``(N, 3)`` bool — whether the caption names the stroke, position, brightness.

    The image always shows every attribute; ``mentioned`` says which ones the caption asks for.
    """

    image: np.ndarray
    caption: tuple[str, ...]
    digit: np.ndarray
    stroke: np.ndarray
    position: np.ndarray
    brightness: np.ndarray
    mentioned: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class VideoDataset(_Dataset):
    """Captioned digit videos; every array has ``N`` rows.

    The fields are also the keys of the batches ``batches`` yields.

    Attributes:
        video: ``(N, T, 16, 16, 1)`` float32 in ``[-1, 1]`` (``T = 8`` by default); frame 0 is the
            augmented image (see ``make_videos``).
        caption: ``N`` strings, ``"<digit> moving left|right|up|down"`` or ``"<digit> still"``.
        digit: ``(N,)`` int32, 0..9.
        stroke: ``(N,)`` int32, the first frame's stroke (not captioned).
        position: ``(N,)`` int32, the first frame's position (not captioned).
        brightness: ``(N,)`` int32, the first frame's brightness (not captioned).
        motion: ``(N,)`` int32, index into ``MOTION_NAMES`` (left, right, up, down, still).
    """

    video: np.ndarray
    caption: tuple[str, ...]
    digit: np.ndarray
    stroke: np.ndarray
    position: np.ndarray
    brightness: np.ndarray
    motion: np.ndarray


def batches(
    dataset: ImageDataset | VideoDataset,
    batch_size: int,
    *,
    seed: int,
    epochs: int | None = None,
    tokenizer=None,
    max_len: int = 8,
) -> Iterator[dict[str, object]]:
    """Shuffled fixed-size batches of a dataset, as dicts of NumPy arrays ready for ``jnp.asarray``/``jit``.

    Each epoch is a fresh permutation drawn from ``(seed, epoch)`` (so epoch ``e`` is the same
    whether or not earlier epochs were consumed); the last ``len(dataset) % batch_size`` samples
    of each permutation are dropped, so every batch has exactly ``batch_size`` rows.
    ``epochs=None`` repeats forever.

    Keys are the dataset's fields: ``"image"`` ``(B, 16, 16, 1)`` or ``"video"`` ``(B, T, 16, 16, 1)``,
    the int32 labels ``(B,)`` (``"mentioned"`` ``(B, 3)`` for images), and ``"caption"`` (list of B
    str) — or, given a ``jaxpipe.nn.text.Tokenizer``, ``"ids"`` ``(B, max_len)`` int32 in its place
    (unknown words raise), so every value is an array.

    Args:
        dataset: an ``ImageDataset`` or a ``VideoDataset``.
        batch_size: rows per batch, at most ``len(dataset)``.
        seed: the shuffling seed (non-negative int).
        epochs: the number of epochs (``None``: forever).
        tokenizer: a ``Tokenizer`` to encode the captions with, or ``None`` to keep them as strings.
        max_len: the token rows' length (with a ``tokenizer``).

    Returns:
        An iterator of batches ``{field: (B, ...) array}``.

    Raises:
        ValueError: on a wrong dataset type, a bad ``batch_size``, ``epochs`` or seed (when the iterator
            is first advanced: this is a generator).
    """
    if not isinstance(dataset, (ImageDataset, VideoDataset)):
        raise ValueError(f"dataset must be an ImageDataset or VideoDataset (got {type(dataset).__name__})")
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int (got {batch_size!r})")
    if batch_size > len(dataset):
        raise ValueError(f"batch_size {batch_size} exceeds the dataset's {len(dataset)} samples")
    if epochs is not None and (not isinstance(epochs, numbers.Integral) or epochs < 0):
        raise ValueError(f"epochs must be None (forever) or an int >= 0 (got {epochs!r})")
    seed = check_seed(seed)
    fields = dataset.fields()
    captions = fields.pop("caption")
    ids = tokenizer.encode(captions, max_len, unknown="error") if tokenizer is not None else None
    epoch = 0
    while epochs is None or epoch < epochs:
        order = np.random.default_rng((seed, epoch)).permutation(len(dataset))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            batch = {name: value[index] for name, value in fields.items()}
            if ids is None:
                batch["caption"] = [captions[i] for i in index]
            else:
                batch["ids"] = ids[index]
            yield batch
        epoch += 1


def concat(datasets: Sequence[_Dataset]) -> _Dataset:
    """One dataset holding the samples of several datasets of the same type, in order.

    Args:
        datasets: one or more ``ImageDataset`` or ``VideoDataset``, all of one type.

    Returns:
        A dataset of that type with every sample, dataset by dataset.

    Raises:
        ValueError: if ``datasets`` is empty or mixes types.
    """
    datasets = list(datasets)
    if not datasets or len({type(d) for d in datasets}) != 1:
        raise ValueError("concat needs one or more datasets of the same type")
    fields = [d.fields() for d in datasets]
    out = {}
    for name in fields[0]:
        values = [f[name] for f in fields]
        out[name] = tuple(c for v in values for c in v) if name == "caption" else np.concatenate(values)
    return type(datasets[0])(**out)
