"""RL runs on the digits world, shared by ``jaxpipe train`` and the examples (DESIGN §5, §9, §10).

A ``Run`` bundles a trainer (``init``, jitted ``step``, ``card(state)``), an endless stream of
prompt batches, a before/after evaluation and the curves to draw. ``execute`` trains it with
``fit`` (progress bar, ``DIR/metrics.jsonl``: one JSON object per step) and writes
``DIR/*.png`` (curves), ``DIR/report.json`` and the trained card (``DIR/config.json`` +
``DIR/weights.safetensors``, so ``jp.cards.load(DIR)`` loads it back). ``flow_grpo_run`` and
``unified_run`` build the two runs; another method needs only its own builder.

Prompts (``PromptSpec``): a random digit plus, for each rewarded attribute, its word with
probability ``mention``. A rewarded attribute the prompt leaves out is labelled with its
preferred value from ``prefer`` when there is one (a preference a refiner LM can learn to ask
for), else -1 (not rewarded).

Evaluation is judged by the ``digit-scorer`` at guidance 1 and the RL step count: GenEval-style
"every prompted attribute right", and sample diversity, the mean pairwise L2 distance between
images of one prompt across seeds. A diversity drop of more than ``DIVERSITY_COLLAPSE`` is mode
collapse (reward hacking): the report calls the run FAILED whatever the reward did.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import quality
from jaxpipe.card import Card
from jaxpipe.cards import common, digit_scorer, flux_t2i, multi_expert, unified
from jaxpipe.checkpoint import config_to_dict, save_card
from jaxpipe.data import digits
from jaxpipe.io import plot_curves
from jaxpipe.training.fit import fit
from jaxpipe.training.flow_grpo import REWARD_TERMS, FlowGRPO, FlowGRPOConfig, scorer_reward, scorer_reward_parts
from jaxpipe.training.joint_rl import JointMultiExpertRL, JointRLConfig
from jaxpipe.training.unified_rl import UnifiedRL, UnifiedRLConfig

__all__ = [
    "DIVERSITY_COLLAPSE",
    "PromptSpec",
    "Prompts",
    "EvalSettings",
    "Run",
    "parse_terms",
    "parse_preferences",
    "sample_prompts",
    "prompt_batches",
    "render",
    "judge",
    "diversity",
    "generator_quality",
    "refinement_quality",
    "flow_grpo_run",
    "unified_run",
    "joint_run",
    "execute",
]

DIVERSITY_COLLAPSE = 0.30
"""A relative drop in sample diversity larger than this is collapse: the run failed."""


# ------------------------------------------------------------------------------------------------ prompts
@dataclasses.dataclass(frozen=True)
class PromptSpec:
    """Which prompts a run draws and which labels the reward scores.

    terms: reward terms (``REWARD_TERMS``; must include ``"digit"``: every prompt names one).
    mention: probability that a prompt names each rewarded attribute (1 = full compositional prompts).
    prefer: ``(attribute, label)`` pairs: the label rewarded when the prompt leaves that attribute out.
    """

    terms: tuple[str, ...] = REWARD_TERMS
    mention: float = 1.0
    prefer: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        unknown = [t for t in self.terms if t not in REWARD_TERMS]
        if unknown or not self.terms:
            raise ValueError(f"unknown reward term(s) {unknown or list(self.terms)}; choose from {', '.join(REWARD_TERMS)}")
        if len(set(self.terms)) != len(self.terms):
            raise ValueError(f"reward terms are named twice: {list(self.terms)}")
        if "digit" not in self.terms:
            raise ValueError("the reward terms must include digit (every prompt names a digit)")
        if not 0.0 <= self.mention <= 1.0:
            raise ValueError(f"mention is a probability in [0, 1] (got {self.mention})")
        seen = set()
        for name, label in self.prefer:
            if name not in digits.ATTRIBUTES:
                raise ValueError(f"cannot prefer {name!r}: preferences are over {', '.join(digits.ATTRIBUTES)}")
            if name in seen:
                raise ValueError(f"{name} is preferred twice")
            seen.add(name)
            words = digits.ATTRIBUTE_WORDS[name]
            if not 0 <= int(label) < len(words):
                raise ValueError(f"preferred {name} must be one of {', '.join(words)} (got label {label})")
            if name not in self.terms:
                raise ValueError(f"preferring a {name} needs {name} among the reward terms (terms: {', '.join(self.terms)})")
        if self.prefer and self.mention >= 1.0:
            raise ValueError("a preference applies only to prompts that leave the attribute out; with mention 1 every prompt names it")

    @property
    def preferences(self) -> dict[str, int]:
        return {name: int(label) for name, label in self.prefer}

    @property
    def max_words(self) -> int:
        """The longest prompt this spec draws (digit + every rewarded attribute)."""
        return 1 + sum(a in self.terms for a in digits.ATTRIBUTES) if self.mention > 0 else 1

    def describe(self) -> dict:
        prefer = {name: digits.ATTRIBUTE_WORDS[name][label] for name, label in self.prefer}
        return {"terms": list(self.terms), "mention": self.mention, "prefer": prefer}


def parse_terms(text: str) -> tuple[str, ...]:
    """``"digit,stroke"`` -> ``("digit", "stroke")`` (validated by ``PromptSpec``)."""
    terms = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in terms if t not in REWARD_TERMS]
    if unknown or not terms:
        raise ValueError(f"unknown reward term(s) {unknown or [text]}; choose from {', '.join(REWARD_TERMS)}")
    return terms


def parse_preferences(text: str) -> tuple[tuple[str, int], ...]:
    """``"stroke=thick,brightness=bright"`` -> ``(("stroke", 1), ("brightness", 1))``; ``""`` -> ``()``."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, sep, word = (s.strip() for s in item.partition("="))
        if not sep or name not in digits.ATTRIBUTE_WORDS:
            raise ValueError(f"a preference is ATTRIBUTE=WORD with ATTRIBUTE one of {', '.join(digits.ATTRIBUTES)} (got {item!r})")
        words = digits.ATTRIBUTE_WORDS[name]
        if word not in words:
            raise ValueError(f"preferred {name} must be one of {', '.join(words)} (got {word!r})")
        out.append((name, words.index(word)))
    return tuple(out)


class Prompts(NamedTuple):
    """``n`` prompts: captions, rewarded labels ``{term: (n,) int32}`` (-1 = not rewarded) and
    ``named`` ``{attribute: (n,) bool}`` (the caption names it)."""

    captions: list[str]
    labels: dict[str, np.ndarray]
    named: dict[str, np.ndarray]


def sample_prompts(spec: PromptSpec, n: int, rng: np.random.Generator) -> Prompts:
    """Draw ``n`` prompts of ``spec`` (uniform digit and attribute values)."""
    labels = {"digit": rng.integers(0, 10, n).astype(np.int32)}
    named = {}
    preferences = spec.preferences
    for name in digits.ATTRIBUTES:
        value = rng.integers(0, len(digits.ATTRIBUTE_WORDS[name]), n)
        mentioned = rng.random(n) < spec.mention
        if name not in spec.terms:
            named[name] = np.zeros(n, bool)
            continue
        named[name] = mentioned
        labels[name] = np.where(mentioned, value, preferences.get(name, -1)).astype(np.int32)
    captions = [
        digits.caption(int(labels["digit"][i]), *(int(labels[a][i]) if named[a][i] else None for a in digits.ATTRIBUTES))
        for i in range(n)
    ]
    return Prompts(captions, labels, named)


def prompt_batches(card: Card, spec: PromptSpec, prompts_per_step: int, seed: int) -> Iterator[dict]:
    """Endless RL batches ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}`` of ``spec``'s prompts."""
    if prompts_per_step < 1:
        raise ValueError(f"prompts_per_step must be >= 1 (got {prompts_per_step})")
    rng = np.random.default_rng(seed)
    while True:
        p = sample_prompts(spec, prompts_per_step, rng)
        yield {"ids": common.tokenize(card, p.captions), "labels": {k: jnp.asarray(v) for k, v in p.labels.items()}}


# ------------------------------------------------------------------------------------------------ evaluation
@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """Before/after evaluation: ``samples`` prompts judged, diversity over ``diversity_prompts`` prompts
    × ``diversity_seeds`` seeds; ``seed`` fixes prompts and noise (the same before and after)."""

    samples: int = 200
    diversity_prompts: int = 10
    diversity_seeds: int = 6
    seed: int = 0
    batch: int = 100

    def __post_init__(self):
        if self.samples < 1 or self.diversity_prompts < 1 or self.batch < 1:
            raise ValueError("eval samples, diversity prompts and batch must be >= 1")
        if self.diversity_seeds < 2:
            raise ValueError(f"diversity needs >= 2 seeds per prompt (got {self.diversity_seeds})")


_render_ids = jax.jit(flux_t2i.generate_from_ids, static_argnames="sampling")


def _refines(card: Card) -> bool:
    return "llm" in card.components or multi_expert.COMPONENT in card.components


def _denoise_loop(card: Card) -> str:
    return unified.DENOISE_LOOP if _refines(card) else flux_t2i.LOOP_ID


def render(
    card: Card, captions: Sequence[str], seeds: Sequence[int], *, num_steps: int, refine: bool = True, batch: int = 100
) -> tuple[np.ndarray, list[str]]:
    """Serve ``captions`` at guidance 1: ``(images (N, H, W, C) in [0, 1], the prompts rendered)``.

    A ``unified`` (``multi-expert``) card refines each prompt with its LM (every refiner) first, its
    served policy, unless ``refine`` is False; the denoiser's noise is the same either way
    (``fold_in(key, 1)``, as ``unified.generate`` and ``multi_expert.generate``).
    """
    captions, seeds = list(captions), list(seeds)
    images, rendered = [], []
    for start in range(0, len(captions), batch):
        part, part_seeds = captions[start : start + batch], seeds[start : start + batch]
        if multi_expert.COMPONENT in card.components and refine:
            im, text = multi_expert.generate(card, part, seed=part_seeds, num_steps=num_steps, guidance=1.0)
        elif "llm" in card.components and refine:
            im, text = unified.generate(card, part, seed=part_seeds, num_steps=num_steps, guidance=1.0)
        elif _refines(card):
            keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(common.request_keys(part_seeds, len(part)))
            sampling = common.sampling(card, unified.DENOISE_LOOP, num_steps, 1.0)
            im, text = _render_ids(card, common.tokenize(card, part), keys, sampling), part
        else:
            im, text = flux_t2i.generate(card, part, seed=part_seeds, num_steps=num_steps, guidance=1.0), part
        images.append(np.asarray(im))
        rendered.extend(text)
    return np.concatenate(images), rendered


def judge(scorer: Card, images: np.ndarray, prompts: Prompts) -> dict:
    """Scorer-judged accuracy of ``images`` against ``prompts``' labels.

    ``all_right``: every rewarded label right (prompted attributes and preferences), GenEval-style;
    ``prompted_right``: every attribute the caption names right (the digit always);
    ``accuracy``: per term over the rows that reward it; ``reward``: the mean summed scorer reward.
    """
    predicted = {k: np.asarray(v) for k, v in digit_scorer.predict(scorer, jnp.asarray(images) * 2.0 - 1.0).items()}
    labels = prompts.labels
    right = {t: predicted[t] == labels[t] for t in labels}
    rewarded = {t: labels[t] >= 0 for t in labels}
    named = {"digit": np.ones(len(images), bool), **prompts.named}
    reward = scorer_reward(scorer, tuple(labels))(jnp.asarray(images), {k: jnp.asarray(v) for k, v in labels.items()})
    return {
        "all_right": float(np.mean(np.all([right[t] | ~rewarded[t] for t in labels], axis=0))),
        "prompted_right": float(np.mean(np.all([right[t] | ~named[t] for t in labels], axis=0))),
        "accuracy": {t: float(np.mean(right[t][rewarded[t]])) for t in labels if np.any(rewarded[t])},
        "reward": float(jnp.mean(reward)),
    }


def _eval_prompts(spec: PromptSpec, n: int, seed: int, stream: int) -> Prompts:
    return sample_prompts(spec, n, np.random.default_rng([seed, stream]))


def _eval_seeds(seed: int, n: int, offset: int = 0) -> list[int]:
    return [seed * 100_003 + offset + i for i in range(n)]


def diversity(card: Card, spec: PromptSpec, settings: EvalSettings, *, num_steps: int) -> float:
    """Mean pairwise L2 distance between the served images of one prompt across seeds, averaged over prompts."""
    prompts = _eval_prompts(spec, settings.diversity_prompts, settings.seed, 2).captions
    seeds_per = settings.diversity_seeds
    batch = [c for c in prompts for _ in range(seeds_per)]
    images, _ = render(card, batch, _eval_seeds(settings.seed, len(batch), 500_000), num_steps=num_steps, batch=settings.batch)
    images = images.reshape(len(prompts), seeds_per, -1).astype(np.float64)
    dist = np.linalg.norm(images[:, :, None] - images[:, None, :], axis=-1)
    iu = np.triu_indices(seeds_per, k=1)
    return float(dist[:, iu[0], iu[1]].mean())


def generator_quality(card: Card, scorer: Card, spec: PromptSpec, settings: EvalSettings, *, num_steps: int) -> dict:
    """A text-to-image card's quality at guidance 1: ``quality.t2i_quality`` (full compositional and
    plain-digit prompts), ``run_prompts`` (``judge`` on the run's own prompt distribution) and diversity."""
    start = time.perf_counter()
    out = quality.t2i_quality(
        card, scorer, samples=settings.samples, seed=settings.seed, num_steps=num_steps, guidance=1.0, batch=settings.batch
    )
    prompts = _eval_prompts(spec, settings.samples, settings.seed, 1)
    images, _ = render(card, prompts.captions, _eval_seeds(settings.seed, settings.samples), num_steps=num_steps, batch=settings.batch)
    out["run_prompts"] = judge(scorer, images, prompts)
    out["diversity"] = diversity(card, spec, settings, num_steps=num_steps)
    out["eval_seconds"] = time.perf_counter() - start
    return out


def refinement_quality(card: Card, scorer: Card, spec: PromptSpec, settings: EvalSettings, *, num_steps: int) -> dict:
    """A ``unified`` card at guidance 1 on the run's prompts, served two ways with the same noise:
    ``refined`` (the LM continues the prompt, as served) and ``original`` (the prompt as written).

    ``preferred_word_rate``: of the (prompt, preferred attribute) pairs where the prompt leaves the
    attribute out, the fraction whose refinement asks for the preferred word;
    ``preferred_word_rate_in_order``: the same over the pairs where appending the word keeps the
    captions' word order (the prompt names no attribute that comes after it, e.g. ``"seven"`` but
    not ``"seven left"`` for a stroke); ``added_words``: the mean number of words a refinement adds.
    Diversity is of the served (refined) images.
    """
    start = time.perf_counter()
    prompts = _eval_prompts(spec, settings.samples, settings.seed, 1)
    seeds = _eval_seeds(settings.seed, settings.samples)
    refined, text = render(card, prompts.captions, seeds, num_steps=num_steps, batch=settings.batch)
    original, _ = render(card, prompts.captions, seeds, num_steps=num_steps, refine=False, batch=settings.batch)
    asked, in_order = np.zeros(2), np.zeros(2)  # (asked for the preferred word, pairs)
    by_attribute = {}
    for name, label in spec.preferences.items():
        word = digits.ATTRIBUTE_WORDS[name][label]
        later = digits.ATTRIBUTES[digits.ATTRIBUTES.index(name) + 1 :]
        by_attribute[name] = np.zeros(2)
        for i in np.flatnonzero(~prompts.named[name]):
            hit = word in text[i].split()[len(prompts.captions[i].split()) :]
            asked += (hit, 1)
            by_attribute[name] += (hit, 1)
            if not any(prompts.named[a][i] for a in later):
                in_order += (hit, 1)
    rate = lambda counts: float(counts[0] / counts[1]) if counts[1] else None
    added = [len(t.split()) - len(c.split()) for t, c in zip(text, prompts.captions)]
    return {
        "samples": settings.samples,
        "num_steps": num_steps,
        "guidance": 1.0,
        "refined": judge(scorer, refined, prompts),
        "original": judge(scorer, original, prompts),
        "preferred_word_rate": rate(asked),
        "preferred_word_rate_in_order": rate(in_order),
        "preferred_word_rate_by_attribute": {name: rate(counts) for name, counts in by_attribute.items()},
        "added_words": float(np.mean(added)),
        "examples": [f"{c} -> {t}" for c, t in zip(prompts.captions[:8], text[:8])],
        "diversity": diversity(card, spec, settings, num_steps=num_steps),
        "eval_seconds": time.perf_counter() - start,
    }


# ------------------------------------------------------------------------------------------------ runs
@dataclasses.dataclass
class Run:
    """One RL run, ready for ``execute``.

    name: the method's command name (``"flow-grpo"``); method: ``init(key)``, ``step(state, batch,
    key)``, ``card(state)``; batches: endless batches for ``step``; settings: a JSON-able record;
    evaluate: card -> quality dict (with ``"diversity"``), or None to skip evaluation;
    curves: PNG file name -> metric keys drawn in it; headline: ``(before, after) -> numbers`` for
    the report's summary.
    """

    name: str
    method: Any
    batches: Iterator[Any]
    settings: dict
    evaluate: Callable[[Card], dict] | None = None
    curves: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=lambda: {"reward.png": ("reward_mean",)})
    headline: Callable[[dict, dict], dict] | None = None


def _change(before: dict, after: dict, *path: str) -> dict:
    b, a = before, after
    for key in path:
        b, a = b[key], a[key]
    if b is None or a is None:
        return {"before": b, "after": a}
    return {"before": b, "after": a, "change": a - b}


def _settings(card: Card, config, prompts: PromptSpec, prompts_per_step: int, evaluation: EvalSettings | None, **extra) -> dict:
    """The JSON-able record of a run's settings (``report.json``)."""
    return {
        "model": card.model_id,
        **extra,
        "prompts_per_step": prompts_per_step,
        "prompts": prompts.describe(),
        "config": config_to_dict(config),
        "evaluation": None if evaluation is None else dataclasses.asdict(evaluation),
    }


def _check_room(card: Card, prompts: PromptSpec) -> None:
    """A clear error when ``prompts`` can be too long for the card's refiner(s) to add their words."""
    limit = card.spec.config.max_prompt_words
    if prompts.max_words > limit:
        raise ValueError(f"prompts of up to {prompts.max_words} words do not leave the refiner(s) room ({limit} words at most)")


def flow_grpo_run(
    card: Card,
    scorer: Card,
    config: FlowGRPOConfig,
    prompts: PromptSpec = PromptSpec(),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """FlowGRPO on a text-to-image (``flux_t2i``) card with the ``digit-scorer`` reward over ``prompts.terms``."""
    if card.spec.family != "flux_t2i":
        raise ValueError(
            f"flow-grpo trains a text-to-image card of the flux_t2i family; {card.model_id!r} is {card.spec.family!r}"
            + (" (use `train unified` for a unified card)" if card.spec.family == "unified" else "")
        )
    method = FlowGRPO(card, scorer_reward(scorer, prompts.terms), config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c: generator_quality(c, scorer, prompts, evaluation, num_steps=config.num_steps)

    def headline(before: dict, after: dict) -> dict:
        return {
            "all_attributes_correct": _change(before, after, "all_attributes_correct"),
            "digit_accuracy_plain_prompts": _change(before, after, "digit_accuracy"),
            "run_prompts_all_right": _change(before, after, "run_prompts", "all_right"),
        }

    return Run(
        name="flow-grpo",
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(card, config, prompts, prompts_per_step, evaluation),
        evaluate=evaluate,
        curves={"reward.png": ("reward_mean",), "kl.png": ("kl",)},
        headline=headline,
    )


def unified_run(
    card: Card,
    scorer: Card,
    config: UnifiedRLConfig,
    prompts: PromptSpec = PromptSpec(mention=0.5),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """UnifiedRL (joint, or prompt-only with ``config.joint=False``) on a ``unified`` card.

    Prompts name each rewarded attribute with probability ``prompts.mention``; ``prompts.prefer``
    labels the attributes a prompt leaves out, which the refiner can learn to ask for.
    """
    if "llm" not in card.components:
        raise ValueError(f"unified RL needs a card with a refiner LM (the 'unified' card); {card.model_id!r} has none")
    _check_room(card, prompts)
    method = UnifiedRL(card, scorer_reward(scorer, prompts.terms), config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c: refinement_quality(c, scorer, prompts, evaluation, num_steps=config.num_steps)

    def headline(before: dict, after: dict) -> dict:
        return {
            "refined_all_right": _change(before, after, "refined", "all_right"),
            "original_all_right": _change(before, after, "original", "all_right"),
            "refined_minus_original_before": before["refined"]["all_right"] - before["original"]["all_right"],
            "refined_minus_original_after": after["refined"]["all_right"] - after["original"]["all_right"],
            "refined_prompted_right": _change(before, after, "refined", "prompted_right"),
            "preferred_word_rate": _change(before, after, "preferred_word_rate"),
            "preferred_word_rate_in_order": _change(before, after, "preferred_word_rate_in_order"),
            "added_words": _change(before, after, "added_words"),
        }

    return Run(
        name="unified" if config.joint else "unified (prompt-only)",
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(card, config, prompts, prompts_per_step, evaluation),
        evaluate=evaluate,
        curves={
            "reward.png": ("reward_mean",),
            "refined_vs_original.png": ("reward_refined", "reward_original"),
            "refined_tokens.png": ("refined_tokens",),
            "kl.png": ("lm_kl", "gen_kl"),
        },
        headline=headline,
    )


def joint_run(
    card: Card,
    scorer: Card,
    config: JointRLConfig,
    prompts: PromptSpec = PromptSpec(mention=0.0, prefer=(("stroke", 1), ("position", 2), ("brightness", 0))),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """JointMultiExpertRL on a ``multi-expert`` card (build one with ``multi_expert.from_unified``).

    The reward's parts are the scorer's per-term probabilities, so under ``credit="per_expert"`` refiner
    i is credited with the term of the attribute it owns; the curves include every part (one per expert).
    """
    if multi_expert.COMPONENT not in card.components:
        raise ValueError(f"joint RL needs a multi-expert card (stacked refiners); {card.model_id!r} has none")
    _check_room(card, prompts)
    method = JointMultiExpertRL(card, scorer_reward_parts(scorer, prompts.terms), config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c: refinement_quality(c, scorer, prompts, evaluation, num_steps=config.num_steps)
    names = multi_expert.expert_names(card)

    def headline(before: dict, after: dict) -> dict:
        rates = {
            f"preferred_{name}_rate": _change(before, after, "preferred_word_rate_by_attribute", name)
            for name in before["preferred_word_rate_by_attribute"]
        }
        return {
            "refined_all_right": _change(before, after, "refined", "all_right"),
            "original_all_right": _change(before, after, "original", "all_right"),
            **rates,
        }

    parts = tuple(f"reward_{t}" for t in prompts.terms if t != "digit")
    return Run(
        name=f"joint ({len(names)} refiners, {config.credit} credit{'' if config.joint else ', prompt-only'})",
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(
            card, config, prompts, prompts_per_step, evaluation,
            refiners=len(names), slots=[card.spec.config.slot(i) for i in range(len(names))],
        ),
        evaluate=evaluate,
        curves={
            "reward.png": ("reward_mean",),
            "reward_per_expert.png": parts,
            "refined_vs_original.png": ("reward_refined", "reward_original"),
            "refiner_losses.png": tuple(f"{name}_loss" for name in names),
        },
        headline=headline,
    )


def _reward_summary(history: list[dict]) -> dict:
    n = max(1, len(history) // 10)
    out = {"window": n}
    for key in ("reward_mean", "reward_refined", "reward_original"):
        values = np.array([row[key] for row in history if key in row], np.float64)
        if len(values):
            out[key] = {"first": float(np.mean(values[:n])), "last": float(np.mean(values[-n:]))}
    return out


def execute(
    run: Run,
    *,
    steps: int,
    out: str | os.PathLike,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Train ``run`` for ``steps`` steps and write everything to ``out``; returns the report.

    Writes ``out/metrics.jsonl`` (one JSON object per step; replaced, not appended to), the curve
    PNGs, ``out/report.json`` and the trained card (``jp.cards.load(out)``). With an evaluation,
    the card is judged before and after; a diversity drop of more than ``DIVERSITY_COLLAPSE``
    makes the verdict a failure.
    """
    if steps <= 0:
        raise ValueError(f"steps must be > 0 (got {steps})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = run.method.init(jax.random.key(seed))
    before = after = None
    if run.evaluate is not None:
        log(f"{run.name}: evaluating the starting card ...")
        before = run.evaluate(run.method.card(state))
    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    start = time.perf_counter()
    state, history = fit(
        run.method.step, state, run.batches, steps=steps, key=jax.random.key(seed), metrics_path=metrics_path,
        desc=run.name, progress=progress,
    )
    jax.block_until_ready(state)
    train_seconds = time.perf_counter() - start
    trained = run.method.card(state)
    if run.evaluate is not None:
        log(f"{run.name}: evaluating the trained card ...")
        after = run.evaluate(trained)
    curves = [plot_curves(history, keys, out / name, title=f"{run.name}, {steps} steps") for name, keys in run.curves.items()
              if any(k in history[0] for k in keys)]
    report = {
        "method": run.name,
        "steps": steps,
        "seed": seed,
        "settings": run.settings,
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / steps,
        "rewards": _reward_summary(history),
        "skipped_updates": int(sum(row.get("skipped", 0.0) > 0 for row in history)),
        "curves": curves,
        "metrics": str(metrics_path),
        "card": str(out),
    }
    if before is not None and after is not None:
        change = (after["diversity"] - before["diversity"]) / max(before["diversity"], 1e-12)
        collapsed = change < -DIVERSITY_COLLAPSE
        report["summary"] = {
            **(run.headline(before, after) if run.headline else {}),
            "diversity": {"before": before["diversity"], "after": after["diversity"], "relative_change": change},
            "diversity_collapse": bool(collapsed),
            "verdict": (
                f"FAILED: sample diversity fell {-100 * change:.1f}% (> {100 * DIVERSITY_COLLAPSE:.0f}%): mode collapse, "
                "the reward gain is reward hacking"
                if collapsed
                else "ok: no diversity collapse"
            ),
        }
        report["before"], report["after"] = before, after
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    save_card(trained, out)
    for line in summary_lines(report):
        log(line)
    return report


def summary_lines(report: dict) -> list[str]:
    """The report's headline numbers as console lines."""
    lines = []
    for key, value in report["rewards"].items():
        if isinstance(value, dict):
            lines.append(f"{key:32s} first {report['rewards']['window']} steps {value['first']:.3f} -> last {value['last']:.3f}")
    for key, value in report.get("summary", {}).items():
        if isinstance(value, dict) and "before" in value and value["before"] is not None:
            after = value["after"]
            delta = value.get("change", value.get("relative_change"))
            unit = "%" if "relative_change" in value else ""
            scale = 100.0 if unit else 1.0
            lines.append(f"{key:32s} {value['before']:.3f} -> {after:.3f} ({scale * delta:+.3f}{unit})")
        elif isinstance(value, float):
            lines.append(f"{key:32s} {value:+.3f}")
        elif isinstance(value, str):
            lines.append(value)
    lines.append(
        f"training: {report['train_seconds']:.1f} s for {report['steps']} steps "
        f"({report['seconds_per_step']:.2f} s/step incl. compile); skipped updates: {report['skipped_updates']}"
    )
    lines.append(f"wrote {report['metrics']}, {', '.join(report['curves'])}, report.json and the card in {report['card']}")
    return lines
