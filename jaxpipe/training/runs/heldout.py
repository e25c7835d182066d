"""Runs on your own card, prompts and reward: a held-out evaluation and the ``Run`` builder ``jaxpipe train`` uses
with ``--prompts FILE --reward module:function``.

``HeldOut`` judges a card before and after training on prompts the run never trains on: each is
served by the card's own program (``jp.generate``, the serving path), the reward scores the
images against the prompts, and the diversity — the mean pairwise L2 distance between the images
of one prompt across seeds — shows mode collapse. The reward here is the TRAINING reward, so these
numbers cannot reveal reward hacking on their own; a world with an evaluator independent of the
reward (``jaxpipe.digits``) reports both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxpipe import rewards, validate
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict
from jaxpipe.generate import generate
from jaxpipe.prompts import Prompts, PromptSet
from jaxpipe.stopping import Stopped
from jaxpipe.training.runs.run import Run

__all__ = ["Judging", "HeldOut", "spread", "held_out_quality", "custom_run"]


@dataclasses.dataclass(frozen=True)
class Judging:
    """How much a before/after evaluation judges: ``samples`` prompts, the diversity over ``diversity_prompts``
    of them × ``diversity_seeds`` seeds, rendered ``batch`` at a time; ``seed`` fixes the prompts and the
    noise, the same before and after. A world's evaluation settings extend it (``digits.EvalSettings``)."""

    samples: int = 64
    diversity_prompts: int = 8
    diversity_seeds: int = 4
    seed: int = 0
    batch: int = 16

    def __post_init__(self):
        validate.counts(self, "samples", "diversity_prompts", "batch")
        validate.rule(
            not self.diversity_seeds < 2, f"diversity needs >= 2 seeds per prompt (got {self.diversity_seeds})"
        )


@dataclasses.dataclass(frozen=True)
class HeldOut(Judging):
    """The held-out evaluation of a run on the user's prompts (``Judging``), rendered at ``num_steps`` /
    ``guidance`` (``None``: the card's own)."""

    num_steps: int | None = None
    guidance: float | None = None


def spread(samples: np.ndarray, prompts: int, seeds: int) -> float:
    """Mean pairwise L2 distance between the ``seeds`` samples of each of ``prompts`` prompts.

    The diversity measure: near 0 when every seed of a prompt gives the same picture (mode collapse).

    Args:
      samples: ``(prompts * seeds, ...)`` array, rows prompt-major (the seeds of prompt 0, then of prompt 1, ...);
        each row is flattened and compared in float64.
      prompts: the number of prompts.
      seeds: samples per prompt, >= 2.

    Returns:
      The mean over prompts and over the ``seeds * (seeds - 1) / 2`` pairs of each, a Python float.
    """
    flat = np.asarray(samples).reshape(prompts, seeds, -1).astype(np.float64)
    dist = np.linalg.norm(flat[:, :, None] - flat[:, None, :], axis=-1)
    iu = np.triu_indices(seeds, k=1)
    return float(dist[:, iu[0], iu[1]].mean())


def _render(card: Card, texts: list[str], seeds: list[int], settings: HeldOut, should_stop) -> dict[str, np.ndarray]:
    parts: list[dict] = []
    for start in range(0, len(texts), settings.batch):
        if should_stop is not None and should_stop():
            raise Stopped()
        out = generate(
            card,
            texts[start : start + settings.batch],
            seed=seeds[start : start + settings.batch],
            num_steps=settings.num_steps,
            guidance=settings.guidance,
        )
        parts.append({k: np.asarray(v) for k, v in out.items() if not isinstance(v, (list, str))})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def held_out_quality(
    card: Card,
    reward: rewards.Reward,
    prompts: PromptSet,
    settings: HeldOut = HeldOut(),
    *,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """``card`` on held-out ``prompts``: the reward's mean (and each part's), its spread, and the diversity.

    The first ``settings.samples`` prompts are served by ``jp.generate`` (one fixed seed each, from
    ``settings.seed``) and scored by ``reward``; the diversity is ``spread`` over the first
    ``settings.diversity_prompts`` of them, each rendered with ``settings.diversity_seeds`` other seeds.

    Args:
      card: the card judged.
      reward: the reward, ``reward(artifacts, prompts) -> (B,)`` (a combined one also gives its parts).
      prompts: the held-out prompts (only as many as ``settings.samples`` are used).
      settings: how many prompts, seeds, batch size and rendering settings.
      should_stop: checked before each rendered batch; when it returns true the evaluation stops.

    Returns:
      ``{"samples": int, "reward_mean": float, "reward_std": float, "reward_parts": {name: mean},
      "diversity": float, "eval_seconds": float}``.

    Raises:
      Stopped: if ``should_stop()`` turns true before a batch.
    """
    start = time.perf_counter()
    chosen = prompts.take(np.arange(min(settings.samples, len(prompts))))
    texts = list(chosen.texts)
    seeds = [settings.seed * 100_003 + i for i in range(len(texts))]
    artifacts = _render(card, texts, seeds, settings, should_stop)
    rows = Prompts.from_texts(card, texts, dict(chosen.metadata), width=prompts.width)
    total, parts = rewards.score(
        reward, {k: artifacts[k] for k in artifacts if k in ("image", "video", "latents")}, rows
    )
    n, k = min(settings.diversity_prompts, len(texts)), settings.diversity_seeds
    repeated = [t for t in texts[:n] for _ in range(k)]
    noise = [settings.seed * 100_003 + 500_000 + i for i in range(len(repeated))]
    rendered = _render(card, repeated, noise, settings, should_stop)
    picture = rendered["video"] if "video" in rendered else rendered["image"]
    return {
        "samples": len(texts),
        "reward_mean": float(np.mean(total)),
        "reward_std": float(np.std(total)),
        "reward_parts": {name: float(np.mean(v)) for name, v in parts.items()},
        "diversity": spread(picture, n, k),
        "eval_seconds": time.perf_counter() - start,
    }


def _change(before: Mapping[str, Any], after: Mapping[str, Any], key: str) -> dict:
    return {"before": before[key], "after": after[key], "change": after[key] - before[key]}


def custom_run(
    name: str,
    method: Any,
    card: Card,
    train: PromptSet,
    *,
    prompts_per_step: int,
    seed: int,
    config: Any,
    reward: rewards.Reward | None = None,
    heldout: PromptSet | None = None,
    evaluation: HeldOut | None = HeldOut(),
    curves: Mapping[str, tuple[str, ...]] | None = None,
) -> Run:
    """A ``Run`` of ``method`` on ``card`` over the user's ``train`` prompts (batches of ``prompts_per_step``,
    epochs shuffled by ``seed``), judged on ``heldout`` by ``reward`` (when both are given and
    ``evaluation`` is not ``None``): the held-out reward before and after, and the diversity.

    Args:
      name: the method's command name (``"flow-grpo"``), the run's name in its report.
      method: the training method: ``init(key)``, ``step(state, batch, key)``, ``card(state)``.
      card: the card trained.
      train: the training prompts.
      prompts_per_step: prompts per batch.
      seed: the seed of the epochs' shuffles.
      config: the method's config (a dataclass), recorded in the run's settings.
      reward: the reward the held-out evaluation scores with, or ``None`` (no evaluation).
      heldout: the held-out prompts, or ``None`` (no evaluation).
      evaluation: the held-out evaluation's settings, or ``None`` to skip it.
      curves: PNG file name -> metric keys drawn in it (default: ``{"reward.png": ("reward_mean",)}``).

    Returns:
      The ``Run``, ready for ``execute``; its headline is the held-out reward's change
      (``{"heldout_reward": {"before", "after", "change"}}``).
    """
    evaluate = None
    if evaluation is not None and reward is not None and heldout is not None:
        evaluate = lambda c, stop=None: held_out_quality(c, reward, heldout, evaluation, should_stop=stop)
    settings = {
        "model": card.model_id,
        "prompts_per_step": prompts_per_step,
        "prompts": {"source": train.source, "train": len(train), "heldout": 0 if heldout is None else len(heldout)},
        "reward": getattr(reward, "__name__", repr(reward)) if reward is not None else None,
        "config": config_to_dict(config),
        "evaluation": None if evaluation is None else dataclasses.asdict(evaluation),
    }
    return Run(
        name=name,
        method=method,
        batches=train.batches(card, prompts_per_step, seed=seed),
        settings=settings,
        evaluate=evaluate,
        curves=curves or {"reward.png": ("reward_mean",)},
        headline=lambda before, after: {"heldout_reward": _change(before, after, "reward_mean")},
        summary_keys=("reward_mean",),
    )
