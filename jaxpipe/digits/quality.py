"""Measured quality (C4) of the digits-world generators, judged by the ``digit-scorer`` card (the reward) and,
for images, by the independent evaluators too (``evaluators``: ``digit-classifier`` and the readers).

The image measures live in ``image_quality`` (``t2i_quality``, ``understanding_quality``, ``thinking_quality``),
the video measures in ``video_quality`` (``i2v_quality``, ``t2v_quality``, motion by ink centroids); this module
gathers them and holds ``judge``, ``jaxpipe evaluate``'s digits report.
"""

from __future__ import annotations

from jaxpipe.card import Card
from jaxpipe.digits.image_quality import t2i_quality, thinking_quality, understanding_quality
from jaxpipe.digits.video_quality import (
    FIRST_FRAME_TOLERANCE,
    MOTION_THRESHOLD_PX,
    i2v_quality,
    ink_centroids,
    moves_as_told,
    t2v_quality,
)

__all__ = [
    "t2i_quality",
    "i2v_quality",
    "t2v_quality",
    "understanding_quality",
    "thinking_quality",
    "ink_centroids",
    "moves_as_told",
    "judge",
    "MOTION_THRESHOLD_PX",
    "FIRST_FRAME_TOLERANCE",
]


def judge(t2i: Card, i2v: Card, *, samples: int = 200, **common) -> dict:
    """``jaxpipe evaluate``'s digits report: ``t2i_quality`` of ``samples`` prompts and ``i2v_quality`` of half as
    many videos, both by the ``digit-scorer`` and the independent judges.

    Args:
      t2i: a text-to-image card of the digits vocabulary.
      i2v: an image-to-video card.
      samples: prompts of the image measure (videos: half as many, at least 1).
      **common: ``seed``, ``num_steps``, ``guidance``, ``progress``, ``should_stop`` for both.

    Returns:
      ``{"t2i": ..., "i2v": ...}``.
    """
    from jaxpipe import cards

    scorer = cards.load("digit-scorer")
    return {
        "t2i": t2i_quality(t2i, scorer, samples=samples, **common),
        "i2v": i2v_quality(i2v, scorer, samples=max(samples // 2, 1), **common),
    }
