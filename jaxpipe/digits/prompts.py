"""Prompt distributions of the digits-world RL runs: which prompts a run draws and what the reward scores.

A prompt is a random digit plus, for each rewarded attribute, its word with probability
``mention``. A rewarded attribute the prompt leaves out is labelled with its preferred value from
``prefer`` when there is one (a preference a refiner LM can learn to ask for), else -1 (not
rewarded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.digits.rewards import REWARD_TERMS
from jaxpipe.prompts import Prompts

__all__ = [
    "PromptSpec",
    "Captions",
    "TEXT_WIDTH",
    "parse_terms",
    "parse_preferences",
    "sample_prompts",
    "prompt_batches",
    "motion_batches",
]


@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """Which prompts a run draws and which labels the reward scores.

    Attributes:
        terms: reward terms (``REWARD_TERMS``; must include ``"digit"``: every prompt names one).
        mention: probability that a prompt names each rewarded attribute (1 = full compositional prompts).
        prefer: ``(attribute, label)`` pairs: the label rewarded when the prompt leaves that attribute out.

    Raises:
        ValueError: on an unknown, repeated or missing ``"digit"`` term, a ``mention`` outside ``[0, 1]``,
            or a preference that is unknown, repeated, out of range, not a reward term, or given with
            ``mention`` 1 (no prompt would leave the attribute out).
    """

    terms: tuple[str, ...] = REWARD_TERMS
    mention: float = 1.0
    prefer: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        unknown = [t for t in self.terms if t not in REWARD_TERMS]
        validate.rule(
            not unknown and bool(self.terms),
            f"unknown reward term(s) {unknown or list(self.terms)}; choose from {', '.join(REWARD_TERMS)}",
        )
        validate.rule(len(set(self.terms)) == len(self.terms), f"reward terms are named twice: {list(self.terms)}")
        validate.rule("digit" in self.terms, "the reward terms must include digit (every prompt names a digit)")
        validate.rule(0.0 <= self.mention <= 1.0, f"mention is a probability in [0, 1] (got {self.mention})")
        seen = set()
        for name, label in self.prefer:
            validate.rule(
                name in digits.ATTRIBUTES,
                f"cannot prefer {name!r}: preferences are over {', '.join(digits.ATTRIBUTES)}",
            )
            validate.rule(name not in seen, f"{name} is preferred twice")
            seen.add(name)
            words = digits.ATTRIBUTE_WORDS[name]
            validate.rule(
                0 <= int(label) < len(words), f"preferred {name} must be one of {', '.join(words)} (got label {label})"
            )
            validate.rule(
                name in self.terms,
                f"preferring a {name} needs {name} among the reward terms (terms: {', '.join(self.terms)})",
            )
        validate.rule(
            not (self.prefer and self.mention >= 1.0),
            "a preference applies only to prompts that leave the attribute out; with mention 1 every prompt names it",
        )

    @property
    def preferences(self) -> dict[str, int]:
        """``prefer`` as a dict: ``{attribute: preferred label}``."""
        return {name: int(label) for name, label in self.prefer}

    @property
    def max_words(self) -> int:
        """The longest prompt this spec draws (digit + every rewarded attribute)."""
        return 1 + sum(a in self.terms for a in digits.ATTRIBUTES) if self.mention > 0 else 1

    def describe(self) -> dict:
        """The spec as JSON-ready values, preferences by word: ``{"terms", "mention", "prefer": {attribute: word}}``."""
        prefer = {name: digits.ATTRIBUTE_WORDS[name][label] for name, label in self.prefer}
        return {"terms": list(self.terms), "mention": self.mention, "prefer": prefer}


def parse_terms(text: str) -> tuple[str, ...]:
    """``"digit,stroke"`` -> ``("digit", "stroke")`` (validated by ``PromptSpec``).

    Args:
        text: comma-separated reward terms (spaces around them are ignored).

    Returns:
        The terms, in order.

    Raises:
        ValueError: if a term is not in ``REWARD_TERMS`` or ``text`` names none.
    """
    terms = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in terms if t not in REWARD_TERMS]
    if unknown or not terms:
        raise ValueError(f"unknown reward term(s) {unknown or [text]}; choose from {', '.join(REWARD_TERMS)}")
    return terms


def parse_preferences(text: str) -> tuple[tuple[str, int], ...]:
    """``"stroke=thick,brightness=bright"`` -> ``(("stroke", 1), ("brightness", 1))``; ``""`` -> ``()``.

    Args:
        text: comma-separated ``ATTRIBUTE=WORD`` items.

    Returns:
        ``(attribute, label)`` pairs, the label the word's index in ``digits.ATTRIBUTE_WORDS[attribute]``.

    Raises:
        ValueError: if an item is not ``ATTRIBUTE=WORD`` of a known attribute and one of its words.
    """
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, word = (s.strip() for s in item.partition("="))
        if not sep or name not in digits.ATTRIBUTE_WORDS:
            raise ValueError(
                f"a preference is ATTRIBUTE=WORD with ATTRIBUTE one of {', '.join(digits.ATTRIBUTES)} (got {item!r})"
            )
        words = digits.ATTRIBUTE_WORDS[name]
        if word not in words:
            raise ValueError(f"preferred {name} must be one of {', '.join(words)} (got {word!r})")
        out.append((name, words.index(word)))
    return tuple(out)


class Captions(NamedTuple):
    """``n`` prompts: captions, rewarded labels ``{term: (n,) int32}`` (-1 = not rewarded) and
    ``named`` ``{attribute: (n,) bool}`` (the caption names it).

    Attributes:
        captions: the ``n`` captions.
        labels: ``{term: (n,) int32}`` for ``"digit"`` and each rewarded attribute (-1: not rewarded).
        named: ``{attribute: (n,) bool}`` for every attribute: whether the caption names it.
    """

    captions: list[str]
    labels: dict[str, np.ndarray]
    named: dict[str, np.ndarray]


def sample_prompts(spec: PromptSpec, n: int, rng: np.random.Generator) -> Captions:
    """Draw ``n`` prompts of ``spec`` (uniform digit and attribute values).

    Args:
        spec: the prompt distribution.
        n: the number of prompts.
        rng: the NumPy generator drawing them.

    Returns:
        ``Captions``: the ``n`` captions, the labels of ``"digit"`` and of each rewarded attribute (its value
        where named, else its preferred label or -1) and which attributes each caption names.
    """
    labels = {"digit": rng.integers(0, 10, n).astype(np.int32)}
    named = {}
    preferences = spec.preferences
    for name in digits.ATTRIBUTES:
        value = rng.integers(0, len(digits.ATTRIBUTE_WORDS[name]), n)
        mentioned = rng.random(n) < spec.mention
        if name not in spec.terms:
            named[name] = np.zeros(n, bool)
            continue
        named[name] = mentioned
        labels[name] = np.where(mentioned, value, preferences.get(name, -1)).astype(np.int32)
    captions = [
        digits.caption(
            int(labels["digit"][i]), *(int(labels[a][i]) if named[a][i] else None for a in digits.ATTRIBUTES)
        )
        for i in range(n)
    ]
    return Captions(captions, labels, named)


TEXT_WIDTH = 64
"""Bytes of a digits prompt's text row (``Prompts.text``): longer than any caption, fixed so a run compiles once."""


def prompt_batches(card: Card, spec: PromptSpec, prompts_per_step: int, seed: int) -> Iterator[Prompts]:
    """Endless RL batches of ``spec``'s prompts: ``Prompts`` of P captions, their ids for ``card`` and
    ``metadata`` = the rewarded labels ``{term: (P,) int32}``.

    Args:
        card: the card whose tokenizer encodes the captions.
        spec: the prompt distribution.
        prompts_per_step: ``P``, prompts per batch (>= 1).
        seed: the seed of the prompts (one generator for the whole stream).

    Returns:
        An endless iterator of ``Prompts``.

    Raises:
        ValueError: if ``prompts_per_step`` < 1 (on the first ``next``: this is a generator).
    """

    def draw(rng: np.random.Generator) -> tuple[list[str], dict]:
        p = sample_prompts(spec, prompts_per_step, rng)
        return p.captions, p.labels

    return _stream(card, prompts_per_step, seed, draw)


def motion_batches(card: Card, prompts_per_step: int, seed: int) -> Iterator[Prompts]:
    """Endless text-to-video batches of captions naming a digit and a motion (``"seven moving right"``),
    uniformly drawn: ``Prompts`` with metadata ``{"digit", "motion": (P,) int32}``.

    Args:
        card: the text-to-video card whose tokenizer encodes the captions.
        prompts_per_step: ``P``, prompts per batch (>= 1).
        seed: the seed of the prompts (one generator for the whole stream).

    Returns:
        An endless iterator of ``Prompts``; ``motion`` indexes ``digits.MOTION_NAMES``.

    Raises:
        ValueError: if ``prompts_per_step`` < 1 (on the first ``next``: this is a generator).
    """

    def draw(rng: np.random.Generator) -> tuple[list[str], dict]:
        digit = rng.integers(0, 10, prompts_per_step)
        motion = rng.integers(0, len(digits.MOTION_NAMES), prompts_per_step)
        captions = [digits.caption(int(d), motion=int(m)) for d, m in zip(digit, motion)]
        return captions, {"digit": digit.astype(np.int32), "motion": motion.astype(np.int32)}

    return _stream(card, prompts_per_step, seed, draw)


def _stream(card: Card, prompts_per_step: int, seed: int, draw) -> Iterator[Prompts]:
    """``Prompts`` of ``draw(rng) -> (captions, labels)`` for ``card``, forever, from one generator seeded ``seed``
    (a generator: a bad ``prompts_per_step`` raises on the first ``next``)."""
    if prompts_per_step < 1:
        raise ValueError(f"prompts_per_step must be >= 1 (got {prompts_per_step})")
    rng = np.random.default_rng(seed)
    while True:
        captions, labels = draw(rng)
        yield Prompts.from_texts(card, captions, labels, width=TEXT_WIDTH)
