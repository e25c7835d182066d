"""The digits world: real handwritten digits, captioned attribute augmentation, videos.

Data preparation is plain NumPy (seeded ``numpy.random.Generator``\\ s); batches are handed to JAX
as arrays. Pixel convention everywhere: float32 in ``[-1, 1]``, background ``-1``, channels last.

Pipeline::

    images, digits = load_images("train")                 # (N, 16, 16, 1), (N,)
    data = augment(images, digits, seed=0, drop=0.3)      # ImageDataset: image + caption + labels
    vids = make_videos(images, digits, seed=0)            # VideoDataset: video (N, 8, 16, 16, 1) + ...
    for batch in batches(data, 64, seed=0, tokenizer=Tokenizer(VOCABULARY)):
        ...                                               # {"image", "ids", "digit", "stroke", ...}

Source: scikit-learn's ``load_digits`` (1,797 digits, 8×8, values 0..16; ships inside the package).
Each is upsampled to 16×16 by **bilinear** interpolation (half-pixel centres, edge-clamped) — the
8×8 originals are already soft, so bilinear keeps them smooth without the blockiness of nearest
and without a separate smoothing pass. The split into ``"train"`` (generators) and ``"heldout"``
(the reward model) is stratified by digit, 80/20, fixed by ``seed`` (default 0).

Augmentation renders each digit from its 16×16 base in this order:

1. stroke — grayscale erosion (thin) or dilation (thick) with a 3×3 cross at 16×16;
2. placement — the bounding box of the digit's thick version (thin and thick share one box, and
   thick ink never spills past it) is scaled (bilinear) to fit ``height`` × ``width`` (default
   11 × 10 px: digits end up ~11 px tall and ~8 px wide) and placed vertically centred,
   horizontally 1 px from the left edge (left), centred (center) or 1 px from the right edge
   (right): ink centroids differ by ~3 px between positions, and the smaller content is what
   lets a shift move the digit without cutting it;
3. brightness — the ink is normalised to peak 1 and scaled by 1.0 (bright) or 0.45 (dim).

Captions list words in a fixed order: digit, stroke, position, brightness (``"seven thick left
bright"``); attribute words can be dropped at random (``drop=``) to teach partial prompts.
Videos translate an augmented image by whole pixels per frame with background fill (no
wrap-around); captions are ``"seven moving right"``, ``"five still"``.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from jaxpipe.digits.captions import (  # noqa: F401  (re-exported: the digits world's vocabulary and captions)
    ATTRIBUTE_WORDS,
    ATTRIBUTES,
    MOTION_NAMES,
    MOTION_PHRASES,
    _word_index,
    caption,
    parse_caption,
    split_prompt,
)
from jaxpipe.digits.words import BRIGHTNESS, POSITIONS, STROKES

__all__ = [
    "DIM_INK",
    "HELDOUT_FRACTION",
    "NUM_DIGITS",
    "SIZE",
    "SPLITS",
    "ImageDataset",
    "VideoDataset",
    "augment",
    "batches",
    "concat",
    "load_images",
    "make_videos",
    "split_indices",
    "translate",
    # re-exported from ``captions``
    "ATTRIBUTES",
    "ATTRIBUTE_WORDS",
    "MOTION_NAMES",
    "MOTION_PHRASES",
    "caption",
    "parse_caption",
    "split_prompt",
]

SIZE = 16
"""Side of every image and video frame, in pixels."""

SPLITS = ("train", "heldout", "all")
"""The splits ``load_images`` serves: ``"train"`` (the generators'), ``"heldout"`` (the reward model's), ``"all"``."""
HELDOUT_FRACTION = 0.2
"""The share of each digit's samples in the ``"heldout"`` split."""
NUM_DIGITS = 1797
"""The number of digits in scikit-learn's ``load_digits`` (the ``"all"`` split)."""

DIM_INK = 0.45
"""Peak ink of a dim digit (a bright digit's peak ink is 1); ink 0 is background."""

_MOTION_STEP = {0: (0, -1), 1: (0, 1), 2: (-1, 0), 3: (1, 0), 4: (0, 0)}  # motion -> (dy, dx) per unit
_BBOX_THRESHOLD = 0.15  # ink level that counts towards a digit's bounding box
_MARGIN = 1.0  # px between a left/right digit's box and the image edge


# ------------------------------------------------------------------------------------------------ datasets
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


# ------------------------------------------------------------------------------------------------ base images
def _resample_matrix(n_out: int, n_in: int, scale, offset, start, *, clamp: bool = False) -> np.ndarray:
    """Bilinear resampling weights ``(B, n_out, n_in)`` along one axis, one row set per example.

    Output pixel ``i`` (centre ``i + 0.5``) samples the input at ``(i + 0.5 - offset) / scale + start``
    (continuous coordinates, pixel ``j`` spanning ``[j, j + 1)``): the input interval starting at
    ``start`` lands at output coordinate ``offset``, magnified by ``scale``. Samples outside the
    input read 0 (background) unless ``clamp``, which repeats the edge pixels.
    """
    scale, offset, start = (np.asarray(a, np.float64).reshape(-1, 1) for a in (scale, offset, start))
    p = (np.arange(n_out)[None] + 0.5 - offset) / scale + start - 0.5
    if clamp:
        p = np.clip(p, 0.0, n_in - 1.0)
    lo = np.floor(p)
    frac = (p - lo)[..., None]
    j = np.arange(n_in)[None, None]
    lo = lo[..., None]
    return ((j == lo) * (1.0 - frac) + (j == lo + 1) * frac).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _base() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as 16×16 ink in [0, 1] (float32, read-only) and their labels (int32)."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    ink8 = raw.images.astype(np.float32) / 16.0
    up = _resample_matrix(SIZE, 8, 2.0, 0.0, 0.0, clamp=True)[0]
    ink = np.einsum("ij,njk,lk->nil", up, ink8, up).clip(0.0, 1.0).astype(np.float32)
    digits = raw.target.astype(np.int32)
    ink.flags.writeable = digits.flags.writeable = False
    return ink, digits


@functools.lru_cache(maxsize=8)
def _split(seed: int) -> dict[str, np.ndarray]:
    """Sorted sample indices of each split: stratified by digit, ``HELDOUT_FRACTION`` held out."""
    _, digits = _base()
    rng = np.random.default_rng(seed)
    heldout = []
    for d in range(10):
        members = np.flatnonzero(digits == d)
        heldout.append(rng.permutation(members)[: int(round(HELDOUT_FRACTION * len(members)))])
    heldout = np.sort(np.concatenate(heldout))
    train = np.setdiff1d(np.arange(len(digits)), heldout)
    out = {"train": train, "heldout": heldout, "all": np.arange(len(digits))}
    for value in out.values():
        value.flags.writeable = False
    return out


def _check_seed(seed) -> int:
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int (got {seed!r})")
    return int(seed)


def split_indices(split: str = "train", seed: int = 0) -> np.ndarray:
    """Indices ``(N,)`` into scikit-learn's ``load_digits`` of one split (sorted, int64).

    ``"train"`` (1,438 digits) and ``"heldout"`` (359) are disjoint and together are ``"all"`` (1,797).

    Args:
        split: one of ``SPLITS``.
        seed: fixes the split (non-negative int); only splits made with one seed are disjoint.

    Returns:
        The sorted indices, int64 ``(N,)`` (a fresh copy).

    Raises:
        ValueError: on an unknown split or a negative or non-int seed.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return _split(_check_seed(seed))[split].copy()


def load_images(split: str = "train", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The digits of one split, upsampled: ``images (N, 16, 16, 1)`` float32 in ``[-1, 1]`` and ``digits (N,)`` int32.

    ``split``: ``"train"`` (generators train on it, N = 1,438), ``"heldout"`` (the reward model trains
    on it, N = 359) or ``"all"`` (1,797). ``seed`` fixes the split — keep the default (or use the
    same value for both splits), since only splits made with one seed are disjoint. Fast after the
    first call (the upsampled arrays are cached); the returned arrays are fresh copies.

    Args:
        split: one of ``SPLITS``.
        seed: fixes the split (non-negative int).

    Returns:
        ``images (N, 16, 16, 1)`` float32 in ``[-1, 1]`` (background -1) and ``digits (N,)`` int32.

    Raises:
        ValueError: on an unknown split or a negative or non-int seed.
    """
    index = split_indices(split, seed)
    ink, digits = _base()
    return (ink[index, :, :, None] * 2.0 - 1.0).astype(np.float32), digits[index].copy()


# ------------------------------------------------------------------------------------------------ augmentation
def _check_images(images, labels) -> tuple[np.ndarray, np.ndarray]:
    images = np.asarray(images, np.float32)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[1:] != (SIZE, SIZE, 1):
        raise ValueError(f"images must have shape (N, {SIZE}, {SIZE}, 1) or (N, {SIZE}, {SIZE}) (got {images.shape})")
    labels = np.asarray(labels)
    if labels.shape != images.shape[:1]:
        raise ValueError(f"labels must have shape ({images.shape[0]},) to match the images (got {labels.shape})")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() > 9):
        raise ValueError("labels must be integer digits in 0..9")
    if not len(images):
        raise ValueError("no images given")
    return images, labels.astype(np.int32)


def _labels(kind: str, words: Sequence[str], value, n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n,)`` int32 labels: drawn uniformly (always drawn, so fixing one attribute leaves the others' draws alone)."""
    drawn = rng.integers(0, len(words), n).astype(np.int32)
    if value is None:
        return drawn
    if isinstance(value, (str, numbers.Integral)):
        return np.full(n, _word_index(kind, words, value), np.int32)
    value = np.asarray(value)
    if value.shape != (n,):
        raise ValueError(f"{kind} must be None, one label, or an array of shape ({n},) (got shape {value.shape})")
    if value.dtype.kind in "US":
        return np.array([_word_index(kind, words, str(v)) for v in value], np.int32)
    if not np.issubdtype(value.dtype, np.integer) or value.min() < 0 or value.max() >= len(words):
        raise ValueError(f"{kind} labels must be ints in 0..{len(words) - 1} ({', '.join(words)})")
    return value.astype(np.int32)


def _drop_probs(drop) -> np.ndarray:
    if isinstance(drop, Mapping):
        unknown = set(drop) - set(ATTRIBUTES)
        if unknown:
            raise ValueError(f"drop has unknown attribute(s) {sorted(unknown)}; allowed: {', '.join(ATTRIBUTES)}")
        probs = np.array([float(drop.get(a, 0.0)) for a in ATTRIBUTES])
    else:
        probs = np.full(len(ATTRIBUTES), float(drop))
    if not np.all((probs >= 0.0) & (probs <= 1.0)):
        raise ValueError(f"drop probabilities must be in [0, 1] (got {drop!r})")
    return probs


def _draw(ink: np.ndarray, stroke, position, brightness, height: float, width: float) -> np.ndarray:
    """Ink ``(N, 16, 16)`` in [0, 1] -> augmented ink ``(N, 16, 16)``: stroke, placement, brightness."""
    from scipy import ndimage

    n = len(ink)
    # 1. stroke, on a 1-px padded canvas so dilation at the border is not cut.
    padded = np.pad(ink, ((0, 0), (1, 1), (1, 1)))
    cross = np.zeros((1, 3, 3), bool)
    cross[0] = ndimage.generate_binary_structure(2, 1)
    thick = stroke == 1
    stroked = np.empty_like(padded)
    stroked[thick] = ndimage.grey_dilation(padded[thick], footprint=cross)
    stroked[~thick] = ndimage.grey_erosion(padded[~thick], footprint=cross)
    # 2. placement: the bounding box of the *thick* version of the ink (so either stroke fits the
    #    same box and thick ink never spills past it) is scaled to fit height x width and placed.
    thick_ink = stroked if thick.all() else ndimage.grey_dilation(padded, footprint=cross)
    mask = thick_ink > _BBOX_THRESHOLD
    rows, cols = mask.any(2), mask.any(1)
    empty = ~rows.any(1)
    rows[empty], cols[empty] = True, True  # a blank image keeps the full frame
    full = SIZE + 2
    r0, r1 = rows.argmax(1), full - rows[:, ::-1].argmax(1)
    c0, c1 = cols.argmax(1), full - cols[:, ::-1].argmax(1)
    scale = np.minimum(height / (r1 - r0), width / (c1 - c0))
    box_h, box_w = (r1 - r0) * scale, (c1 - c0) * scale
    top = (SIZE - box_h) / 2.0
    left = np.select(
        [position == 0, position == 1], [np.full(n, _MARGIN), (SIZE - box_w) / 2.0], SIZE - _MARGIN - box_w
    )
    rows_m = _resample_matrix(SIZE, full, scale, top, r0)
    cols_m = _resample_matrix(SIZE, full, scale, left, c0)
    placed = np.einsum("nij,njk,nlk->nil", rows_m, stroked, cols_m)
    # 3. brightness: peak ink 1 (bright) or DIM_INK (dim).
    peak = placed.max(axis=(1, 2), keepdims=True)
    placed = placed / np.maximum(peak, 1e-6)
    level = np.where(brightness == 1, 1.0, DIM_INK).astype(np.float32)
    return (placed.clip(0.0, 1.0) * level[:, None, None]).astype(np.float32)


def augment(
    images,
    labels,
    *,
    seed: int,
    stroke=None,
    position=None,
    brightness=None,
    drop: float | Mapping[str, float] = 0.0,
    copies: int = 1,
    height: float = 11.0,
    width: float = 10.0,
) -> ImageDataset:
    """Captioned attribute augmentation of 16×16 digits.

    Args:
        images: ``(N, 16, 16, 1)`` (or ``(N, 16, 16)``) in ``[-1, 1]``, e.g. from ``load_images``.
        labels: ``(N,)`` digits 0..9.
        seed: the augmentation's seed (same seed ⇒ identical arrays and captions).
        stroke: ``None`` draws each sample's label uniformly; one label (int or word, e.g. ``"thick"``) or an
            ``(N * copies,)`` array (ints or words) fixes them.
        position: as ``stroke`` (``"left"``, ``"center"``, ``"right"``).
        brightness: as ``stroke`` (``"dim"``, ``"bright"``).
        drop: probability that a caption leaves out an attribute word — one float for all three, or
            ``{"stroke": p, "position": p, "brightness": p}`` (missing keys: 0). The digit word is kept.
        copies: augmented samples per input image (each with its own draws), rows ``k*N .. (k+1)*N - 1``
            hold copy ``k``.
        height: the height (px) of the box each digit's ink is scaled to fit before placement, in ``(0, 16]``.
        width: the box's width (px), in ``(0, 14]``.

    Returns:
        ``ImageDataset`` of ``N * copies`` samples: ``image (N*copies, 16, 16, 1)`` float32 in ``[-1, 1]``,
        captions, and the int32 labels digit/stroke/position/brightness plus ``mentioned``.

    Raises:
        ValueError: on images or labels of the wrong shape or range, a bad seed, ``copies``, box size,
            ``drop`` or attribute label.
    """
    images, labels = _check_images(images, labels)
    seed = _check_seed(seed)
    if not isinstance(copies, numbers.Integral) or copies < 1:
        raise ValueError(f"copies must be an int >= 1 (got {copies!r})")
    if not (0 < width <= SIZE - 2 * _MARGIN and 0 < height <= SIZE):
        raise ValueError(
            f"height must be in (0, {SIZE}] and width in (0, {SIZE - 2 * _MARGIN:g}] (got {height}, {width})"
        )
    probs = _drop_probs(drop)
    ink = np.tile((images[..., 0] + 1.0) / 2.0, (copies, 1, 1)).clip(0.0, 1.0)
    digit = np.tile(labels, copies)
    n = len(digit)
    rng = np.random.default_rng(seed)
    stroke = _labels("stroke", STROKES, stroke, n, rng)
    position = _labels("position", POSITIONS, position, n, rng)
    brightness = _labels("brightness", BRIGHTNESS, brightness, n, rng)
    mentioned = rng.random((n, len(ATTRIBUTES))) >= probs
    image = _draw(ink, stroke, position, brightness, height, width) * 2.0 - 1.0
    attributes = zip(stroke.tolist(), position.tolist(), brightness.tolist())
    captions = tuple(
        caption(d, *(v if m else None for v, m in zip(values, keep)))
        for d, values, keep in zip(digit.tolist(), attributes, mentioned)
    )
    return ImageDataset(image[..., None].astype(np.float32), captions, digit, stroke, position, brightness, mentioned)


# ------------------------------------------------------------------------------------------------ videos
def translate(images, dy, dx, *, fill: float = -1.0) -> np.ndarray:
    """Shift images ``(..., H, W, C)`` by whole pixels (``dy`` down, ``dx`` right), filling with ``fill``.

    No wrap-around: what leaves the frame is gone, what enters is background.

    Args:
        images: ``(..., H, W, C)`` arrays.
        dy: rows to shift down (negative: up).
        dx: columns to shift right (negative: left).
        fill: the value of the pixels that enter (``-1``: background in ``[-1, 1]`` images).

    Returns:
        The shifted images, shaped and typed like ``images`` (all ``fill`` when the shift is the frame's size or more).
    """
    images = np.asarray(images)
    dy, dx = int(dy), int(dx)
    out = np.full_like(images, fill)
    h, w = images.shape[-3], images.shape[-2]
    if abs(dy) >= h or abs(dx) >= w:
        return out
    src_y, dst_y = slice(max(-dy, 0), h - max(dy, 0)), slice(max(dy, 0), h - max(-dy, 0))
    src_x, dst_x = slice(max(-dx, 0), w - max(dx, 0)), slice(max(dx, 0), w - max(-dx, 0))
    out[..., dst_y, dst_x, :] = images[..., src_y, src_x, :]
    return out


def make_videos(
    images,
    labels,
    *,
    seed: int,
    motion=None,
    stroke=None,
    position=None,
    brightness=None,
    frames: int = 8,
    speed: int = 1,
    lead: int | None = None,
    height: float = 11.0,
    width: float = 10.0,
) -> VideoDataset:
    """Videos of digits moving left, right, up, down or standing still, captioned ``"seven moving right"``.

    Frame 0 is an augmented image (``augment`` with the same stroke/position/brightness labels);
    frame ``t`` is frame 0 shifted ``t * speed`` whole pixels in the motion's direction, background
    filling in behind (no wrap-around). To keep the digit in the frame: when ``position`` is not
    given, a digit moving right starts ``left`` and one moving left starts ``right`` (up/down/still:
    any position), which leaves room for the default 7 px of travel; a digit moving up (down)
    starts ``lead`` px below (above) the vertical centre — frame 0 is then the augmented image
    shifted by ``lead`` px — so its path is centred on the frame. With the defaults (11-px digit
    box, 7 px of travel, ``lead`` 3) a vertical mover loses at most a row or two at the edge in
    its first and last frames; horizontal movers are not cut.

    Args:
        images: ``(N, 16, 16, 1)`` (or ``(N, 16, 16)``) in ``[-1, 1]``, e.g. from ``load_images``.
        labels: ``(N,)`` digits 0..9.
        seed: same seed ⇒ identical videos and captions.
        motion: ``None`` (uniform over ``MOTION_NAMES``), one motion (index or name) or an ``(N,)`` array.
        stroke: as in ``augment`` (not captioned; recorded as labels).
        position: as in ``augment``; ``None`` starts horizontal movers on the side they move away from.
        brightness: as in ``augment``.
        frames: frames per video (``T``), at least 1.
        speed: whole pixels moved per frame, at least 0.
        lead: vertical head start (px) of up/down movers; ``None``: half the travel, ``(frames - 1) * speed // 2``.
        height: as in ``augment``.
        width: as in ``augment``.

    Returns:
        ``VideoDataset``: ``video (N, T, 16, 16, 1)`` float32 in ``[-1, 1]``, captions, int32 labels.

    Raises:
        ValueError: on bad images, labels, seed, motion or attribute labels, or a ``frames``, ``speed`` or
            ``lead`` that is not an int in range.
    """
    images, labels = _check_images(images, labels)
    seed = _check_seed(seed)
    for name, value, low in (("frames", frames, 1), ("speed", speed, 0), ("lead", lead, 0)):
        if (value is not None or name != "lead") and (
            not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low
        ):
            raise ValueError(f"{name} must be an int >= {low} (got {value!r})")
    lead = (frames - 1) * speed // 2 if lead is None else int(lead)
    n = len(labels)
    rng = np.random.default_rng(seed)
    motion = _labels("motion", MOTION_NAMES, motion, n, rng)
    if position is None:  # start on the side the digit moves away from
        drawn = rng.integers(0, len(POSITIONS), n).astype(np.int32)
        position = np.select([motion == 0, motion == 1], [np.full(n, 2), np.full(n, 0)], drawn).astype(np.int32)
    sub_seed = int(rng.integers(0, 2**31))
    first = augment(
        images,
        labels,
        seed=sub_seed,
        stroke=stroke,
        position=position,
        brightness=brightness,
        height=height,
        width=width,
    )
    video = np.empty((n, frames, SIZE, SIZE, 1), np.float32)
    for m, (step_y, step_x) in _MOTION_STEP.items():
        sel = motion == m
        start_y = {2: lead, 3: -lead}.get(m, 0)
        for t in range(frames):
            video[sel, t] = translate(first.image[sel], start_y + step_y * speed * t, step_x * speed * t)
    captions = tuple(caption(d, motion=m) for d, m in zip(labels.tolist(), motion.tolist()))
    return VideoDataset(video, captions, labels, first.stroke, first.position, first.brightness, motion)


# ------------------------------------------------------------------------------------------------ batches
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
    seed = _check_seed(seed)
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
