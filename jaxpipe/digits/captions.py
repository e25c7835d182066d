"""Captions of the digits world: the fixed word order, parsing, and splitting a prompt into image and motion.

Captions list words in a fixed order: digit, stroke, position, brightness, then an optional motion
(``"seven thick left bright"``, ``"five moving up"``); a label is an index into its word tuple.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from jaxpipe.digits.words import BRIGHTNESS, DIGIT_WORDS, POSITIONS, STROKES, VOCABULARY
from jaxpipe.nn.text import unknown_words

__all__ = [
    "ATTRIBUTES",
    "ATTRIBUTE_WORDS",
    "MOTION_NAMES",
    "MOTION_PHRASES",
    "caption",
    "parse_caption",
    "split_prompt",
]

ATTRIBUTES = ("stroke", "position", "brightness")
"""The augmented attributes, in caption order (after the digit word)."""

ATTRIBUTE_WORDS: dict[str, tuple[str, ...]] = {"stroke": STROKES, "position": POSITIONS, "brightness": BRIGHTNESS}
"""Words of each attribute; a label is an index into its tuple (e.g. stroke 1 = "thick")."""

MOTION_NAMES = ("left", "right", "up", "down", "still")
"""Video motions; a motion label is an index into this tuple."""

MOTION_PHRASES = ("moving left", "moving right", "moving up", "moving down", "still")
"""The caption wording of each motion, aligned with ``MOTION_NAMES``."""


def _word_index(kind: str, words: Sequence[str], value) -> int:
    if isinstance(value, str):
        if value not in words:
            raise ValueError(f"unknown {kind} {value!r}; allowed: {', '.join(words)}")
        return words.index(value)
    if not isinstance(value, numbers.Integral) or not 0 <= int(value) < len(words):
        raise ValueError(f"{kind} must be an int in 0..{len(words) - 1} or one of {', '.join(words)} (got {value!r})")
    return int(value)


def caption(digit, stroke=None, position=None, brightness=None, *, motion=None) -> str:
    """The caption of one sample: words in the fixed order digit, stroke, position, brightness, motion.

    Each argument is a label (int index) or its word; ``None`` leaves the word out.
    ``caption(7, 1, 0, 1) == "seven thick left bright"``, ``caption(7, "thick") == "seven thick"``,
    ``caption(3, motion="up") == "three moving up"``, ``caption(5, motion=4) == "five still"``.

    Args:
        digit: the digit, 0..9 or its word (``"seven"``).
        stroke: index into ``STROKES`` or its word, or ``None``.
        position: index into ``POSITIONS`` or its word, or ``None``.
        brightness: index into ``BRIGHTNESS`` or its word, or ``None``.
        motion: index into ``MOTION_NAMES`` or its name (``"up"``), or ``None``.

    Returns:
        The caption, words separated by single spaces.

    Raises:
        ValueError: on an unknown word or an index out of range.
    """
    words = [DIGIT_WORDS[_word_index("digit", DIGIT_WORDS, digit)]]
    for name, value in zip(ATTRIBUTES, (stroke, position, brightness)):
        if value is not None:
            options = ATTRIBUTE_WORDS[name]
            words.append(options[_word_index(name, options, value)])
    if motion is not None:
        words.append(MOTION_PHRASES[_word_index("motion", MOTION_NAMES, motion)])
    return " ".join(words)


def parse_caption(text: str) -> dict[str, int | None]:
    """Labels named by a caption (the inverse of ``caption``): ``None`` for an attribute left out.

    ``parse_caption("seven thick")`` → ``{"digit": 7, "stroke": 1, "position": None, "brightness": None,
    "motion": None}``. Words may come in any order and any case.

    Args:
        text: a caption of the digits vocabulary (``VOCABULARY``).

    Returns:
        ``{"digit", "stroke", "position", "brightness", "motion"}``: each the label named (an index into its
        word tuple; ``motion`` into ``MOTION_NAMES``), or ``None`` (``digit`` is always named).

    Raises:
        ValueError: on a word outside the vocabulary, a word that fits no slot, a missing digit word,
            or a label named twice.
    """
    out: dict[str, int | None] = {"digit": None, **{a: None for a in ATTRIBUTES}, "motion": None}
    words = text.lower().split()
    strange = [w for w in words if w not in VOCABULARY]
    if strange:
        raise ValueError(
            f"unknown word(s) {unknown_words(strange, VOCABULARY)} in {text!r}; the vocabulary is: {', '.join(VOCABULARY)}"
        )
    i = 0
    while i < len(words):
        word = words[i]
        if word == "moving" and i + 1 < len(words) and words[i + 1] in MOTION_NAMES[:4]:
            key, value = "motion", MOTION_NAMES.index(words[i + 1])
            i += 1
        elif word == "still":
            key, value = "motion", MOTION_NAMES.index("still")
        elif word in DIGIT_WORDS:
            key, value = "digit", DIGIT_WORDS.index(word)
        else:
            key = next((a for a in ATTRIBUTES if word in ATTRIBUTE_WORDS[a]), None)
            if key is None:
                vocab = ", ".join(VOCABULARY)
                raise ValueError(f"cannot parse {word!r} in caption {text!r}; the vocabulary is: {vocab}")
            value = ATTRIBUTE_WORDS[key].index(word)
        if out[key] is not None:
            raise ValueError(f"caption {text!r} names the {key} twice")
        out[key] = value
        i += 1
    if out["digit"] is None:
        raise ValueError(f"caption {text!r} has no digit word ({', '.join(DIGIT_WORDS)})")
    return out


def split_prompt(text: str) -> tuple[str, str | None]:
    """Split a user prompt into its image part and its motion part.

    ``"seven thick moving right"`` → ``("seven thick left", "seven moving right")``: as in the
    training videos (``make_videos``), a digit moving right starts ``left`` and one moving left
    starts ``right`` unless the prompt places it, so it has room to travel. A prompt with no
    motion gives ``(image prompt, None)``.

    Args:
        text: a prompt of the digits vocabulary.

    Returns:
        The image prompt (digit and attributes, canonical order) and the motion prompt (digit and motion),
        or ``None`` for the motion when the prompt names none.

    Raises:
        ValueError: as ``parse_caption``, on words it cannot read.
    """
    labels = parse_caption(text)
    position = labels["position"]
    if position is None and labels["motion"] in (0, 1):  # moving left / right
        position = POSITIONS.index("right" if labels["motion"] == 0 else "left")
    image = caption(labels["digit"], labels["stroke"], position, labels["brightness"])
    motion = None if labels["motion"] is None else caption(labels["digit"], motion=labels["motion"])
    return image, motion
