"""Before/after evaluation of the digits-world RL runs at guidance 1, judged twice: by the ``digit-scorer``
(the reward) and by the independent evaluators (``evaluators``: the ``digit-classifier`` card and the
analytic readers, which share no weights with the reward).

GenEval-style "every prompted attribute right", and sample diversity, the mean pairwise L2
distance between images of one prompt across seeds. A diversity drop of more than
``jaxpipe.training.runs.DIVERSITY_COLLAPSE`` is mode collapse (reward hacking): the report calls the run FAILED
whatever the reward did. Every image is rendered by the card's own program (``jp.generate``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer, quality
from jaxpipe.digits.evaluators import Evaluator, default_evaluator
from jaxpipe.digits.prompts import Captions, PromptSpec, sample_prompts
from jaxpipe.digits.rewards import label_probabilities
from jaxpipe.generate import generate
from jaxpipe.progress import progress_bar
from jaxpipe.stopping import Stopped
from jaxpipe.training.runs.heldout import Judging, spread

__all__ = ["EvalSettings", "serve", "judge", "diversity", "generator_quality", "refinement_quality", "video_quality"]


@dataclasses.dataclass(frozen=True)
class EvalSettings(Judging):
    """The digits runs' before/after evaluation (``Judging``), at the sizes the README's rows are measured at.

    Attributes:
        samples: prompts judged (and ``t2i_quality`` / ``t2v_quality`` samples).
        diversity_prompts: prompts of the diversity measurement.
        diversity_seeds: seeds per diversity prompt (>= 2).
        batch: items rendered per call.
        seed: fixes the prompts and the noise, the same before and after (``Judging``'s).
    """

    samples: int = 200
    diversity_prompts: int = 10
    diversity_seeds: int = 6
    batch: int = 100


def serve(
    card: Card,
    captions: Sequence[str],
    seeds: Sequence[int],
    *,
    num_steps: int,
    refine: bool = True,
    batch: int = 100,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Serve ``captions`` at guidance 1 through the card's program: ``(images (N, H, W, C) in [0, 1],
    the prompts rendered)``.

    A card whose program refines prompts (``unified``, ``multi-expert``) or thinks first (``bagel-mot``)
    serves the refinement / thought, its served policy, unless ``refine`` is False (then the prompt
    as written, with the same noise). ``should_stop()`` is checked between batches (``Stopped`` when
    it turns true).

    Args:
        card: a text-to-image card (possibly one that refines or thinks first).
        captions: ``N`` prompts.
        seeds: ``N`` generation seeds, one per prompt.
        num_steps: sampling steps.
        refine: serve the refinement / thought (False: the prompt as written); ignored by a card without either.
        batch: prompts rendered per call.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        The images, ``(N, H, W, C)`` in ``[0, 1]``, and the ``N`` prompts they were rendered from.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    captions, seeds = list(captions), list(seeds)
    inputs_ = registry.default_program(card).inputs
    flag = next((name for name in ("refine", "think") if name in inputs_), None)
    inputs = {flag: refine} if flag else {}
    text = {"refine": "refined_text", "think": "thought_text"}.get(flag)
    images, rendered = [], []
    with progress_bar(total=len(captions), desc=f"{card.model_id} judged", leave=False) as shown:
        for start in range(0, len(captions), batch):
            if should_stop is not None and should_stop():
                raise Stopped()
            part, part_seeds = captions[start : start + batch], seeds[start : start + batch]
            out = generate(card, part, seed=part_seeds, num_steps=num_steps, guidance=1.0, inputs=inputs)
            images.append(np.asarray(out["image"]))
            rendered.extend(out[text] if text else part)
            shown.update(len(part))
    return np.concatenate(images), rendered


def _agreement(read: dict[str, np.ndarray], prompts: Captions) -> dict:
    """How well the labels ``read`` from images ``{term: (N,) int}`` match ``prompts``' labels
    (-1 read: unreadable, always wrong)."""
    labels = prompts.labels
    right = {t: np.asarray(read[t]) == labels[t] for t in labels}
    rewarded = {t: labels[t] >= 0 for t in labels}
    named = {"digit": np.ones(len(prompts.captions), bool), **prompts.named}
    return {
        "all_right": float(np.mean(np.all([right[t] | ~rewarded[t] for t in labels], axis=0))),
        "prompted_right": float(np.mean(np.all([right[t] | ~named[t] for t in labels], axis=0))),
        "accuracy": {t: float(np.mean(right[t][rewarded[t]])) for t in labels if np.any(rewarded[t])},
    }


def judge(scorer: Card, images: np.ndarray, prompts: Captions, *, evaluator: Evaluator | None = None) -> dict:
    """Accuracy of ``images`` ``(N, 16, 16, 1)`` in [0, 1] against ``prompts``' labels, twice: by the scorer
    (the reward's own weights) and by ``evaluator`` (default: ``evaluators.default_evaluator()``, which shares
    no weights with it) under ``"independent"``.

    ``all_right``: every rewarded label right (prompted attributes and preferences), GenEval-style;
    ``prompted_right``: every attribute the caption names right (the digit always);
    ``accuracy``: per term over the rows that reward it; ``reward``: the mean summed scorer reward.
    A gain the scorer sees and the independent evaluator does not is reward hacking.

    Args:
        scorer: a ``digit-scorer`` card.
        images: ``(N, 16, 16, 1)`` in ``[0, 1]``, rendered from ``prompts``.
        prompts: the ``N`` prompts and their rewarded labels (``sample_prompts``).
        evaluator: the independent judge (default: ``evaluators.default_evaluator()``).

    Returns:
        ``{"all_right", "prompted_right", "accuracy": {term: float}, "reward", "independent": {"all_right",
        "prompted_right", "accuracy"}}``.
    """
    predicted = {k: np.asarray(v) for k, v in digit_scorer.predict(scorer, jnp.asarray(images) * 2.0 - 1.0).items()}
    labels = prompts.labels
    reward = sum(
        label_probabilities(
            scorer, jnp.asarray(images), {k: jnp.asarray(v) for k, v in labels.items()}, tuple(labels)
        ).values()
    )
    independent = (evaluator or default_evaluator()).read(images)
    return {
        **_agreement(predicted, prompts),
        "reward": float(jnp.mean(reward)),
        "independent": _agreement(independent, prompts),
    }


def _eval_prompts(spec: PromptSpec, n: int, seed: int, stream: int) -> Captions:
    return sample_prompts(spec, n, np.random.default_rng([seed, stream]))


def _eval_seeds(seed: int, n: int, offset: int = 0) -> list[int]:
    return [seed * 100_003 + offset + i for i in range(n)]


def diversity(card: Card, spec: PromptSpec, settings: EvalSettings, *, num_steps: int, should_stop=None) -> float:
    """Mean pairwise L2 distance between the served images of one prompt across seeds, averaged over prompts.

    Args:
        card: a text-to-image card.
        spec: the distribution of the ``settings.diversity_prompts`` prompts.
        settings: the evaluation's sizes and seed.
        num_steps: sampling steps.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        The mean distance (images in ``[0, 1]``); a drop after training means less diverse samples.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    prompts = _eval_prompts(spec, settings.diversity_prompts, settings.seed, 2).captions
    seeds_per = settings.diversity_seeds
    batch = [c for c in prompts for _ in range(seeds_per)]
    images, _ = serve(
        card,
        batch,
        _eval_seeds(settings.seed, len(batch), 500_000),
        num_steps=num_steps,
        batch=settings.batch,
        should_stop=should_stop,
    )
    return spread(images, len(prompts), seeds_per)


def video_quality(card: Card, scorer: Card, settings: EvalSettings, *, should_stop=None) -> dict:
    """A text-to-video card at its own default steps and guidance: ``quality.t2v_quality`` (motion as told,
    the digit in the first and last frame) on ``settings.samples`` prompts, and the diversity of its videos
    over seeds (as ``diversity``, on digit-and-motion captions).

    Args:
        card: a text-to-video card.
        scorer: a ``digit-scorer`` card.
        settings: the evaluation's sizes and seed.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``quality.t2v_quality``'s dict plus ``"diversity"`` and ``"eval_seconds"``.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    start = time.perf_counter()
    out = quality.t2v_quality(
        card, scorer, samples=settings.samples, seed=settings.seed, batch=settings.batch, should_stop=should_stop
    )
    rng = np.random.default_rng([settings.seed, 2])
    n, seeds = settings.diversity_prompts, settings.diversity_seeds
    captions = [
        digits.caption(int(d), motion=int(m))
        for d, m in zip(rng.integers(0, 10, n), rng.integers(0, len(digits.MOTION_NAMES), n))
    ]
    batch = [c for c in captions for _ in range(seeds)]
    noise = _eval_seeds(settings.seed, len(batch), 500_000)
    videos = []
    with progress_bar(total=len(batch), desc=f"{card.model_id} diversity", leave=False) as shown:
        for begin in range(0, len(batch), settings.batch):
            if should_stop is not None and should_stop():
                raise Stopped()
            end = begin + settings.batch
            videos.append(np.asarray(generate(card, batch[begin:end], seed=noise[begin:end])["video"]))
            shown.update(len(batch[begin:end]))
    out["diversity"] = spread(np.concatenate(videos), n, seeds)
    out["eval_seconds"] = time.perf_counter() - start
    return out


def generator_quality(
    card: Card, scorer: Card, spec: PromptSpec, settings: EvalSettings, *, num_steps: int, should_stop=None
) -> dict:
    """A text-to-image card's quality at guidance 1: ``quality.t2i_quality`` (full compositional and
    plain-digit prompts), ``run_prompts`` (``judge`` on the run's own prompt distribution) and diversity.

    Args:
        card: a text-to-image card.
        scorer: a ``digit-scorer`` card.
        spec: the run's prompt distribution.
        settings: the evaluation's sizes and seed.
        num_steps: sampling steps.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``quality.t2i_quality``'s dict plus ``"run_prompts"`` (``judge``), ``"diversity"`` and ``"eval_seconds"``.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    start = time.perf_counter()
    out = quality.t2i_quality(
        card,
        scorer,
        samples=settings.samples,
        seed=settings.seed,
        num_steps=num_steps,
        guidance=1.0,
        batch=settings.batch,
        should_stop=should_stop,
    )
    prompts = _eval_prompts(spec, settings.samples, settings.seed, 1)
    images, _ = serve(
        card,
        prompts.captions,
        _eval_seeds(settings.seed, settings.samples),
        num_steps=num_steps,
        batch=settings.batch,
        should_stop=should_stop,
    )
    out["run_prompts"] = judge(scorer, images, prompts)
    out["diversity"] = diversity(card, spec, settings, num_steps=num_steps, should_stop=should_stop)
    out["eval_seconds"] = time.perf_counter() - start
    return out


def refinement_quality(
    card: Card, scorer: Card, spec: PromptSpec, settings: EvalSettings, *, num_steps: int, should_stop=None
) -> dict:
    """A ``unified`` card at guidance 1 on the run's prompts, served two ways with the same noise:
    ``refined`` (the LM continues the prompt, as served) and ``original`` (the prompt as written).

    ``preferred_word_rate``: of the (prompt, preferred attribute) pairs where the prompt leaves the
    attribute out, the fraction whose refinement asks for the preferred word;
    ``preferred_word_rate_in_order``: the same over the pairs where appending the word keeps the
    captions' word order (the prompt names no attribute that comes after it, e.g. ``"seven"`` but
    not ``"seven left"`` for a stroke); ``added_words``: the mean number of words a refinement adds.
    Diversity is of the served (refined) images.

    Args:
        card: a card that refines (``unified``, ``multi-expert``) or thinks first (``bagel-mot``).
        scorer: a ``digit-scorer`` card.
        spec: the run's prompt distribution (its ``prefer`` gives the preferred words).
        settings: the evaluation's sizes and seed.
        num_steps: sampling steps.
        should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
        ``{"samples", "num_steps", "guidance", "refined", "original"}`` (each a ``judge`` dict),
        ``"preferred_word_rate"``, ``"preferred_word_rate_in_order"`` (``None`` without such pairs),
        ``"preferred_word_rate_by_attribute"``, ``"added_words"``, ``"examples"``, ``"diversity"``, ``"eval_seconds"``.

    Raises:
        Stopped: once ``should_stop()`` is true.
    """
    start = time.perf_counter()
    prompts = _eval_prompts(spec, settings.samples, settings.seed, 1)
    seeds = _eval_seeds(settings.seed, settings.samples)
    refined, text = serve(
        card, prompts.captions, seeds, num_steps=num_steps, batch=settings.batch, should_stop=should_stop
    )
    original, _ = serve(
        card, prompts.captions, seeds, num_steps=num_steps, refine=False, batch=settings.batch, should_stop=should_stop
    )
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
        "diversity": diversity(card, spec, settings, num_steps=num_steps, should_stop=should_stop),
        "eval_seconds": time.perf_counter() - start,
    }
