"""GenEval's own verdict on the shapes judge's detections: at least the named objects, exactly the named count.

GenEval (``evaluation/evaluate_images.py``) asks of each image only what its prompt names: for each named
class, at least that many detections (the most confident ones are the ones checked), their colour where the
prompt names one, and the second object's position relative to the first; only a counting prompt also
excludes one object more. Other objects in the picture do not matter. Here a class is a shape, confidence
is the template fit, and the box of a detection is its shape's extent about its centre. This is more lenient
than ``judging.correct`` (the strict rule: exactly the named objects and nothing else), which stays the
judge's reward and a second column of the tables.

``geneval_score`` is the partial credit FlowGRPO trains on GenEval with (its paper's rule-based reward): a
counting image earns ``1 - |N - N_ref| / N_ref``; any other earns half for the named objects being there and
the other half when it is right by GenEval's rule (colours, position).

The mapping where the worlds differ: GenEval's position prompts name no colours and two different classes;
this world's name colours and may name one shape twice ("a red circle left of a blue circle"), so a
position thing is found by its colour and shape, and the relation is GenEval's ``relative_position`` (centre
offsets less 0.1 of the boxes' sizes, then the direction's component above 0.5).
"""

from __future__ import annotations

import collections

import numpy as np

from jaxpipe.shapes.grammar import Prompt
from jaxpipe.shapes.judging import Detection
from jaxpipe.shapes.scenes import SQUARE

__all__ = ["POSITION_THRESHOLD", "geneval_correct", "geneval_score", "relations"]

POSITION_THRESHOLD = 0.1
"""GenEval's ``POSITION_THRESHOLD``: the part of the two boxes' sizes an offset must exceed to count."""

_RELATION = {"left": "left of", "right": "right of", "above": "above", "below": "below"}
_AREA = {"circle": np.pi, "square": 4 * SQUARE**2, "triangle": 2.0}  # area / radius² (as the judge's templates)


def _box(d: Detection, side: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """A detection's box centre and size ``(w, h)``, canvas fractions (a triangle's centroid sits r/3 below its box centre)."""
    radius = np.sqrt(d.area / _AREA[d.shape]) / side
    half = radius * SQUARE if d.shape == "square" else radius
    lift = radius / 3 if d.shape == "triangle" else 0.0
    return np.asarray([d.x, d.y - lift]), np.asarray([2 * half, 2 * half])


def relations(a: Detection, b: Detection, side: int = 32) -> set[str]:
    """GenEval's ``relative_position(a, b)``: the relations (``"left of"``, ``"right of"``, ``"above"``,
    ``"below"``) in which ``a`` stands to ``b``; empty when their centres are too close to tell.

    Args:
        a: the object placed.
        b: the object it is placed against.
        side: the image side the detections' areas were read at (pixels).

    Returns:
        The set of relations.
    """
    (ca, da), (cb, db) = _box(a, side), _box(b, side)
    offset = ca - cb
    revised = np.maximum(np.abs(offset) - POSITION_THRESHOLD * (da + db), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    found = set()
    if dx < -0.5:
        found.add("left of")
    if dx > 0.5:
        found.add("right of")
    if dy < -0.5:
        found.add("above")
    if dy > 0.5:
        found.add("below")
    return found


def geneval_correct(found: list[Detection], prompt: Prompt, category: str | None = None, *, side: int = 32) -> bool:
    """Whether ``found`` (one image's detections) satisfies ``prompt`` by GenEval's rule for ``category``.

    Args:
        found: ``judging.detect``'s detections of the image.
        prompt: what the image should show.
        category: the category judged (default: the prompt's); ``counting`` and ``two_object`` check no
            colours, as GenEval.
        side: the image side (pixels).

    Returns:
        The verdict.
    """
    category = category or prompt.category
    ranked = sorted(found, key=lambda d: -d.fit)  # GenEval keeps the most confident detections of a class
    if category == "position":
        placed = []
        for thing in prompt.things:
            match = [d for d in ranked if d.shape == thing.shape and d.colour == thing.colour]
            if not match:
                return False
            placed.append(match[0])
        return _RELATION[prompt.relation] in relations(placed[0], placed[1], side)
    colour = category in ("colors", "color_attr")
    needed: dict[str, list] = {}
    for thing in prompt.things:
        needed.setdefault(thing.shape, []).append(thing.colour)
    for shape, colours in needed.items():
        of_shape = [d for d in ranked if d.shape == shape]
        if len(of_shape) < len(colours) or (category == "counting" and len(of_shape) > len(colours)):
            return False
        if colour and sorted(d.colour for d in of_shape[: len(colours)]) != sorted(colours):
            return False
    return True


def geneval_score(found: list[Detection], prompt: Prompt, category: str | None = None, *, side: int = 32) -> float:
    """FlowGRPO's rule-based GenEval reward of one image, in ``[0, 1]``: ``1 - |N - N_ref| / N_ref`` (at least 0)
    for counting (``N`` detections of the named shape); otherwise ``0.5 ·`` (the fraction of named objects present,
    by shape) ``+ 0.5 ·`` (``geneval_correct``).

    Args:
        found: ``judging.detect``'s detections of the image.
        prompt: what the image should show.
        category: the category judged (default: the prompt's).
        side: the image side (pixels).

    Returns:
        The score; 1.0 exactly when ``geneval_correct``.
    """
    category = category or prompt.category
    if category == "counting":
        wanted = len(prompt.things)
        have = sum(d.shape == prompt.things[0].shape for d in found)
        return max(0.0, 1.0 - abs(have - wanted) / wanted)
    needed = collections.Counter(thing.shape for thing in prompt.things)
    have = collections.Counter(d.shape for d in found)
    present = sum(min(n, have[shape]) for shape, n in needed.items()) / len(prompt.things)
    return 0.5 * present + 0.5 * float(geneval_correct(found, prompt, category, side=side))
