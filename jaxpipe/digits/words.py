"""The words of the digits world: digit names, attribute words and motions."""

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
STROKES = ("thin", "thick")
POSITIONS = ("left", "center", "right")
BRIGHTNESS = ("dim", "bright")
MOTIONS = ("moving", "still", "up", "down")

VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(DIGIT_WORDS + STROKES + POSITIONS + BRIGHTNESS + MOTIONS))
