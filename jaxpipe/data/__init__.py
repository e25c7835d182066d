"""The digits world's data (DESIGN §9): vocabulary, captioned images and videos, batches."""

from jaxpipe.data import digits
from jaxpipe.data.digits import (
    MOTION_NAMES,
    ImageDataset,
    VideoDataset,
    augment,
    batches,
    caption,
    concat,
    split_prompt,
    load_images,
    make_videos,
    parse_caption,
)
from jaxpipe.data.words import BRIGHTNESS, DIGIT_WORDS, MOTIONS, POSITIONS, STROKES, VOCABULARY

__all__ = [
    "BRIGHTNESS",
    "DIGIT_WORDS",
    "MOTIONS",
    "MOTION_NAMES",
    "POSITIONS",
    "STROKES",
    "VOCABULARY",
    "ImageDataset",
    "VideoDataset",
    "augment",
    "batches",
    "caption",
    "concat",
    "split_prompt",
    "digits",
    "load_images",
    "make_videos",
    "parse_caption",
]
