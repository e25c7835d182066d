"""The GenEval-style evaluation of a shapes card: each category's accuracy, the overall score and the diversity.

``geneval(card)`` renders ``prompts`` fixed prompts of each category (``grammar.prompt_set``: the same
prompts for every card at the same ``seed``) from one split, ``samples`` seeds each, and judges every
picture under its category; like GenEval's table, ``overall`` is the mean of the six accuracies.
``diversity`` is the mean pairwise L2 distance between the seeds of a prompt (0: every seed gives the same
picture), over the ``colors`` prompts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxpipe.card import Card
from jaxpipe.generate import generate
from jaxpipe.progress import progress_bar
from jaxpipe.shapes.grammar import CATEGORIES, prompt_set
from jaxpipe.shapes.judging import correct, judge, score
from jaxpipe.training.runs.heldout import spread

__all__ = ["geneval", "render_prompts"]


def render_prompts(card: Card, texts: list[str], seeds: list[int], *, num_steps: int | None = None,
                   guidance: float | None = None, batch: int = 64,
                   on_batch: Callable[[int], None] | None = None) -> np.ndarray:
    """The card's images of ``texts``, ``seeds[i]`` for ``texts[i]``: ``(N, H, W, 3)``, ``batch`` per call.

    Args:
        card: a text-to-image card.
        texts: the prompts.
        seeds: one generation seed per prompt.
        num_steps: sampling steps (``None``: the card's default).
        guidance: guidance scale (``None``: the card's default).
        batch: prompts per ``generate`` call.
        on_batch: called with the number of images each call made (a progress bar's ``advance``).

    Returns:
        The images.
    """
    parts = []
    for start in range(0, len(texts), batch):
        out = generate(card, texts[start:start + batch], seed=seeds[start:start + batch], num_steps=num_steps,
                       guidance=guidance)
        parts.append(np.asarray(out["image"]))
        if on_batch is not None:
            on_batch(len(parts[-1]))
    return np.concatenate(parts)


def geneval(card: Card, *, split: str = "train", prompts: int = 32, samples: int = 2, seed: int = 0,
            num_steps: int | None = None, guidance: float | None = None, batch: int = 64,
            progress: bool = False) -> dict:
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

    Returns:
        ``{"split", "prompts", "samples", "accuracy": {category: float}, "overall": float, "score": float,
        "diversity": float, "images": int}``.

    Raises:
        ValueError: if ``samples < 2`` or ``prompts < 1``.
    """
    if samples < 2 or prompts < 1:
        raise ValueError(f"geneval needs prompts >= 1 and samples >= 2 (got {prompts}, {samples})")
    drawn = {c: prompt_set(c, prompts, split=split, seed=seed) for c in CATEGORIES}
    rows = [(c, p, 1000 * i + j) for c in CATEGORIES for i, p in enumerate(drawn[c]) for j in range(samples)]
    with progress_bar(total=len(rows), desc=f"{card.model_id} geneval {split}", disable=not progress) as shown:
        images = render_prompts(card, [p.text for _, p in rows], [s for *_, s in rows], num_steps=num_steps,
                                guidance=guidance, batch=batch, on_batch=shown.update)
    verdicts = [judge(image, p) for image, (_, p, _) in zip(images, rows)]
    accuracy = {c: float(np.mean([correct(v, c) for v, (k, _, _) in zip(verdicts, rows) if k == c])) for c in CATEGORIES}
    colours = np.asarray([image for image, (c, _, _) in zip(images, rows) if c == "colors"])
    return {
        "split": split, "prompts": prompts, "samples": samples, "accuracy": accuracy,
        "overall": float(np.mean(list(accuracy.values()))), "score": float(np.mean([score(v) for v in verdicts])),
        "diversity": spread(colours, len(drawn["colors"]), samples), "images": len(rows),
    }
