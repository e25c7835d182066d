"""The prompt grammar of the shapes world: GenEval's six categories, their scenes, and a held-out split.

A ``Prompt`` is what a text asks for: its ``category`` (``CATEGORIES``), the ``things`` it names (colour,
shape, optional size and motion) and a ``relation`` between the first two. Four forms of text cover the
six categories::

    single_object, colors   "a red circle"   "a big red circle"
    two_object, color_attr  "a blue square and a yellow triangle"
    counting                "three green circles"
    position                "a red circle left of a blue triangle"   (right of, above, below)
    video                   "a red circle moving right"   "a red circle still and a blue square moving up"

``single_object`` and ``colors`` (and ``two_object`` and ``color_attr``) share a form and differ in what the
judge checks: the shapes only, or the shapes and their colours. ``color_attr`` pairs always have two
different colours and shapes, so a picture with the colours swapped is wrong. ``HELDOUT_PAIRS`` are
colour-shape pairs no training caption or scene ever shows; ``sample(..., split="heldout")`` draws prompts
that name at least one of them (the generalisation split), ``split="train"`` only the others.
``scene_for(prompt, rng)`` lays out a scene the prompt describes truly.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from jaxpipe import validate
from jaxpipe.shapes.scenes import GAP, RADIUS, Obj, Scene, extent, inside, separated
from jaxpipe.shapes.words import COLOURS, COUNTS, MOTIONS, PLURALS, RELATIONS, SHAPES, SIZES

__all__ = [
    "CATEGORIES",
    "HELDOUT_PAIRS",
    "SPLITS",
    "Thing",
    "Prompt",
    "parse",
    "sample",
    "sample_video",
    "scene_for",
    "prompt_set",
    "captioned_scenes",
]

CATEGORIES = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""GenEval's six categories, in its table's order."""
HELDOUT_PAIRS = frozenset(
    {
        ("red", "triangle"),
        ("green", "circle"),
        ("blue", "square"),
        ("yellow", "triangle"),
        ("purple", "circle"),
        ("cyan", "square"),
    }
)
"""Colour-shape pairs never shown in training: each colour loses one shape, each shape two colours."""
SPLITS = ("train", "heldout")
"""``train``: prompts of seen colour-shape pairs only; ``heldout``: prompts naming at least one ``HELDOUT_PAIRS`` pair."""

_RELATION_WORDS = {"left": ("left", "of"), "right": ("right", "of"), "above": ("above",), "below": ("below",)}
_AXIS = {"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}


@dataclasses.dataclass(frozen=True)
class Thing:
    """One object a prompt names: ``colour``, ``shape``, and optionally its ``size`` and (videos) ``motion``."""

    colour: str
    shape: str
    size: str | None = None
    motion: str | None = None


@dataclasses.dataclass(frozen=True)
class Prompt:
    """What a text asks for: the ``category`` it is judged under, the ``things`` it names (a counting prompt
    names its thing ``count`` times) and the ``relation`` of the first thing to the second (``position``).

    Raises:
        ValueError: on an unknown category or relation, or things that do not fit the category.
    """

    category: str
    things: tuple[Thing, ...]
    relation: str | None = None

    def __post_init__(self):
        validate.rule(
            self.category in (*CATEGORIES, "video"),
            f"unknown category {self.category!r}; choose from {', '.join((*CATEGORIES, 'video'))}",
        )
        expected = {
            "single_object": (1,),
            "colors": (1,),
            "two_object": (2,),
            "color_attr": (2,),
            "position": (2,),
            "counting": (2, 3, 4),
            "video": (1, 2),
        }[self.category]
        validate.rule(
            len(self.things) in expected, f"a {self.category} prompt names {expected} things (got {len(self.things)})"
        )
        validate.rule(
            (self.relation is not None) == (self.category == "position")
            and not (self.relation and self.relation not in RELATIONS),
            f"a position prompt and only it has a relation in {RELATIONS} (got {self.relation!r})",
        )
        validate.rule(
            self.category != "counting" or len(set(self.things)) == 1,
            "a counting prompt names one thing, several times",
        )

    @property
    def text(self) -> str:
        """The prompt's words."""
        if self.category == "counting":
            thing = self.things[0]
            return f"{COUNTS[len(self.things) - 2]} {thing.colour} {PLURALS[SHAPES.index(thing.shape)]}"
        words = [_phrase(t) for t in self.things]
        if self.category == "position":
            return f"{words[0]} {' '.join(_RELATION_WORDS[self.relation])} {words[1]}"
        return " and ".join(words)

    @property
    def pairs(self) -> frozenset[tuple[str, str]]:
        """The colour-shape pairs the prompt names."""
        return frozenset((t.colour, t.shape) for t in self.things)


def _phrase(thing: Thing) -> str:
    words = ["a", *([thing.size] if thing.size else []), thing.colour, thing.shape]
    if thing.motion is not None:
        words += ["still"] if thing.motion == "still" else ["moving", thing.motion]
    return " ".join(words)


def parse(text: str, category: str | None = None) -> Prompt:
    """The ``Prompt`` a text of the grammar asks for, judged under ``category`` (default: the strictest
    category of its form: ``colors``, ``color_attr``, ``counting``, ``position`` or ``video``).

    Args:
        text: a prompt of one of the grammar's forms (``Prompt.text``).
        category: the category to judge it under (it must fit the text's form).

    Returns:
        The ``Prompt``.

    Raises:
        ValueError: if the text is not in the grammar, naming the first word that does not fit.
    """
    words = text.split()
    if words and words[0] in COUNTS:
        if len(words) != 3 or words[1] not in COLOURS or words[2] not in PLURALS:
            raise ValueError(f"{text!r}: a counting prompt is COUNT COLOUR SHAPES, e.g. 'three green circles'")
        thing = Thing(words[1], SHAPES[PLURALS.index(words[2])])
        return Prompt(category or "counting", (thing,) * (COUNTS.index(words[0]) + 2))
    things, relation, i = [], None, 0
    while True:
        thing, i = _read_thing(text, words, i)
        things.append(thing)
        if i == len(words):
            break
        if words[i] == "and" and relation is None:
            i += 1
        elif words[i] in _RELATION_WORDS and not relation and len(things) == 1:
            relation = words[i]
            tail = _RELATION_WORDS[relation][1:]
            if words[i + 1 : i + 1 + len(tail)] != list(tail):
                raise ValueError(f"{text!r}: write '{' '.join(_RELATION_WORDS[relation])}'")
            i += 1 + len(tail)
        else:
            raise ValueError(f"{text!r}: unexpected word {words[i]!r}")
    moving = any(t.motion is not None for t in things)
    if moving and relation:
        raise ValueError(f"{text!r}: a video prompt has no relation")
    default = "video" if moving else "position" if relation else ("colors" if len(things) == 1 else "color_attr")
    return Prompt(category or default, tuple(things), relation)


def _read_thing(text: str, words: list[str], i: int) -> tuple[Thing, int]:
    if i >= len(words) or words[i] != "a":
        raise ValueError(f"{text!r}: expected 'a' at word {i + 1}")
    i += 1
    size = words[i] if i < len(words) and words[i] in SIZES else None
    i += size is not None
    if i + 1 >= len(words) or words[i] not in COLOURS or words[i + 1] not in SHAPES:
        got = words[i] if i < len(words) else "the end"
        raise ValueError(
            f"{text!r}: expected a colour ({', '.join(COLOURS)}) then a shape ({', '.join(SHAPES)}), got {got!r}"
        )
    colour, shape, i = words[i], words[i + 1], i + 2
    motion = None
    if i < len(words) and words[i] == "still":
        motion, i = "still", i + 1
    elif i < len(words) and words[i] == "moving":
        if i + 1 >= len(words) or words[i + 1] not in MOTIONS[:4]:
            raise ValueError(f"{text!r}: 'moving' takes one of {', '.join(MOTIONS[:4])}")
        motion, i = words[i + 1], i + 2
    return Thing(colour, shape, size, motion), i


def _pairs(split: str) -> list[tuple[str, str]]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    every = list(itertools.product(COLOURS, SHAPES))
    return [p for p in every if (p in HELDOUT_PAIRS) == (split == "heldout")]


def _draw(rng: np.random.Generator, options: Sequence) -> object:
    return options[int(rng.integers(len(options)))]


def sample(category: str, rng: np.random.Generator, split: str = "train", *, size_words: float = 0.0) -> Prompt:
    """A random prompt of ``category`` whose colour-shape pairs are ``split``'s (``SPLITS``).

    Args:
        category: one of ``CATEGORIES``.
        rng: the random generator (advanced).
        split: ``"train"`` (seen pairs only) or ``"heldout"`` (at least one ``HELDOUT_PAIRS`` pair, the others seen).
        size_words: the probability that a one-object prompt names the size (``"a big red circle"``).

    Returns:
        The ``Prompt``.

    Raises:
        ValueError: on an unknown category or split.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; choose from {', '.join(CATEGORIES)}")
    seen, fresh = _pairs("train"), _pairs(split)
    if category in ("single_object", "colors"):
        colour, shape = _draw(rng, fresh)
        size = _draw(rng, SIZES) if rng.random() < size_words else None
        return Prompt(category, (Thing(colour, shape, size),))
    if category == "counting":
        colour, shape = _draw(rng, fresh)
        return Prompt(category, (Thing(colour, shape),) * int(rng.integers(2, 5)))
    while True:  # two things: the first from the split's pairs, the second seen; then shuffled
        first, second = _draw(rng, fresh), _draw(rng, seen)
        if category in ("two_object", "color_attr") and first[1] == second[1]:
            continue
        if category == "color_attr" and first[0] == second[0]:
            continue
        if first == second:
            continue
        things = [Thing(*first), Thing(*second)]
        if rng.random() < 0.5:
            things.reverse()
        return Prompt(category, tuple(things), _draw(rng, RELATIONS) if category == "position" else None)


def sample_video(rng: np.random.Generator, split: str = "train", *, two: float = 0.3) -> Prompt:
    """A random video prompt: one thing (two with probability ``two``), each still or moving in a direction.

    Args:
        rng: the random generator (advanced).
        split: ``"train"`` or ``"heldout"`` (as ``sample``).
        two: the probability of a second, different thing.

    Returns:
        The ``Prompt`` (category ``"video"``).
    """
    things = [Thing(*_draw(rng, _pairs(split)), motion=_draw(rng, MOTIONS))]
    if rng.random() < two:
        while (pair := _draw(rng, _pairs("train"))) == (things[0].colour, things[0].shape):
            pass
        things.append(Thing(*pair, motion=_draw(rng, MOTIONS)))
    return Prompt("video", tuple(things))


def scene_for(
    prompt: Prompt, rng: np.random.Generator, frames: int = 1, *, gap: float = GAP, tries: int = 2000
) -> Scene:
    """A random scene the prompt describes truly: its things (sizes drawn, per layout, where the prompt names none) laid out
    apart and inside the canvas in every one of ``frames`` frames, the relation (if any) held with the
    off-axis offset at most half the on-axis one.

    Args:
        prompt: the prompt to depict.
        rng: the random generator (advanced).
        frames: the frames the layout must hold in (a video's length; 1 for an image).
        gap: the smallest gap between two objects' boxes (canvas fraction; negative lets them overlap).
        tries: layouts drawn before giving up.

    Returns:
        The ``Scene``.

    Raises:
        RuntimeError: if no layout is found in ``tries`` draws.
    """
    for _ in range(tries):
        objects = []
        for thing in prompt.things:
            size = thing.size or _draw(rng, SIZES)
            lo = RADIUS[size] + 0.02
            x, y = rng.uniform(lo, 1 - lo, size=2)
            objects.append(Obj(thing.shape, thing.colour, size, float(x), float(y), thing.motion or "still"))
        if not all(inside(o, frames) for o in objects):
            continue
        if not all(separated(a, b, frames, gap) for a, b in itertools.combinations(objects, 2)):
            continue
        if prompt.relation and not _holds(objects[0], objects[1], prompt.relation):
            continue
        return Scene(tuple(objects))
    raise RuntimeError(f"no layout for {prompt.text!r} in {tries} tries")


def _holds(a: Obj, b: Obj, relation: str) -> bool:
    ax, ay = _AXIS[relation]
    along = (a.x - b.x) * ax + (a.y - b.y) * ay  # how far a is from b in the relation's direction
    across = abs((a.x - b.x) * ay) + abs((a.y - b.y) * ax)
    return along >= extent(a) + extent(b) + GAP and across <= along / 2


def prompt_set(category: str, n: int, *, split: str = "train", seed: int = 0) -> list[Prompt]:
    """``n`` distinct prompts of ``category`` from ``split`` (fewer if the split has fewer), deterministic in ``seed``.

    Args:
        category: one of ``CATEGORIES``.
        n: how many prompts.
        split: ``"train"`` or ``"heldout"``.
        seed: the draw's seed (the benchmark's test prompts are seed 0's).

    Returns:
        The prompts, in drawing order.
    """
    rng = np.random.default_rng([seed, CATEGORIES.index(category), SPLITS.index(split)])
    found: dict[str, Prompt] = {}
    for _ in range(50 * n):
        prompt = sample(category, rng, split)
        found.setdefault(prompt.text, prompt)
        if len(found) == n:
            break
    return list(found.values())


def captioned_scenes(
    n: int, *, seed: int = 0, size_words: float = 0.3, video: bool = False, frames: int = 8
) -> list[tuple[str, Scene]]:
    """``n`` training ``(caption, scene)`` pairs of seen colour-shape pairs only: the six categories drawn
    equally (or, ``video``, video prompts over ``frames`` frames), deterministic in ``seed``.

    Args:
        n: how many pairs.
        seed: the draw's seed.
        size_words: the probability that a one-object caption names the size.
        video: draw video prompts instead of image ones.
        frames: the video length the layouts hold in.

    Returns:
        The pairs.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = sample_video(rng) if video else sample(_draw(rng, CATEGORIES), rng, size_words=size_words)
        out.append((prompt.text, scene_for(prompt, rng, frames if video else 1)))
    return out
