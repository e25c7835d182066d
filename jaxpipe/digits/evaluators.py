"""Judging generated digits against their prompts with evaluators that share no weights with the reward.

The digit comes from the independent ``digit-classifier`` card (``jaxpipe.digits.digit_classifier``),
stroke / position / brightness from the analytic ``readers``; neither has seen the digit-scorer's
weights or data, so a gain the scorer reports and these do not is reward hacking. Usage::

    evaluator = Evaluator()                       # loads the bundled classifier once
    report = evaluator.judge(out["image"], labels_from_prompts(prompts))
    # {"digit": 0.97, "stroke": 0.99, ..., "all_right": 0.93, "rows": 240, "asked_digit": 240, ...}

Images are ``(N, 16, 16, 1)`` float in [0, 1] (background 0), as ``jp.generate`` returns them.
Labels are ``{"digit"|"stroke"|"position"|"brightness": (N,) int}`` with ``-1`` where a row does
not ask for that term (a prompt that leaves the word out); missing keys ask nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from jaxpipe import cards
from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_classifier, readers
from jaxpipe.digits.words import DIGIT_WORDS

__all__ = ["TERMS", "Evaluator", "compare", "default_evaluator", "judge", "labels_from_prompts"]

TERMS: dict[str, int] = {
    "digit": len(DIGIT_WORDS),
    **{name: len(words) for name, words in digits.ATTRIBUTE_WORDS.items()},
}
"""The judged terms and their class counts (the digit-scorer's heads): digit 10, stroke 2, position 3, brightness 2."""


def _check_labels(labels: Mapping[str, object], n: int | None = None) -> dict[str, np.ndarray]:
    """``labels`` as int arrays ``(N,)`` per term (missing terms: all -1), or a ValueError naming the problem
    (unknown term, wrong shape or range, unequal lengths, nothing asked)."""
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping of term -> (N,) ints (got {type(labels).__name__})")
    unknown = sorted(set(labels) - set(TERMS))
    if unknown:
        raise ValueError(f"labels has unknown term(s) {unknown}; terms are {list(TERMS)}")
    out = {}
    for term, value in labels.items():
        value = np.asarray(value)
        if value.ndim != 1 or (n is not None and len(value) != n):
            want = f"({n},)" if n is not None else "(N,)"
            raise ValueError(f"labels[{term!r}] must have shape {want} (got {value.shape})")
        if value.size and (
            not np.issubdtype(value.dtype, np.integer) or value.min() < -1 or value.max() >= TERMS[term]
        ):
            raise ValueError(f"labels[{term!r}] must be ints in 0..{TERMS[term] - 1}, or -1 where not asked")
        out[term] = value.astype(np.int32)
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
        raise ValueError(f"labels must all have the same length (got { ({t: len(v) for t, v in out.items()}) })")
    size = n if n is not None else (lengths.pop() if lengths else 0)
    if not any((v >= 0).any() for v in out.values()):
        raise ValueError("labels ask for nothing: every label is -1 (or no term is given)")
    return {term: out.get(term, np.full(size, -1, np.int32)) for term in TERMS}


def compare(read: Mapping[str, np.ndarray], labels: Mapping[str, object]) -> dict[str, float | int]:
    """Summary of read labels against asked ones: per-term accuracy and the all-right rate.

    Args:
        read: ``{term: (N,) int}`` — what the evaluators read (-1: unreadable, always wrong).
        labels: ``{term: (N,) int}`` — what was asked, ``-1`` where a row does not ask for the term.

    Returns:
        ``{term: accuracy over the rows asking for it}`` (only the terms some row asks for),
        ``"all_right"``: the share of rows (of those asking anything) with every asked term right,
        ``"rows"``: N, and ``"asked_<term>"``: how many rows ask for each term.

    Raises:
        TypeError: ``labels`` is not a mapping.
        ValueError: unknown terms, wrong shapes or out-of-range labels, or labels that ask nothing.
    """
    n = len(next(iter(read.values())))
    labels = _check_labels(labels, n)
    asked_any = np.zeros(n, bool)
    all_right = np.ones(n, bool)
    out: dict[str, float | int] = {}
    for term, asked_labels in labels.items():
        asked = asked_labels >= 0
        if term not in read:
            if asked.any():
                raise ValueError(f"labels ask for {term!r} but nothing read it (read has {sorted(read)})")
            continue
        right = np.asarray(read[term]) == asked_labels
        if asked.any():
            out[term] = float(np.mean(right[asked]))
        asked_any |= asked
        all_right &= right | ~asked
    out["all_right"] = float(np.mean(all_right[asked_any]))
    out["rows"] = n
    out.update({f"asked_{term}": int(np.sum(v >= 0)) for term, v in labels.items()})
    return out


def labels_from_prompts(prompts: Sequence[str]) -> dict[str, np.ndarray]:
    """The labels prompts ask for: ``{term: (N,) int32}``, -1 for an attribute a prompt leaves out.

    ``labels_from_prompts(["seven thick left bright", "one dim"])["stroke"] == [1, -1]``.

    Args:
        prompts: ``N`` digits-world prompts (motion words are allowed and ignored).

    Returns:
        ``{"digit"|"stroke"|"position"|"brightness": (N,) int32}``, -1 where a prompt names no such word.

    Raises:
        ValueError: as ``digits.parse_caption``, on words outside the vocabulary or a prompt without a digit.
    """
    parsed = [digits.parse_caption(p) for p in prompts]
    return {term: np.array([-1 if p[term] is None else p[term] for p in parsed], np.int32) for term in TERMS}


class Evaluator:
    """Independent evaluators of digits images: the classifier card (loaded once) plus the readers.

    Args:
        card: a ``digit-classifier`` card (default: the bundled one, ``jp.cards.load("digit-classifier")``).
        thresholds: the readers' thresholds (default: ``readers.THRESHOLDS``).
    """

    def __init__(self, card: Card | None = None, thresholds: readers.Thresholds = readers.THRESHOLDS):
        self.card = cards.load(digit_classifier.MODEL_ID) if card is None else card
        self.thresholds = thresholds

    def read(self, images) -> dict[str, np.ndarray]:
        """What the images show: ``{"digit"|"stroke"|"position"|"brightness": (N,) int32}``.

        Args:
            images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0.

        Returns:
            The labels read; -1 marks an attribute of a blank image.

        Raises:
            ValueError: on a wrong shape or dtype, or values outside [0, 1].
        """
        attributes = readers.read(images, self.thresholds)
        return {"digit": self.predict(images), **attributes}

    def predict(self, images) -> np.ndarray:
        """The digit the classifier reads in images ``(N, 16, 16, 1)`` in [0, 1]: ``(N,)`` int32.

        Args:
            images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0.

        Returns:
            The digits, int32 ``(N,)`` in 0..9.

        Raises:
            ValueError: on a wrong shape or dtype, or values outside [0, 1].
        """
        return digit_classifier.predict(self.card, images)

    def judge(self, images, labels: Mapping[str, object]) -> dict[str, float | int]:
        """``compare(self.read(images), labels)``: per-term accuracy, all-right rate, counts (see ``compare``).

        The labels are checked before the classifier runs.

        Args:
            images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0.
            labels: ``{term: (N,) int}``, -1 where a row does not ask for the term.

        Returns:
            ``compare``'s summary.

        Raises:
            TypeError: if ``labels`` is not a mapping.
            ValueError: on bad images or labels (see ``compare``).
        """
        n = readers.check_images(images).shape[0]
        _check_labels(labels, n)  # fail on bad labels before running the classifier
        return compare(self.read(images), labels)


@functools.cache
def default_evaluator() -> Evaluator:
    """The ``Evaluator`` of the bundled classifier, built on first use and kept."""
    return Evaluator()


def judge(images, labels: Mapping[str, object], *, evaluator: Evaluator | None = None) -> dict[str, float | int]:
    """Judge images ``(N, 16, 16, 1)`` in [0, 1] against asked ``labels`` (see ``compare``) with ``evaluator``
    (default: ``default_evaluator()``).

    Args:
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0.
        labels: ``{term: (N,) int}``, -1 where a row does not ask for the term (``labels_from_prompts``).
        evaluator: the judge (default: ``default_evaluator()``, the bundled classifier and the readers).

    Returns:
        ``compare``'s summary: per-term accuracy, ``"all_right"``, ``"rows"`` and ``"asked_<term>"`` counts.

    Raises:
        TypeError: if ``labels`` is not a mapping.
        ValueError: on bad images or labels (see ``compare``).
    """
    return (evaluator or default_evaluator()).judge(images, labels)
