"""The words of the digits world (DESIGN §9): digit names and attribute words."""

import difflib

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
STROKES = ("thin", "thick")
POSITIONS = ("left", "center", "right")
BRIGHTNESS = ("dim", "bright")
MOTIONS = ("moving", "still", "up", "down")

VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(DIGIT_WORDS + STROKES + POSITIONS + BRIGHTNESS + MOTIONS))


def unknown_words(words, vocabulary) -> str:
    """``'rigth' (did you mean 'right'?), 'purpel'``: every unknown word, with its closest known words."""
    parts = []
    for word in dict.fromkeys(words):
        close = difflib.get_close_matches(word, vocabulary, n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        parts.append(f"{word!r}{hint}")
    return ", ".join(parts)
