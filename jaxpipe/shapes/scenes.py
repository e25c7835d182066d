"""Scenes of the shapes world and their anti-aliased rendering: objects on a dark canvas, still or moving.

Coordinates are fractions of the canvas side (``x`` right, ``y`` down, both in ``[0, 1]``), so one scene
renders at any resolution. An object's ``extent`` is the half-side of the box it fills: a circle of radius
``r``, a square of half-side ``0.85 r``, an upright triangle of apex ``(x, y - r)`` and base ``y + r``.
Pixels are the supersampled (``4 x 4`` per pixel) coverage of each object, so edges are anti-aliased;
the canvas is ``BACKGROUND``, every object its ``PALETTE`` colour, pixels in ``[0, 1]`` (as cards output
images; the pretraining maps them to the autoencoder's ``[-1, 1]``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxpipe import validate
from jaxpipe.shapes.words import BACKGROUND, COLOURS, MOTIONS, PALETTE, SHAPES, SIZES

__all__ = [
    "RADIUS",
    "SQUARE",
    "SPEED",
    "GAP",
    "Obj",
    "Scene",
    "extent",
    "render",
    "render_video",
    "separated",
    "inside",
]

RADIUS = {"small": 0.11, "big": 0.17}
"""The radius of each size, as a fraction of the canvas side."""
SQUARE = 0.85
"""A square's half-side, as a fraction of its radius (so it looks about as large as the circle)."""
SPEED = 0.035
"""How far a moving object travels per frame, as a fraction of the canvas side."""
GAP = 0.05
"""The smallest gap between two objects' boxes (a canvas fraction: 1.6 pixels at 32): objects never touch."""

_STEP = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0), "still": (0.0, 0.0)}


@dataclasses.dataclass(frozen=True)
class Obj:
    """One object: its ``shape``, ``colour`` and ``size`` words, its centre ``(x, y)`` in the first frame
    (canvas fractions) and its ``motion`` (a ``MOTIONS`` word; ``"still"`` for images).

    Raises:
        ValueError: on an unknown word.
    """

    shape: str
    colour: str
    size: str
    x: float
    y: float
    motion: str = "still"

    def __post_init__(self):
        for name, words in (("shape", SHAPES), ("colour", COLOURS), ("size", SIZES), ("motion", MOTIONS)):
            value = getattr(self, name)
            validate.rule(value in words, f"unknown {name} {value!r}; choose from {', '.join(words)}")

    def at(self, frame: int) -> tuple[float, float]:
        """The centre ``(x, y)`` in frame ``frame`` (it moves ``SPEED`` per frame along its motion)."""
        dx, dy = _STEP[self.motion]
        return self.x + dx * SPEED * frame, self.y + dy * SPEED * frame


@dataclasses.dataclass(frozen=True)
class Scene:
    """The objects of one image or video, drawn in order."""

    objects: tuple[Obj, ...]


def extent(obj: Obj) -> float:
    """The half-side of the box ``obj`` fills.

    Args:
        obj: the object.

    Returns:
        The half-side, a canvas fraction.
    """
    radius = RADIUS[obj.size]
    return radius * SQUARE if obj.shape == "square" else radius


def inside(obj: Obj, frames: int = 1, margin: float = 0.02) -> bool:
    """Whether ``obj``'s box stays ``margin`` inside the canvas in each of ``frames`` frames.

    Args:
        obj: the object (it moves along its motion).
        frames: the frames checked (0 .. frames - 1).
        margin: the smallest distance to the canvas edge, a canvas fraction.

    Returns:
        Whether it stays inside.
    """
    e = extent(obj) + margin
    return all(e <= c <= 1 - e for t in range(frames) for c in obj.at(t))


def separated(a: Obj, b: Obj, frames: int = 1, gap: float = GAP) -> bool:
    """Whether the boxes of ``a`` and ``b`` are at least ``gap`` apart (along x or y) in each of ``frames`` frames.

    Args:
        a: one object.
        b: the other.
        frames: the frames checked (both move along their motions).
        gap: the smallest gap, a canvas fraction (negative: the boxes may overlap by that much).

    Returns:
        Whether they stay apart.
    """
    reach = extent(a) + extent(b) + gap
    for t in range(frames):
        (ax, ay), (bx, by) = a.at(t), b.at(t)
        if abs(ax - bx) < reach and abs(ay - by) < reach:
            return False
    return True


def _coverage(obj: Obj, center: tuple[float, float], xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Boolean mask of the supersampled points ``(xs, ys)`` (canvas fractions) inside ``obj`` centred at ``center``."""
    dx, dy = xs - center[0], ys - center[1]
    r = RADIUS[obj.size]
    if obj.shape == "circle":
        return dx * dx + dy * dy <= r * r
    if obj.shape == "square":
        return np.maximum(np.abs(dx), np.abs(dy)) <= r * SQUARE
    return (dy <= r) & (np.abs(dx) <= (dy + r) / 2)  # upright triangle: apex at dy = -r, base of half-width r at dy = r


def _draw(objects: tuple[Obj, ...], frame: int, size: int, supersample: int) -> np.ndarray:
    n = size * supersample
    grid = (np.arange(n) + 0.5) / n
    xs, ys = np.meshgrid(grid, grid)
    canvas = np.broadcast_to(np.asarray(BACKGROUND, np.float32), (n, n, 3)).copy()
    for obj in objects:
        canvas[_coverage(obj, obj.at(frame), xs, ys)] = PALETTE[COLOURS.index(obj.colour)]
    return canvas.reshape(size, supersample, size, supersample, 3).mean(axis=(1, 3))


def render(scene: Scene, size: int = 32, supersample: int = 4) -> np.ndarray:
    """The scene's first frame, ``(size, size, 3)`` float32 in ``[0, 1]``, anti-aliased.

    Args:
        scene: what to draw.
        size: the image side in pixels (32 by default; any size, e.g. 64).
        supersample: points per pixel side whose coverage is averaged.

    Returns:
        The image.
    """
    return _draw(scene.objects, 0, size, supersample)


def render_video(scene: Scene, frames: int = 8, size: int = 32, supersample: int = 4) -> np.ndarray:
    """The scene's ``frames`` frames, each object moved ``SPEED`` per frame along its motion: ``(frames, size, size, 3)``.

    Args:
        scene: what to draw (frame 0 is ``render(scene)``).
        frames: the number of frames.
        size: the frame side in pixels.
        supersample: points per pixel side whose coverage is averaged.

    Returns:
        The video, float32 in ``[0, 1]``.
    """
    return np.stack([_draw(scene.objects, t, size, supersample) for t in range(frames)])
