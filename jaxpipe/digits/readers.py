"""Analytic readers of the digits world's attributes: stroke, position and brightness from the pixels.

No learned weights: each reader is one scalar feature of the image and one or two thresholds, so
it cannot share the digit-scorer's blind spots (an RL method that fools the scorer's weights
does not thereby fool a ruler). Images are ``(N, 16, 16, 1)`` float in ``[0, 1]``, background 0
(the generators' output convention; ``digits.load_images``/``augment`` give ``[-1, 1]``: map
them with ``(x + 1) / 2``). Labels are indices into ``digits.ATTRIBUTE_WORDS``.

Features (see ``augment`` in ``jaxpipe.digits.data`` for how the attributes are rendered):

* brightness — ``peak_ink``: the image's maximum ink. Renders are normalised to peak 1 (bright)
  or ``DIM_INK`` = 0.45 (dim), so the peak *is* the attribute.
* position — ``ink_centre``: the midpoint (px from the left edge) of the columns holding the
  central 94% of the ink mass above a floor (``INK_FLOOR`` of the peak: generated images have a
  faint speckled background that would otherwise pull every extent towards the centre) (the 3% and 97% quantiles of the column profile). A left (right)
  digit's box sits 1 px from the left (right) edge, a centred one in the middle; the extent's
  midpoint separates them for narrow and wide digits alike, and the quantiles ignore stray
  low-ink pixels a hard bounding box would follow.
* stroke — ``stroke_width``: ``2 A / P`` with ``A`` the ink area and ``P`` its perimeter, both
  soft (ink relative to the peak; ``P`` is the total variation, horizontal plus vertical). A
  stroke of width ``w`` and length ``L`` has ``A = wL``, ``P ≈ 2L``, so the ratio is ``w`` whatever
  the digit: erosion (thin) and dilation (thick) move it by ~1 px (median 1.48 vs 2.50 px on clean
  renders) while a long 8 and a short 1 at one stroke read alike — unlike raw ink area, which
  is dominated by how much a digit writes.

An image with no ink (peak below ``MIN_INK``) has no readable attribute: every reader gives -1.
The thresholds are ``THRESHOLDS``; ``calibrate()`` recomputes them from clean renders of the
generators' ``"train"`` split with known labels (``readers`` are measured on the ``"heldout"``
split, which calibration never sees).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxpipe.digits import data as digits
from jaxpipe.digits import images as images_

__all__ = [
    "CALIBRATION",
    "INK_FLOOR",
    "MIN_INK",
    "THRESHOLDS",
    "Thresholds",
    "calibrate",
    "check_images",
    "ink_centre",
    "peak_ink",
    "read",
    "read_brightness",
    "read_position",
    "read_stroke",
    "stroke_width",
]

MIN_INK = 0.1
"""Peak ink below which an image is blank (unreadable: -1); a dim digit's peak is ``DIM_INK`` = 0.45."""

INK_FLOOR = 0.2
"""Ink below this fraction of an image's peak is background to the position reader. Clean renders
have a zero background, generated images a faint speckle: RL-trained generators raise it (mean background
ink 0.006 -> 0.015 after 300 DiffusionNFT steps) and, read without a floor, the speckle drags every digit's
extent towards the frame's centre (a right-placed digit's median ink centre fell from 10.6 to 9.3 px, and
read with the floor it is 10.9). Stroke width needs no floor: on the same images it reads as well without
one (measured: 95-98.5% either way)."""

_MASS_QUANTILE = 0.03  # tail of the column-mass profile left out on each side by ``ink_centre``


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The readers' decision thresholds.

    Attributes:
        stroke: ``stroke_width`` (px) above which a digit is thick.
        position: ``(left|center, center|right)`` cuts of ``ink_centre`` (px from the left edge).
        brightness: ``peak_ink`` above which a digit is bright.
    """

    stroke: float
    position: tuple[float, float]
    brightness: float


CALIBRATION = {"split": "train", "seed": 0, "copies": 2}
"""The renders ``calibrate()`` derives the thresholds from (2,876 clean images with known labels)."""

THRESHOLDS = Thresholds(stroke=2.089, position=(6.431, 9.024), brightness=0.671)
"""``calibrate(**CALIBRATION)``, rounded to 3 decimals (reproduced by ``tests/test_readers.py``).

On those renders the classes are separable for position (left ≤ 6.34 < 6.52 ≤ center ≤ 8.81 <
9.24 ≤ right) and brightness (peaks 0.45 vs 1.0; the cut is their geometric mean, as brightness
is a gain); stroke widths overlap a little (thin 1.17–2.25 px, thick 2.00–3.30 px), and the cut
is the least-error one (6 of 2,876 renders on the wrong side).
"""


# ------------------------------------------------------------------------------------------------ input
def check_images(images) -> np.ndarray:
    """``images`` as float64 ``(N, 16, 16)`` ink, or a ValueError saying what is wrong.

    The check is ``digits.images.check``: ``(N, 16, 16, 1)`` arrays, NumPy or JAX, of finite values in
    ``[0, 1]``; the channel axis is dropped and values are clipped to ``[0, 1]``.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The ink, float64 ``(N, 16, 16)`` in ``[0, 1]``.

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    return np.clip(images_.check(images)[..., 0].astype(np.float64), 0.0, 1.0)


# ------------------------------------------------------------------------------------------------ features
def peak_ink(images) -> np.ndarray:
    """The maximum ink of each image: ``(N, 16, 16, 1)`` in [0, 1] -> ``(N,)``.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The peak ink per image, float64 ``(N,)`` in ``[0, 1]``.

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    return check_images(images).max(axis=(1, 2))


def _relative_ink(images) -> np.ndarray:
    """Ink relative to each image's peak, less ``INK_FLOOR`` (background reads 0): ``(N, 16, 16)``."""
    x = check_images(images)
    peak = x.max(axis=(1, 2), keepdims=True)
    return np.maximum(np.where(peak > 0, x / np.maximum(peak, 1e-12), 0.0) - INK_FLOOR, 0.0)


def ink_centre(images) -> np.ndarray:
    """Midpoint of each image's central ink extent, in px from the left edge: ``(N, 16, 16, 1)`` -> ``(N,)``.

    The extent runs from the 3% to the 97% quantile of the column profile of the ink above the
    floor (``INK_FLOOR``; linear within a pixel, pixel ``j`` spanning ``[j, j + 1)``); a blank
    image gives the frame's centre, 8.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The extent's midpoint per image, float64 ``(N,)`` in ``[0, 16]`` px.

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    x = _relative_ink(images)
    columns = x.sum(axis=1)
    total = columns.sum(axis=1, keepdims=True)
    mass = np.where(total > 0, columns / np.maximum(total, 1e-12), 1.0 / x.shape[2])
    cdf = np.cumsum(mass, axis=1)

    def quantile(q: float) -> np.ndarray:
        j = np.argmax(cdf >= q - 1e-12, axis=1)
        rows = np.arange(len(cdf))
        before = np.where(j > 0, cdf[rows, j - 1], 0.0)
        return j + (q - before) / np.maximum(mass[rows, j], 1e-12)

    return 0.5 * (quantile(_MASS_QUANTILE) + quantile(1.0 - _MASS_QUANTILE))


def stroke_width(images) -> np.ndarray:
    """Mean stroke width in px, ``2 · area / perimeter`` of the ink relative to its peak: ``(N, 16, 16, 1)`` -> ``(N,)``.

    Area is ``Σ y`` and perimeter the total variation ``Σ |Δy|`` along rows and columns (the
    frame counts as background), with ``y = ink / peak``; a blank image gives 0.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The stroke width per image, float64 ``(N,)`` in px (0 for a blank image).

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    x = check_images(images)
    peak = x.max(axis=(1, 2), keepdims=True)
    y = np.where(peak > 0, x / np.maximum(peak, 1e-12), 0.0)
    padded = np.pad(y, ((0, 0), (1, 1), (1, 1)))
    perimeter = np.abs(np.diff(padded, axis=1)).sum(axis=(1, 2)) + np.abs(np.diff(padded, axis=2)).sum(axis=(1, 2))
    return np.where(perimeter > 0, 2.0 * y.sum(axis=(1, 2)) / np.maximum(perimeter, 1e-12), 0.0)


# ------------------------------------------------------------------------------------------------ readers
def _unreadable(images, labels: np.ndarray) -> np.ndarray:
    return np.where(peak_ink(images) < MIN_INK, -1, labels).astype(np.int32)


def read_stroke(images, thresholds: Thresholds = THRESHOLDS) -> np.ndarray:
    """Stroke ``(N,)`` int32: 0 thin, 1 thick, -1 blank, for images ``(N, 16, 16, 1)`` in [0, 1].

    A digit is thick where ``stroke_width`` exceeds ``thresholds.stroke``; blank means peak ink below ``MIN_INK``.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).
        thresholds: the decision thresholds (default ``THRESHOLDS``).

    Returns:
        The stroke label per image, int32 ``(N,)``: 0 thin, 1 thick, -1 blank.

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    return _unreadable(images, (stroke_width(images) > thresholds.stroke).astype(np.int32))


def read_position(images, thresholds: Thresholds = THRESHOLDS) -> np.ndarray:
    """Position ``(N,)`` int32: 0 left, 1 center, 2 right, -1 blank, for images ``(N, 16, 16, 1)`` in [0, 1].

    ``ink_centre`` is cut at the two ``thresholds.position`` values; blank means peak ink below ``MIN_INK``.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).
        thresholds: the decision thresholds (default ``THRESHOLDS``).

    Returns:
        The position label per image, int32 ``(N,)``: 0 left, 1 center, 2 right, -1 blank.

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    centre = ink_centre(images)
    lo, hi = thresholds.position
    return _unreadable(images, (centre > lo).astype(np.int32) + (centre > hi))


def read_brightness(images, thresholds: Thresholds = THRESHOLDS) -> np.ndarray:
    """Brightness ``(N,)`` int32: 0 dim, 1 bright, -1 blank, for images ``(N, 16, 16, 1)`` in [0, 1].

    A digit is bright where ``peak_ink`` exceeds ``thresholds.brightness``; blank means peak ink below ``MIN_INK``.

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).
        thresholds: the decision thresholds (default ``THRESHOLDS``).

    Returns:
        The brightness label per image, int32 ``(N,)``: 0 dim, 1 bright, -1 blank.

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    return _unreadable(images, (peak_ink(images) > thresholds.brightness).astype(np.int32))


def read(images, thresholds: Thresholds = THRESHOLDS) -> dict[str, np.ndarray]:
    """All three readers: ``{"stroke"|"position"|"brightness": (N,) int32}`` (-1: blank image).

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).
        thresholds: the decision thresholds (default ``THRESHOLDS``).

    Returns:
        ``{"stroke": read_stroke, "position": read_position, "brightness": read_brightness}`` of the
        images, each int32 ``(N,)`` (indices into that attribute's words; -1: blank image).

    Raises:
        ValueError: if ``images`` is not ``(N, 16, 16, 1)`` floating point, finite, in ``[0, 1]``.
    """
    return {
        "stroke": read_stroke(images, thresholds),
        "position": read_position(images, thresholds),
        "brightness": read_brightness(images, thresholds),
    }


# ------------------------------------------------------------------------------------------------ calibration
def _cut(feature: np.ndarray, positive: np.ndarray) -> float:
    """The threshold ``t`` (predict positive where ``feature > t``) with the fewest training errors.

    Among the least-error cuts it takes the middle of the widest gap between neighbouring
    feature values: for separable classes, the max-margin cut halfway between them.
    """
    order = np.argsort(feature, kind="stable")
    f, pos = feature[order], positive[order].astype(bool)
    # cut i lies between f[i] and f[i + 1]: rows 0..i read negative, the rest positive
    errors = np.cumsum(pos)[:-1] + (np.sum(~pos) - np.cumsum(~pos)[:-1])
    gap = np.diff(f)
    valid = gap > 0
    if not valid.any():
        raise ValueError("calibration needs at least two distinct feature values")
    best = np.flatnonzero(valid & (errors == errors[valid].min()))
    i = best[np.argmax(gap[best])]
    return float(0.5 * (f[i] + f[i + 1]))


def calibrate(*, split: str = "train", seed: int = 0, copies: int = 2) -> Thresholds:
    """Thresholds from clean renders with known labels: ``digits.augment(*load_images(split), seed=seed, copies=copies)``.

    Each binary cut is ``_cut`` of its feature; the position cuts separate left from center (on
    those two classes' renders) and center from right; the brightness cut is taken on
    ``log(peak_ink)`` (brightness is a gain, so the midpoint is geometric). ``calibrate(**CALIBRATION)``
    gives ``THRESHOLDS``.

    Args:
        split: the renders' split of the digits (``"train"``; ``"heldout"`` is kept for measuring the readers).
        seed: the seed of ``digits.augment``'s random attributes.
        copies: augmented copies per digit image.

    Returns:
        The least-error ``Thresholds`` on those renders.

    Raises:
        ValueError: if a feature takes a single value on the renders (no cut exists).
    """
    data = digits.augment(*digits.load_images(split), seed=seed, copies=copies)
    images = (data.image + 1.0) / 2.0
    centre = ink_centre(images)
    p = data.position
    left_center, center_right = p < 2, p > 0
    return Thresholds(
        stroke=_cut(stroke_width(images), data.stroke == 1),
        position=(_cut(centre[left_center], p[left_center] == 1), _cut(centre[center_right], p[center_right] == 2)),
        brightness=float(np.exp(_cut(np.log(np.maximum(peak_ink(images), 1e-6)), data.brightness == 1))),
    )
