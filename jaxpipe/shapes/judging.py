"""The analytic judge of the shapes world: objects read from the pixels, checked against what a prompt asks.

``detect(image)`` labels each pixel with its nearest palette colour (or the background; a pixel farther
than ``COLOUR_RADIUS`` from every colour is background) and splits each colour's well-covered pixels into
8-connected components. Around each, it reads how much of every pixel the colour covers (an anti-aliased
edge is a blend of colour and background), drops specks covering less than ``MIN_AREA`` of a small
circle, and reads the shape as the template (circle, square, triangle, each of the component's area and
centroid) whose coverage overlaps it best, the size from that template's radius and the position from
the centroid. ``judge(image, prompt)`` matches the prompt's things to the objects found
and returns the named checks; ``correct(checks, category)`` is GenEval's all-right verdict for a
category, ``score(checks)`` the fraction of checks passed (a reward in ``[0, 1]``).

It is exact on the world's own renders wherever objects do not touch (measured: ``jaxpipe.shapes.judge_accuracy``);
it shares no weights with anything trained.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scipy import ndimage

from jaxpipe.shapes.grammar import Prompt
from jaxpipe.shapes.scenes import RADIUS, SPEED, SQUARE
from jaxpipe.shapes.words import BACKGROUND, COLOURS, PALETTE, SHAPES, SIZES

__all__ = [
    "COLOUR_RADIUS",
    "MIN_AREA",
    "Detection",
    "detect",
    "checks_of",
    "judge",
    "judge_video",
    "correct",
    "score",
    "CHECKED",
]

COLOUR_RADIUS = 0.35
"""A pixel belongs to a colour only within this RGB distance of it (pixels in ``[0, 1]``)."""
MIN_AREA = 0.2
"""Components smaller than this fraction of a small circle's area are specks, not objects."""
CHECKED = {
    "single_object": ("count", "shape"),
    "two_object": ("count", "shape"),
    "counting": ("count", "shape"),
    "colors": ("count", "shape", "colour"),
    "color_attr": ("count", "shape", "colour"),
    "position": ("count", "shape", "colour", "relation"),
    "video": ("count", "shape", "colour", "motion"),
}
"""The checks each category's verdict needs (``counting`` and ``two_object`` do not judge colours, as GenEval)."""

_PIXELS = np.asarray((*PALETTE, BACKGROUND), np.float32)
_SIZE_SPLIT = (RADIUS["small"] + RADIUS["big"]) / 2


@dataclasses.dataclass(frozen=True)
class Detection:
    """One object found: ``shape``, ``colour`` and ``size`` words, centroid ``(x, y)`` (canvas fractions),
    ``area`` (pixels covered) and ``fit`` (the best template's soft intersection over union)."""

    shape: str
    colour: str
    size: str
    x: float
    y: float
    area: float
    fit: float


def _coverage(pixels: np.ndarray, c: int) -> np.ndarray:
    """How much of each pixel colour ``c`` covers, ``(H, W)`` in ``[0, 1]``: the pixel's position on the line from
    the background to the colour (an anti-aliased edge is a blend of the two), 0 off that line."""
    ink, paper = _PIXELS[c], _PIXELS[-1]
    direction = ink - paper
    t = np.clip((pixels - paper) @ direction / (direction @ direction), 0.0, 1.0)
    off = np.linalg.norm(pixels - (paper + t[..., None] * direction), axis=-1)
    return np.where(off < COLOUR_RADIUS / 2, t, 0.0)


def _template(shape: str, radius: float, cx: float, cy: float, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Coverage of pixels ``rows x cols`` (pixel units) by ``shape`` of ``radius`` centred at ``(cx, cy)``, 4 x 4 supersampled."""
    offsets = (np.arange(4) + 0.5) / 4
    ys = (rows[:, None] + offsets).reshape(-1) - cy
    xs = (cols[:, None] + offsets).reshape(-1) - cx
    gx, gy = np.meshgrid(xs, ys)
    if shape == "circle":
        inside = gx * gx + gy * gy <= radius * radius
    elif shape == "square":
        inside = np.maximum(np.abs(gx), np.abs(gy)) <= radius * SQUARE
    else:
        inside = (gy <= radius) & (np.abs(gx) <= (gy + radius) / 2) & (gy >= -radius)
    return inside.reshape(len(rows), 4, len(cols), 4).mean(axis=(1, 3))


_AREA = {"circle": np.pi, "square": 4 * SQUARE**2, "triangle": 2.0}  # area / radius² of each shape
_LIFT = {"circle": 0.0, "square": 0.0, "triangle": 1 / 3}  # centroid below the box centre, in radii


def detect(image: np.ndarray) -> list[Detection]:
    """The objects in one image, largest first.

    Args:
        image: ``(H, W, 3)`` in ``[0, 1]`` (a render or a card's output).

    Returns:
        The ``Detection`` of each coloured component at least ``MIN_AREA`` of a small circle.

    Raises:
        ValueError: if ``image`` is not ``(H, W, 3)``.
    """
    image = np.asarray(image, np.float32)
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"detect reads one RGB image (H, W, 3); got shape {image.shape}")
    height, width, _ = image.shape
    pixels = image
    distance = np.linalg.norm(pixels[:, :, None, :] - _PIXELS, axis=-1)
    label = np.argmin(distance, axis=-1)
    label[np.min(distance, axis=-1) > COLOUR_RADIUS] = len(PALETTE)
    min_area = MIN_AREA * np.pi * (RADIUS["small"] * height) ** 2
    found = []
    for c, colour in enumerate(COLOURS):
        coverage = _coverage(pixels, c)
        cores, _ = ndimage.label((label == c) & (coverage > 0.5), structure=np.ones((3, 3), bool))
        for index, box in enumerate(ndimage.find_objects(cores), start=1):
            r0, r1 = max(box[0].start - 2, 0), min(box[0].stop + 2, height)
            c0, c1 = max(box[1].start - 2, 0), min(box[1].stop + 2, width)
            near = ndimage.binary_dilation(cores[r0:r1, c0:c1] == index, np.ones((3, 3), bool))
            soft = coverage[r0:r1, c0:c1] * near
            area = float(soft.sum())
            if area < min_area:
                continue
            rows, cols = np.arange(r0, r1), np.arange(c0, c1)
            cy = float((soft.sum(axis=1) * (rows + 0.5)).sum() / area)
            cx = float((soft.sum(axis=0) * (cols + 0.5)).sum() / area)
            fits = {}
            for shape in SHAPES:
                radius = np.sqrt(area / _AREA[shape])
                template = _template(shape, radius, cx, cy - _LIFT[shape] * radius, rows, cols)
                fits[shape] = float(np.minimum(soft, template).sum() / max(np.maximum(soft, template).sum(), 1e-6))
            shape = max(fits, key=fits.get)
            radius = np.sqrt(area / _AREA[shape]) / height
            found.append(
                Detection(
                    shape,
                    colour,
                    SIZES[int(radius > _SIZE_SPLIT)],
                    cx / width,
                    cy / height,
                    round(area, 2),
                    fits[shape],
                )
            )
    return sorted(found, key=lambda d: -d.area)


def _relation(a: Detection, b: Detection, relation: str) -> bool:
    dx, dy = a.x - b.x, a.y - b.y
    along, across = {"left": (-dx, dy), "right": (dx, dy), "above": (-dy, dx), "below": (dy, dx)}[relation]
    return along > 0 and abs(across) < along


def _matches(things, detections, colour: bool):
    """The assignment of things to distinct detections that matches the most (shape, and colour if asked)."""
    best, best_hits = None, -1
    for chosen in itertools.permutations(range(len(detections)), min(len(things), len(detections))):
        hits = sum(
            d.shape == t.shape and (not colour or d.colour == t.colour)
            for t, d in zip(things, (detections[i] for i in chosen))
        )
        if hits > best_hits:
            best, best_hits = chosen, hits
    return best or (), best_hits


def judge(image: np.ndarray, prompt: Prompt) -> dict[str, bool]:
    """The named checks of ``image`` against ``prompt``: ``count`` (as many objects as the prompt names),
    ``shape`` (every thing's shape found, each on its own object), ``colour`` (every thing found with its
    colour and shape) and, for a position prompt, ``relation`` (the two things so found stand as told).

    Args:
        image: ``(H, W, 3)`` in ``[0, 1]``.
        prompt: what it should show.

    Returns:
        ``{check: passed}``.
    """
    return checks_of(detect(image), prompt)


def checks_of(found: list[Detection], prompt: Prompt) -> dict[str, bool]:
    """``judge``'s checks from an image's detections (``detect``), for reading both rules off one detection pass.

    Args:
        found: the image's detections.
        prompt: what it should show.

    Returns:
        ``{check: passed}``.
    """
    things = prompt.things
    if len(found) > 6:  # noise, not a picture: nothing to match (and the permutations stay few)
        found = found[:6]
    checks = {"count": len(found) == len(things), "shape": _matches(things, found, False)[1] == len(things)}
    chosen, hits = _matches(things, found, True)
    checks["colour"] = hits == len(things)
    if prompt.relation is not None:
        checks["relation"] = checks["colour"] and _relation(found[chosen[0]], found[chosen[1]], prompt.relation)
    return checks


def judge_video(video: np.ndarray, prompt: Prompt) -> dict[str, bool]:
    """The checks of a video against a video prompt: the image checks on the first and on the last frame,
    and ``motion``: each thing (found by colour and shape in both) moved at least half the way told between
    them along its direction and less than that across it (``still``: less than half the way in total).

    Args:
        video: ``(T, H, W, 3)`` in ``[0, 1]``, ``T >= 2``.
        prompt: a ``"video"`` prompt.

    Returns:
        ``{check: passed}`` (``count``, ``shape``, ``colour`` hold in both frames).

    Raises:
        ValueError: if ``video`` is not ``(T, H, W, 3)`` with ``T >= 2``.
    """
    video = np.asarray(video)
    if video.ndim != 4 or video.shape[0] < 2:
        raise ValueError(f"judge_video reads a (T >= 2, H, W, 3) video; got shape {video.shape}")
    first, last = detect(video[0]), detect(video[-1])
    a, b = checks_of(first, prompt), checks_of(last, prompt)
    checks = {name: a[name] and b[name] for name in a}
    travel = SPEED * (video.shape[0] - 1)
    moved = checks["colour"]
    if moved:
        start, _ = _matches(prompt.things, first, True)
        end, _ = _matches(prompt.things, last, True)
        for thing, i, j in zip(prompt.things, start, end):
            dx, dy = last[j].x - first[i].x, last[j].y - first[i].y
            if thing.motion in (None, "still"):
                moved &= np.hypot(dx, dy) < travel / 2
            else:
                along, across = {"left": (-dx, dy), "right": (dx, dy), "up": (-dy, dx), "down": (dy, dx)}[thing.motion]
                moved &= along > travel / 2 and abs(across) < travel / 2
    checks["motion"] = bool(moved)
    return checks


def correct(checks: dict[str, bool], category: str) -> bool:
    """GenEval's verdict: whether every check ``category`` needs (``CHECKED``) passed.

    Args:
        checks: ``judge``'s (or ``judge_video``'s) checks.
        category: one of ``CHECKED``.

    Returns:
        Whether the image is right for its category.
    """
    return all(checks[name] for name in CHECKED[category] if name in checks)


def score(checks: dict[str, bool]) -> float:
    """The fraction of ``checks`` passed: a partial-credit reward.

    Args:
        checks: ``judge``'s (or ``judge_video``'s) checks.

    Returns:
        The fraction, in ``[0, 1]``.
    """
    return float(np.mean(list(checks.values())))
