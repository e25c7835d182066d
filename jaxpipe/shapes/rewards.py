"""The analytic judge as an RL reward: each picture's fraction of checks passed against its prompt.

``judge_reward`` is a host reward (``jaxpipe.rewards.host``): the rollout's pictures come to NumPy,
the judge reads them and the scores go back into the jitted step. A run rewarded by it is measured by the
same judge; it has no weights to hack, only its checks (reports say so). ``geneval_reward`` is the reward
FlowGRPO trains on GenEval with (``geneval_rule.geneval_score``: GenEval's rule with its paper's partial
credit), on the same detections.
"""

from __future__ import annotations

import numpy as np

from jaxpipe import rewards
from jaxpipe.shapes.geneval_rule import geneval_score
from jaxpipe.shapes.grammar import parse
from jaxpipe.shapes.judging import detect, judge, judge_video, score

__all__ = ["judge_reward", "judge_scores", "geneval_reward", "geneval_scores"]


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


def geneval_scores(pictures: np.ndarray, texts: list[str]) -> np.ndarray:
    """``(B,)`` float32: each picture's ``geneval_rule.geneval_score`` against its prompt text.

    Args:
        pictures: ``(B, H, W, 3)`` images in ``[0, 1]``.
        texts: the ``B`` prompt texts (each judged under the strictest category of its form).

    Returns:
        The scores in ``[0, 1]``.

    Raises:
        ValueError: if the counts differ, the pictures are videos, or a text is not in the grammar.
    """
    pictures = np.asarray(pictures)
    if len(pictures) != len(texts):
        raise ValueError(f"{len(pictures)} pictures for {len(texts)} prompts")
    if pictures.ndim != 4:
        raise ValueError(f"geneval_scores reads images (B, H, W, 3), got shape {pictures.shape}")
    side = pictures.shape[1]
    return np.asarray([geneval_score(detect(p), parse(t), side=side) for p, t in zip(pictures, texts)], np.float32)


@rewards.host
def geneval_reward(artifacts, prompts) -> np.ndarray:
    """FlowGRPO's GenEval reward of a rollout: ``artifacts["image"]`` ``(B, H, W, 3)`` against the ``B`` prompt
    texts, ``(B,)`` in ``[0, 1]`` (``geneval_scores``)."""
    return geneval_scores(artifacts["image"], list(prompts))
