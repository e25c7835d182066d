"""The GenEval-style evaluation of a shapes card: each category's accuracy, the overall score and the diversity.

``geneval(card)`` renders ``prompts`` fixed prompts of each category (``grammar.prompt_set``: the same
prompts for every card at the same ``seed``) from one split, ``samples`` seeds each (more where a category
has fewer than ``min_images`` images), and judges every picture under its category twice: by GenEval's own
rule (``geneval_rule``: at least the named objects; the headline) and by the strict rule (``judging.correct``:
exactly them). Like GenEval's table, ``overall`` is the mean of the six accuracies; each comes with its 95%
interval (Wilson per category; the overall's from the six cells' variances), so a gain can be told from noise.
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
from jaxpipe.shapes.geneval_rule import geneval_correct
from jaxpipe.shapes.grammar import CATEGORIES, SPLITS, prompt_set, sample_video
from jaxpipe.shapes.judging import checks_of, correct, detect, judge_video, score
from jaxpipe.stopping import Stopped
from jaxpipe.training.runs.heldout import spread

__all__ = ["geneval", "geneval_splits", "interval", "judge_cards", "render_prompts", "video_quality"]


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


def interval(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``right / n`` (95% at ``z = 1.96``).

    Args:
        right: how many were right.
        n: how many were judged (> 0).
        z: the normal quantile of the interval's level.

    Returns:
        ``(low, high)`` in ``[0, 1]``.
    """
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(centre - half, 0.0)), float(min(centre + half, 1.0))


def _table(right: dict[str, list[bool]]) -> dict:
    """Per-category accuracy and 95% interval, the overall (their mean) and its normal-approximation interval."""
    accuracy = {c: float(np.mean(v)) for c, v in right.items()}
    overall = float(np.mean(list(accuracy.values())))
    # the six cells are independent samples: Var(mean) = sum p(1 - p) / n_c / 36
    half = 1.96 * np.sqrt(sum(a * (1 - a) / len(right[c]) for c, a in accuracy.items())) / len(accuracy)
    return {
        "accuracy": accuracy,
        "interval": {c: interval(int(np.sum(v)), len(v)) for c, v in right.items()},
        "overall": overall,
        "overall_interval": (float(max(overall - half, 0.0)), float(min(overall + half, 1.0))),
    }


def geneval(
    card: Card,
    *,
    split: str = "train",
    prompts: int = 32,
    samples: int = 2,
    min_images: int = 0,
    seed: int = 0,
    seed_set: int = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    batch: int = 64,
    progress: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """GenEval's table for ``card``: per-category accuracy by GenEval's rule (``geneval_rule``: at least the named
    objects) and by the strict rule (``judging.correct``: exactly them), each with its 95% interval, ``overall``
    (the mean of the six), the judge's mean partial score and the diversity.

    Args:
        card: a text-to-image card of the shapes vocabulary.
        split: ``"train"`` (the test prompts: seen colour-shape pairs) or ``"heldout"`` (held-out pairs).
        prompts: prompts per category (``prompt_set(category, prompts, split=split, seed=seed)``; the one-object
            categories have fewer texts than that).
        samples: seeds per prompt (>= 2 for the diversity).
        min_images: a category with fewer than this many images (prompts × samples) takes more seeds per prompt.
        seed: picks the prompts.
        seed_set: picks the generation seeds: prompt ``i``'s are ``1000 * i + j + 100_000 * seed_set``.
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: images per ``generate`` call.
        progress: show a progress bar.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``{"split", "prompts", "samples": {category: seeds per prompt}, "accuracy": {category: float},
        "interval": {category: (low, high)}, "overall", "overall_interval", "strict": {the same four keys},
        "score", "diversity", "images": {category: int}}``.

    Raises:
        ValueError: if ``samples < 2`` or ``prompts < 1``.
        Stopped: once ``should_stop()`` is true.
    """
    if samples < 2 or prompts < 1:
        raise ValueError(f"geneval needs prompts >= 1 and samples >= 2 (got {prompts}, {samples})")
    drawn = {c: prompt_set(c, prompts, split=split, seed=seed) for c in CATEGORIES}
    per = {c: max(samples, -(-min_images // len(drawn[c]))) for c in CATEGORIES}
    rows = [
        (c, p, 1000 * i + j + 100_000 * seed_set)
        for c in CATEGORIES
        for i, p in enumerate(drawn[c])
        for j in range(per[c])
    ]
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
    found = [detect(image) for image in images]
    side = images.shape[1]
    lenient = {c: [] for c in CATEGORIES}
    strict = {c: [] for c in CATEGORIES}
    scores = []
    for detections, (c, p, _) in zip(found, rows):
        checks = checks_of(detections, p)
        strict[c].append(correct(checks, c))
        lenient[c].append(geneval_correct(detections, p, c, side=side))
        scores.append(score(checks))
    colours = np.asarray([image for image, (c, _, _) in zip(images, rows) if c == "colors"])
    return {
        "split": split,
        "prompts": prompts,
        "samples": per,
        **_table(lenient),
        "strict": _table(strict),
        "score": float(np.mean(scores)),
        "diversity": spread(colours, len(drawn["colors"]), per["colors"]),
        "images": {c: len(v) for c, v in strict.items()},
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


def geneval_splits(card: Card, **settings) -> dict:
    """GenEval's table of ``card`` on each split (``grammar.SPLITS``: the test prompts, the held-out pairs).

    Args:
        card: a shapes text-to-image card.
        **settings: ``geneval``'s keyword arguments but ``split``.

    Returns:
        ``{split: geneval table}``.
    """
    return {split: geneval(card, split=split, **settings) for split in SPLITS}


def judge_cards(t2i: Card, t2v: Card, *, samples: int = 24, **common) -> dict:
    """``jaxpipe evaluate``'s shapes report: GenEval's table of ``t2i`` and the motion of ``t2v``, on both splits.

    Args:
      t2i: a shapes text-to-image card.
      t2v: a shapes text-to-video card.
      samples: prompts per category of the table (the video measure: twice as many prompts).
      **common: ``seed``, ``num_steps``, ``guidance``, ``progress``, ``should_stop`` for both.

    Returns:
      ``{"t2i": {split: table}, "t2v": {split: video_quality}}``.
    """
    return {
        "t2i": geneval_splits(t2i, prompts=samples, **common),
        "t2v": {split: video_quality(t2v, split=split, prompts=2 * samples, **common) for split in SPLITS},
    }
