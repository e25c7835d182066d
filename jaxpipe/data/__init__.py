"""The digits world's data: vocabulary now, images and videos with captions later."""

from jaxpipe.data.words import BRIGHTNESS, DIGIT_WORDS, MOTIONS, POSITIONS, STROKES, VOCABULARY

__all__ = ["BRIGHTNESS", "DIGIT_WORDS", "MOTIONS", "POSITIONS", "STROKES", "VOCABULARY"]
