"""Measured quality (C4) of the digits world's video cards: motion as prompted, the digit in the frames (by the
``digit-scorer`` card and the independent evaluators) and, image-to-video, how closely frame 0 matches the
conditioning image.
"""

from __future__ import annotations

import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer
from jaxpipe.digits.evaluators import Evaluator, default_evaluator
from jaxpipe.digits.sampling import check_samples, header, in_batches, item_seeds, rendering
from jaxpipe.generate import generate
from jaxpipe.progress import progress_bar

__all__ = [
    "i2v_quality",
    "t2v_quality",
    "ink_centroids",
    "moves_as_told",
    "MOTION_THRESHOLD_PX",
    "FIRST_FRAME_TOLERANCE",
]

MOTION_THRESHOLD_PX = 1.0
"""A video 'moves' in a direction when its centroid travels more than this many pixels that way."""

FIRST_FRAME_TOLERANCE = 0.1
"""Frame 0 'matches' the conditioning image when their mean absolute difference (in [0, 1]) is below this."""


def ink_centroids(video: np.ndarray) -> np.ndarray:
    """Ink centroids ``(..., T, 2)`` as (row, col) of videos ``(..., T, H, W, 1)`` in [0, 1] (background 0).

    Args:
        video: videos ``(..., T, H, W, 1)`` in ``[0, 1]``, background 0 (negative values count as no ink).

    Returns:
        The centroids, float64 ``(..., T, 2)``, in px from the top-left pixel's centre.
    """
    ink = np.clip(np.asarray(video, np.float64)[..., 0], 0.0, None)
    h, w = ink.shape[-2:]
    mass = ink.sum(axis=(-2, -1)) + 1e-8
    rows = (ink * np.arange(h)[:, None]).sum(axis=(-2, -1)) / mass
    cols = (ink * np.arange(w)[None, :]).sum(axis=(-2, -1)) / mass
    return np.stack([rows, cols], axis=-1)


def moves_as_told(displacement: np.ndarray, motion: np.ndarray) -> np.ndarray:
    """``(N,)`` bool: centroid ``displacement`` ``(N, 2)`` (dy, dx in px) moved as ``motion`` ``(N,)`` (indices of
    ``digits.MOTION_NAMES``) says: more than ``MOTION_THRESHOLD_PX`` that way, or less than it for ``still``.

    Args:
        displacement: the centroid's travel, ``(N, 2)`` as (dy, dx) in px (e.g. last frame minus first).
        motion: the prompted motions, ``(N,)`` int indices of ``digits.MOTION_NAMES``.

    Returns:
        ``(N,)`` bool (False for an unknown motion index).
    """
    dy, dx = displacement[:, 0], displacement[:, 1]
    t = MOTION_THRESHOLD_PX
    checks = {
        0: dx < -t,  # left
        1: dx > t,  # right
        2: dy < -t,  # up
        3: dy > t,  # down
        4: np.hypot(dx, dy) < t,  # still
    }
    return np.select([motion == m for m in checks], [checks[m] for m in checks], False)


def _by_direction(ok: np.ndarray, motion: np.ndarray) -> dict[str, float]:
    """The fraction of ``ok`` ``(N,)`` among the videos prompted with each motion ``(N,)`` that occurs."""
    return {name: float(np.mean(ok[motion == m])) for m, name in enumerate(digits.MOTION_NAMES) if np.any(motion == m)}


def i2v_quality(
    i2v: Card,
    scorer: Card | None = None,
    *,
    samples: int = 100,
    evaluator: Evaluator | None = None,
    **render,
) -> dict:
    """Motion, first-frame fidelity and identity of ``samples`` videos conditioned on real held-out digits
    (``progress``, ``should_stop`` and ``evaluator`` as in ``t2i_quality``).

    The reference is the ideal video (the conditioning frame translated as prompted), so
    ``video_mae`` measures how well the digit keeps its shape while it moves; with a ``scorer``,
    ``last_frame_digit_accuracy`` is how often the last frame still reads as the prompted digit (and, under
    ``"independent"``, how often ``evaluator``'s classifier reads it so).

    Args:
        i2v: an image-to-video card.
        scorer: a ``digit-scorer`` card (``None``: no digit accuracies).
        samples: videos, each conditioned on a different held-out digit (at most the split's 359).
        evaluator: the independent judge, used with a ``scorer`` (default: ``evaluators.default_evaluator()``).
        **render: how the items are rendered (``sampling.Rendering``: ``seed``, ``num_steps``, ``guidance``,
            ``batch`` (default 50), ``progress``, ``should_stop``).

    Returns:
        ``{"samples", "num_steps", "guidance", "motion_accuracy", "motion_accuracy_by_direction": {motion: float},
        "first_frame_mae", "first_frame_match", "video_mae"}``, plus with a ``scorer``
        ``"last_frame_digit_accuracy"`` and ``"independent": {"last_frame_digit_accuracy"}``; errors in ink units.

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    seed, num_steps, guidance, batch, progress, should_stop = rendering(render, batch=50)
    check_samples(samples)
    images, labels = digits.load_images("heldout")
    pick = np.random.default_rng(seed).permutation(len(images))[:samples]
    reference = digits.make_videos(images[pick], labels[pick], seed=seed)
    first = (reference.video[:, 0] + 1.0) / 2.0
    prompts = list(reference.caption)
    with progress_bar(total=len(prompts), desc=f"{i2v.model_id} videos", disable=not progress) as bar:
        videos = in_batches(
            lambda s: generate(
                i2v,
                prompts[s],
                image=first[s],
                seed=item_seeds(seed, s.start, s.stop),
                num_steps=num_steps,
                guidance=guidance,
            )["video"],
            len(prompts),
            batch,
            bar,
            should_stop,
        )
    centroids = ink_centroids(videos)
    ok = moves_as_told(centroids[:, -1] - centroids[:, 0], reference.motion)
    frame_error = np.abs(videos[:, 0] - first).mean(axis=(1, 2, 3))
    ideal = (reference.video + 1.0) / 2.0
    extra = {}
    if scorer is not None:
        last = digit_scorer.predict(scorer, videos[:, -1] * 2.0 - 1.0)["digit"]
        extra["last_frame_digit_accuracy"] = float(np.mean(np.asarray(last) == reference.digit))
        independent = (evaluator or default_evaluator()).predict(videos[:, -1])
        extra["independent"] = {"last_frame_digit_accuracy": float(np.mean(independent == reference.digit))}
    per_motion = _by_direction(ok, reference.motion)
    return {
        **header(i2v, len(prompts), num_steps, guidance),
        "motion_accuracy": float(np.mean(ok)),
        "motion_accuracy_by_direction": per_motion,
        "first_frame_mae": float(np.mean(frame_error)),
        "first_frame_match": float(np.mean(frame_error < FIRST_FRAME_TOLERANCE)),
        "video_mae": float(np.mean(np.abs(videos - ideal))),
        **extra,
    }


def _reasons(card: Card) -> bool:
    """Whether the card's program returns a reasoned caption (``reasoned_text``, e.g. ``cosmos3``)."""
    return any(name == "reasoned_text" for name, _ in registry.default_program(card).texts)


def t2v_quality(
    card: Card,
    scorer: Card,
    *,
    samples: int = 100,
    evaluator: Evaluator | None = None,
    **render,
) -> dict:
    """Text-to-video (``wan-t2v``, ``ltx2-two-stage``, ``wan22-moe``, ``wan-causal``, ``cosmos3``), judged by
    motion, by ``scorer`` and, under ``"independent"``, by ``evaluator``'s digit classifier (``progress``,
    ``should_stop`` and ``evaluator`` as in ``t2i_quality``).

    ``full``: prompts naming digit and motion (``"seven moving right"``): the video moves as told
    (overall and per direction) and shows the digit (first and last frame). Cards that reason a
    caption first (``cosmos3``) are also judged on ``digit_only``: the prompt names the digit alone
    and the card reasons a motion: how often the reasoned caption names one, and how often the
    video moves as its own reasoning says.

    Args:
        card: a text-to-video card.
        scorer: a ``digit-scorer`` card.
        samples: random prompts per mode.
        evaluator: the independent judge (default: ``evaluators.default_evaluator()``).
        **render: how the items are rendered (``sampling.Rendering``: ``seed``, ``num_steps``, ``guidance``,
            ``batch`` (default 50), ``progress``, ``should_stop``).

    Returns:
        ``{"samples", "num_steps", "guidance", "full": {...}}`` and, for a reasoning card, ``"digit_only"``. Each mode
        holds ``first_frame_digit_accuracy``, ``last_frame_digit_accuracy``, ``independent`` (the same two by
        ``evaluator``) and, for a reasoning card, ``examples``; ``full`` adds ``motion_accuracy`` and
        ``motion_accuracy_by_direction``, ``digit_only`` adds ``reasoned_a_motion`` and ``follows_its_reasoning``.

    Raises:
        ValueError: if ``samples`` <= 0.
        Stopped: once ``should_stop()`` is true.
    """
    seed, num_steps, guidance, batch, progress, should_stop = rendering(render, batch=50)
    check_samples(samples)
    rng = np.random.default_rng(seed)
    digit = rng.integers(0, 10, samples)
    motion = rng.integers(0, len(digits.MOTION_NAMES), samples)
    seeds = item_seeds(seed, 0, samples)
    out = header(card, samples, num_steps, guidance)
    modes = [("full", [digits.caption(int(d), motion=int(m)) for d, m in zip(digit, motion)])]
    reasons = _reasons(card)
    if reasons:
        modes.append(("digit_only", [digits.caption(int(d)) for d in digit]))
    judge = evaluator or default_evaluator()
    with progress_bar(total=len(modes) * samples, desc=f"{card.model_id} videos", disable=not progress) as bar:
        for mode, prompts in modes:
            texts: list[str] = []

            def render(s, prompts=prompts, texts=texts):
                res = generate(card, prompts[s], seed=seeds[s], num_steps=num_steps, guidance=guidance)
                if reasons:
                    texts.extend(res["reasoned_text"])
                return res["video"]

            videos = in_batches(render, samples, batch, bar, should_stop)
            centroids = ink_centroids(videos)
            first = np.asarray(digit_scorer.predict(scorer, videos[:, 0] * 2.0 - 1.0)["digit"])
            last = np.asarray(digit_scorer.predict(scorer, videos[:, -1] * 2.0 - 1.0)["digit"])
            result = {
                "first_frame_digit_accuracy": float(np.mean(first == digit)),
                "last_frame_digit_accuracy": float(np.mean(last == digit)),
                "independent": {
                    f"{name}_frame_digit_accuracy": float(np.mean(judge.predict(videos[:, t]) == digit))
                    for name, t in (("first", 0), ("last", -1))
                },
            }
            if reasons:
                result["examples"] = texts[:5]
            if mode == "full":
                ok = moves_as_told(centroids[:, -1] - centroids[:, 0], motion)
                result["motion_accuracy"] = float(np.mean(ok))
                result["motion_accuracy_by_direction"] = _by_direction(ok, motion)
            else:
                said = np.array(
                    [digits.parse_caption(t)["motion"] if _parses(t) else None for t in texts], dtype=object
                )
                named = np.array([m is not None for m in said])
                told = np.where(named, [m if m is not None else 0 for m in said], 0).astype(int)
                follows = moves_as_told(centroids[:, -1] - centroids[:, 0], told) & named
                result.update(reasoned_a_motion=float(np.mean(named)), follows_its_reasoning=float(np.mean(follows)))
            out[mode] = result
    return out


def _parses(text: str) -> bool:
    try:
        digits.parse_caption(text)
    except ValueError:
        return False
    return True
