"""The digits world: real handwritten digits, captioned attribute augmentation, videos.

This module loads the digits and their splits; the drawing lives in ``rendering`` (``augment``,
``make_videos``, ``translate``), the records and batching in ``datasets``; their names are re-exported here.

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

import functools

import numpy as np

from jaxpipe.digits.captions import (  # noqa: F401  (re-exported: the digits world's vocabulary and captions)
    ATTRIBUTE_WORDS,
    ATTRIBUTES,
    MOTION_NAMES,
    MOTION_PHRASES,
    caption,
    parse_caption,
    split_prompt,
)
from jaxpipe.digits.datasets import ImageDataset, VideoDataset, batches, check_seed, concat
from jaxpipe.digits.rendering import DIM_INK, SIZE, augment, make_videos, resample_matrix, translate

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
    # re-exported from ``datasets`` and ``rendering`` (above) and from ``captions``
    "ATTRIBUTES",
    "ATTRIBUTE_WORDS",
    "MOTION_NAMES",
    "MOTION_PHRASES",
    "caption",
    "parse_caption",
    "split_prompt",
]

SPLITS = ("train", "heldout", "all")
"""The splits ``load_images`` serves: ``"train"`` (the generators'), ``"heldout"`` (the reward model's), ``"all"``."""
HELDOUT_FRACTION = 0.2
"""The share of each digit's samples in the ``"heldout"`` split."""
NUM_DIGITS = 1797
"""The number of digits in scikit-learn's ``load_digits`` (the ``"all"`` split)."""


@functools.lru_cache(maxsize=1)
def _base() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as 16×16 ink in [0, 1] (float32, read-only) and their labels (int32)."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    ink8 = raw.images.astype(np.float32) / 16.0
    up = resample_matrix(SIZE, 8, 2.0, 0.0, 0.0, clamp=True)[0]
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
    return _split(check_seed(seed))[split].copy()


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
