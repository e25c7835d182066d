"""The GenEval-style evaluation of a shapes card: each category's accuracy, the overall score and the diversity.

``geneval(card)`` renders ``prompts`` fixed prompts of each category (``grammar.prompt_set``: the same
prompts for every card at the same ``seed``) from one split, ``samples`` seeds each, and judges every
picture under its category; like GenEval's table, ``overall`` is the mean of the six accuracies.
``diversity`` is the mean pairwise L2 distance between the seeds of a prompt (0: every seed gives the same
picture), over the ``colors`` prompts. ``video_quality(card)`` judges a text-to-video card's motion and
identity.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxpipe.card import Card
from jaxpipe.generate import generate
from jaxpipe.progress import progress_bar
from jaxpipe.shapes.grammar import CATEGORIES, prompt_set, sample_video
from jaxpipe.shapes.judging import correct, judge, judge_video, score
from jaxpipe.stopping import Stopped
from jaxpipe.training.runs.heldout import spread

__all__ = ["geneval", "render_prompts", "video_quality"]


def render_prompts(
    card: Card,
    texts: list[str],
    seeds: list[int],
    *,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 64,
    on_batch: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> np.ndarray:
    """The card's images of ``texts``, ``seeds[i]`` for ``texts[i]``: ``(N, H, W, 3)``, ``batch`` per call.

    Args:
        card: a text-to-image card.
        texts: the prompts.
        seeds: one generation seed per prompt.
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: prompts per ``generate`` call.
        on_batch: called with the number of images each call made (a progress bar's ``update``).
        should_stop: polled before each call; once it returns True, ``Stopped`` is raised.

    Returns:
        The images.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    parts = []
    for start in range(0, len(texts), batch):
        if should_stop is not None and should_stop():
            raise Stopped()
        out = generate(
            card,
            texts[start : start + batch],
            seed=seeds[start : start + batch],
            num_steps=num_steps,
            guidance=guidance,
        )
        parts.append(np.asarray(out["image"]))
        if on_batch is not None:
            on_batch(len(parts[-1]))
    return np.concatenate(parts)


def geneval(
    card: Card,
    *,
    split: str = "train",
    prompts: int = 32,
    samples: int = 2,
    seed: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 64,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """GenEval's table for ``card``: per-category accuracy, ``overall`` (their mean), the judge's mean partial
    score and the diversity, on ``prompts`` prompts per category × ``samples`` seeds.

    Args:
        card: a text-to-image card of the shapes vocabulary.
        split: ``"train"`` (the test prompts: seen colour-shape pairs) or ``"heldout"`` (held-out pairs).
        prompts: prompts per category (``prompt_set(category, prompts, split=split, seed=seed)``).
        samples: seeds per prompt (>= 2 for the diversity); prompt ``i``'s seeds are ``1000 * i + j``.
        seed: picks the prompts.
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: images per ``generate`` call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``{"split", "prompts", "samples", "accuracy": {category: float}, "overall": float, "score": float,
        "diversity": float, "images": int}``.

    Raises:
        ValueError: if ``samples < 2`` or ``prompts < 1``.
        Stopped: once ``should_stop()`` is true.
    """
    if samples < 2 or prompts < 1:
        raise ValueError(f"geneval needs prompts >= 1 and samples >= 2 (got {prompts}, {samples})")
    drawn = {c: prompt_set(c, prompts, split=split, seed=seed) for c in CATEGORIES}
    rows = [(c, p, 1000 * i + j) for c in CATEGORIES for i, p in enumerate(drawn[c]) for j in range(samples)]
    with progress_bar(total=len(rows), desc=f"{card.model_id} geneval {split}", disable=not progress) as shown:
        images = render_prompts(
            card,
            [p.text for _, p, _ in rows],
            [s for *_, s in rows],
            num_steps=num_steps,
            guidance=guidance,
            batch=batch,
            on_batch=shown.update,
            should_stop=should_stop,
        )
    verdicts = [judge(image, p) for image, (_, p, _) in zip(images, rows)]
    accuracy = {
        c: float(np.mean([correct(v, c) for v, (k, _, _) in zip(verdicts, rows) if k == c])) for c in CATEGORIES
    }
    colours = np.asarray([image for image, (c, _, _) in zip(images, rows) if c == "colors"])
    return {
        "split": split,
        "prompts": prompts,
        "samples": samples,
        "accuracy": accuracy,
        "overall": float(np.mean(list(accuracy.values()))),
        "score": float(np.mean([score(v) for v in verdicts])),
        "diversity": spread(colours, len(drawn["colors"]), samples),
        "images": len(rows),
    }


def video_quality(
    card: Card,
    *,
    split: str = "train",
    prompts: int = 48,
    seed: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 16,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """A text-to-video card on ``prompts`` random video prompts of ``split`` (one seed each): how often every
    thing moves as told (``motion``), is drawn right in the first and last frames (``identity``: count,
    shapes and colours), and both (``all_right``).

    Args:
        card: a text-to-video card of the shapes vocabulary.
        split: ``"train"`` or ``"heldout"``.
        prompts: how many prompts (``grammar.sample_video``, drawn by ``seed``).
        seed: picks the prompts; prompt ``i`` renders with seed ``i``.
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: videos per ``generate`` call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``{"split", "prompts", "motion", "identity", "all_right"}``, fractions in ``[0, 1]``.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    rng = np.random.default_rng([seed, 7])
    drawn = [sample_video(rng, split) for _ in range(prompts)]
    videos = []
    with progress_bar(total=prompts, desc=f"{card.model_id} videos {split}", disable=not progress) as shown:
        for start in range(0, prompts, batch):
            if should_stop is not None and should_stop():
                raise Stopped()
            chunk = drawn[start : start + batch]
            out = generate(
                card,
                [p.text for p in chunk],
                seed=list(range(start, start + len(chunk))),
                num_steps=num_steps,
                guidance=guidance,
            )
            videos.append(np.asarray(out["video"]))
            shown.update(len(chunk))
    checks = [judge_video(v, p) for v, p in zip(np.concatenate(videos), drawn)]
    identity = [c["count"] and c["colour"] for c in checks]
    return {
        "split": split,
        "prompts": prompts,
        "motion": float(np.mean([c["motion"] for c in checks])),
        "identity": float(np.mean(identity)),
        "all_right": float(np.mean([correct(c, "video") for c in checks])),
    }
