"""How the digits world draws its images and videos: stroke, placement and brightness of a 16×16 digit
(``augment``), whole-pixel shifts (``translate``) and moving digits (``make_videos``).

Plain NumPy with seeded generators; pixels are float32 in ``[-1, 1]``, background ``-1``, channels last
(the steps are described in ``jaxpipe.digits.data``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from jaxpipe.digits.captions import ATTRIBUTES, MOTION_NAMES, _word_index, caption
from jaxpipe.digits.datasets import ImageDataset, VideoDataset, check_seed
from jaxpipe.digits.words import BRIGHTNESS, POSITIONS, STROKES

__all__ = ["DIM_INK", "SIZE", "augment", "make_videos", "resample_matrix", "translate"]

SIZE = 16
"""Side of every image and video frame, in pixels."""

DIM_INK = 0.45
"""Peak ink of a dim digit (a bright digit's peak ink is 1); ink 0 is background."""

_MOTION_STEP = {0: (0, -1), 1: (0, 1), 2: (-1, 0), 3: (1, 0), 4: (0, 0)}  # motion -> (dy, dx) per unit
_BBOX_THRESHOLD = 0.15  # ink level that counts towards a digit's bounding box
_MARGIN = 1.0  # px between a left/right digit's box and the image edge


def resample_matrix(n_out: int, n_in: int, scale, offset, start, *, clamp: bool = False) -> np.ndarray:
    """Bilinear resampling weights ``(B, n_out, n_in)`` along one axis, one row set per example.

    Output pixel ``i`` (centre ``i + 0.5``) samples the input at ``(i + 0.5 - offset) / scale + start``
    (continuous coordinates, pixel ``j`` spanning ``[j, j + 1)``): the input interval starting at
    ``start`` lands at output coordinate ``offset``, magnified by ``scale``. Samples outside the
    input read 0 (background) unless ``clamp``, which repeats the edge pixels.

    Args:
      n_out: output pixels.
      n_in: input pixels.
      scale: the magnification, one or ``(B,)``.
      offset: where the input interval lands (output px), one or ``(B,)``.
      start: the input coordinate of that interval's start, one or ``(B,)``.
      clamp: repeat the edge pixels instead of reading background outside the input.

    Returns:
      The weights, float32 ``(B, n_out, n_in)``.
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
    rows_m = resample_matrix(SIZE, full, scale, top, r0)
    cols_m = resample_matrix(SIZE, full, scale, left, c0)
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
    seed = check_seed(seed)
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
    seed = check_seed(seed)
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
