"""The shapes world's RL runs: FlowGRPO and DiffusionNFT on ``shapes-t2i`` with FlowGRPO's GenEval reward, judged
by GenEval's table on the test prompts and on the held-out colour-shape pairs.

What ``jaxpipe train flow-grpo|nft --world shapes`` trains (``register()`` puts the recipes in
``jaxpipe.training.runs.recipes``) and what ``benchmarks/geneval.py`` measures: the same prompt pool
(``training_prompts``: train-split prompts, no test prompt, no held-out pair), reward (``REWARDS``) and
evaluation (``geneval_quality``: every category, both splits, at the card's served guidance and steps).
By default each method trains with its preset that won the GenEval benchmark (``PRESETS``).
"""

from __future__ import annotations

import functools

import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict
from jaxpipe.prompts import PromptSet
from jaxpipe.shapes import evaluation, grammar
from jaxpipe.shapes.rewards import geneval_reward, judge_reward
from jaxpipe.training.methods.flow_grpo import FlowGRPO
from jaxpipe.training.methods.nft import DiffusionNFT
from jaxpipe.training.runs.recipes import Recipe, RunSettings, register_recipe
from jaxpipe.training.runs.run import Run

__all__ = [
    "EVAL_PROMPTS",
    "MIN_IMAGES",
    "PRESETS",
    "REWARDS",
    "geneval_quality",
    "register",
    "rl_run",
    "training_prompts",
]

WORLD = "shapes"
MODEL = "shapes-t2i"
REWARDS = {"geneval": geneval_reward, "judge": judge_reward}
"""The rewards a run may maximise: FlowGRPO's rule-based GenEval reward, or the fraction of the judge's checks passed."""
PRESETS = {"flow-grpo": "fast-nocfg", "nft": "geneval"}
"""Each method's default preset: the one that gained most on the GenEval benchmark (``benchmarks/RESULTS.md``)."""
METHODS = {"flow-grpo": FlowGRPO, "nft": DiffusionNFT}
EVAL_PROMPTS = 24
"""Prompts per category of the evaluation (the one-object categories have 12 seen texts, 6 held out)."""
MIN_IMAGES = 100
"""Images per category and split the evaluation renders at least (a 95% interval of about ±10 points at 50%)."""


def training_prompts(test_prompts: int = EVAL_PROMPTS, n: int = 4000) -> PromptSet:
    """The RL prompt pool: ``n`` train-split draws, the six categories equally (seed 100), less the test prompts of the
    categories with more than one thing (the one-thing categories have only 12 texts: all of them are test prompts).

    Args:
        test_prompts: the evaluation's prompts per category (``geneval``'s ``prompts``): those are left out.
        n: draws before duplicates and test prompts are dropped.

    Returns:
        The distinct prompts, in draw order (no held-out colour-shape pair: the train split never names one).
    """
    rng = np.random.default_rng(100)
    test = {
        p.text
        for c in grammar.CATEGORIES
        if c not in ("single_object", "colors")
        for p in grammar.prompt_set(c, test_prompts)
    }
    texts = [grammar.sample(grammar.CATEGORIES[i % 6], rng).text for i in range(n)]
    return PromptSet.from_list([t for t in dict.fromkeys(texts) if t not in test])


def geneval_quality(
    card: Card,
    *,
    prompts: int = EVAL_PROMPTS,
    min_images: int = MIN_IMAGES,
    seed_set: int = 0,
    should_stop=None,
) -> dict:
    """GenEval's table of ``card`` on both splits at its served guidance and steps (``evaluation.geneval``).

    Args:
        card: a shapes text-to-image card.
        prompts: prompts per category.
        min_images: images per category and split, at least.
        seed_set: the generation seeds (the prompts are the benchmark's, whatever the seed set).
        should_stop: polled between batches; ``Stopped`` once it is true.

    Returns:
        ``{"train": table, "heldout": table, "diversity": the test split's}`` (``evaluation.geneval``'s tables).
    """
    tables = evaluation.geneval_splits(
        card,
        prompts=prompts,
        samples=2,
        min_images=min_images,
        seed_set=seed_set,
        progress=True,
        should_stop=should_stop,
    )
    return {**tables, "diversity": tables["train"]["diversity"]}


def _change(before: dict, after: dict, *path: str) -> dict:
    b, a = before, after
    for key in path:
        b, a = b[key], a[key]
    return {"before": b, "after": a, "change": a - b}


def _headline(before: dict, after: dict) -> dict:
    return {
        "overall (test prompts)": _change(before, after, "train", "overall"),
        "overall (held-out pairs)": _change(before, after, "heldout", "overall"),
        "strict overall (test prompts)": _change(before, after, "train", "strict", "overall"),
        "position (test prompts)": _change(before, after, "train", "accuracy", "position"),
    }


CURVES = {
    "flow-grpo": {"reward.png": ("reward_mean",), "kl.png": ("kl",)},
    "nft": {"reward.png": ("reward_mean",), "loss.png": ("loss_pos", "loss_neg"), "old_policy.png": ("ema_decay",)},
}


def _check(settings: RunSettings) -> None:
    reward = settings.option("reward", "geneval")
    if reward not in REWARDS:
        raise ValueError(f"the shapes world's reward must be one of {', '.join(REWARDS)} (got {reward!r})")


def rl_run(method: str, card: Card, config, settings: RunSettings) -> Run:
    """``method`` (``"flow-grpo"`` or ``"nft"``) on shapes ``card`` with ``config``: the ``training_prompts`` stream,
    the ``reward`` option's reward, judged by ``geneval_quality`` before and after.

    Args:
        method: the ``jaxpipe train`` command.
        card: a shapes text-to-image card (``shapes-t2i``).
        config: the method's config (``FlowGRPOConfig`` / ``DiffusionNFTConfig``).
        settings: the run's settings; ``eval_samples``: the evaluation's prompts per category, 2 seeds each (``None``:
            ``EVAL_PROMPTS`` with at least ``MIN_IMAGES`` images per category and split, the benchmark's).

    Returns:
        The ``Run``, ready for ``execute``.

    Raises:
        ValueError: for an unknown ``reward`` option or a card the method cannot train.
    """
    _check(settings)
    reward_name = settings.option("reward", "geneval")
    # the default is the benchmark's evaluation; a size given judges that many prompts, 2 seeds each
    prompts = settings.eval_samples or EVAL_PROMPTS
    min_images = MIN_IMAGES if settings.eval_samples is None else 0
    pool = training_prompts(prompts)
    evaluate = None
    if settings.evaluate:
        evaluate = lambda c, stop=None: geneval_quality(  # noqa: E731
            c, prompts=prompts, min_images=min_images, seed_set=settings.eval_seed, should_stop=stop
        )
    return Run(
        name=method,
        method=METHODS[method](card, REWARDS[reward_name], config),
        batches=pool.batches(card, settings.prompts_per_step, seed=settings.seed),
        settings={
            "model": card.model_id,
            "world": WORLD,
            "prompts_per_step": settings.prompts_per_step,
            "prompts": f"{len(pool)} train-split prompts (no test prompt, no held-out pair)",
            "reward": reward_name,
            "config": config_to_dict(config),
            "evaluation": {
                "prompts_per_category": prompts,
                "min_images": min_images,
                "seed_set": settings.eval_seed,
            }
            if settings.evaluate
            else None,
        },
        evaluate=evaluate,
        curves=CURVES[method],
        headline=_headline,
    )


def register() -> None:
    """Register the shapes world's FlowGRPO and DiffusionNFT recipes."""
    for method in METHODS:
        register_recipe(
            Recipe(
                WORLD,
                method,
                build=functools.partial(rl_run, method),
                model=MODEL,
                preset=PRESETS[method],
                options={"reward": "geneval (FlowGRPO's rule-based GenEval reward, the default) or judge"},
                description=f"{method} on {MODEL}: GenEval reward, judged by GenEval's table on both splits",
                check_options=_check,
            )
        )
