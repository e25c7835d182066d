"""The words of the digits world: digit names, attribute words and motions."""

__all__ = ["BRIGHTNESS", "DIGIT_WORDS", "MOTIONS", "POSITIONS", "STROKES", "VOCABULARY"]

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
"""The digit names; digit ``d`` is ``DIGIT_WORDS[d]``."""
STROKES = ("thin", "thick")
"""The stroke words; a stroke label indexes this tuple."""
POSITIONS = ("left", "center", "right")
"""The position words; a position label indexes this tuple."""
BRIGHTNESS = ("dim", "bright")
"""The brightness words; a brightness label indexes this tuple."""
MOTIONS = ("moving", "still", "up", "down")
"""The motion words that are not already position words (``"moving left"`` reuses ``"left"``)."""

VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(DIGIT_WORDS + STROKES + POSITIONS + BRIGHTNESS + MOTIONS))
"""Every word of the digits world, once each, in the order above."""
