"""The analytic judge as an RL reward: each picture's fraction of checks passed against its prompt.

``judge_reward`` is a host reward (``jaxpipe.rewards.host``): the rollout's pictures come to NumPy,
the judge reads them and the scores go back into the jitted step. A run rewarded by it is measured by the
same judge; it has no weights to hack, only its checks (reports say so).
"""

from __future__ import annotations

import numpy as np

from jaxpipe import rewards
from jaxpipe.shapes.grammar import parse
from jaxpipe.shapes.judging import judge, judge_video, score

__all__ = ["judge_reward", "judge_scores"]


def judge_scores(pictures: np.ndarray, texts: list[str]) -> np.ndarray:
    """``(B,)`` float32: the fraction of the judge's checks each picture passes against its prompt text.

    Args:
        pictures: ``(B, H, W, 3)`` images or ``(B, T, H, W, 3)`` videos in ``[0, 1]``.
        texts: the ``B`` prompt texts (the grammar's forms; each judged under the strictest category of its form).

    Returns:
        The scores in ``[0, 1]``.

    Raises:
        ValueError: if the counts differ or a text is not in the grammar.
    """
    pictures = np.asarray(pictures)
    if len(pictures) != len(texts):
        raise ValueError(f"{len(pictures)} pictures for {len(texts)} prompts")
    read = judge_video if pictures.ndim == 5 else judge
    return np.asarray([score(read(p, parse(t))) for p, t in zip(pictures, texts)], np.float32)


@rewards.host
def judge_reward(artifacts, prompts) -> np.ndarray:
    """The shapes judge's reward of a rollout: ``artifacts["image"]`` ``(B, H, W, 3)`` (or ``["video"]``) against
    the ``B`` prompt texts, ``(B,)`` in ``[0, 1]`` (``judge_scores``)."""
    pictures = artifacts["video"] if "video" in artifacts else artifacts["image"]
    return judge_scores(pictures, list(prompts))
