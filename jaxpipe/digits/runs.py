"""The digits world's RL runs, which ``jaxpipe train`` and the examples execute: a trainer, its prompt stream,
its evaluation and curves.

A ``Run`` (``jaxpipe.training.runs``) bundles a trainer (``init``, jitted ``step``, ``card(state)``), an
endless stream of prompt batches, a before/after evaluation and the curves to draw;
``jaxpipe.training.runs.execute`` trains it (re-exported here as ``execute``).
``flow_grpo_run``, ``nft_run``, ``unified_run``, ``joint_run`` and ``mot_run`` build the RL runs,
``dmd2_run`` and ``self_forcing_run`` distillations; another method needs only its own builder.
"""

from __future__ import annotations

import dataclasses

from jaxpipe.card import Card
from jaxpipe.cards import registry, toy_multi_expert
from jaxpipe.cards.checkpoint import config_to_dict
from jaxpipe.digits.evaluation import EvalSettings, generator_quality, refinement_quality, video_quality
from jaxpipe.digits.prompts import PromptSpec, motion_batches, parse_preferences, parse_terms, prompt_batches
from jaxpipe.digits.rewards import scorer_reward
from jaxpipe.training.methods.dmd2 import DMD2, DMD2Config
from jaxpipe.training.methods.flow_grpo import FlowGRPO, FlowGRPOConfig
from jaxpipe.training.methods.joint_rl import JointMultiExpertRL, JointMultiExpertRLConfig, UnifiedRL, UnifiedRLConfig
from jaxpipe.training.methods.mot_rl import SharedMoTRL, SharedMoTRLConfig
from jaxpipe.training.methods.nft import DiffusionNFT, DiffusionNFTConfig
from jaxpipe.training.methods.self_forcing import SelfForcing, SelfForcingConfig
from jaxpipe.training.runs import Run, execute

__all__ = [
    "EvalSettings",
    "PromptSpec",
    "Run",
    "execute",
    "parse_preferences",
    "parse_terms",
    "prompt_batches",
    "motion_batches",
    "flow_grpo_run",
    "nft_run",
    "dmd2_run",
    "self_forcing_run",
    "unified_run",
    "joint_run",
    "mot_run",
    "HACKING_GAP",
    "REFINEMENT_CURVES",
]


def _change(before: dict, after: dict, *path: str) -> dict:
    b, a = before, after
    for key in path:
        b, a = b[key], a[key]
    if b is None or a is None:
        return {"before": b, "after": a}
    return {"before": b, "after": a, "change": a - b}


HACKING_GAP = 0.05
"""A scorer-judged gain that beats the independent evaluators' gain on the same images by more than this is
flagged in the report as reward hacking (the reward model sees a gain its judge does not)."""


def _judged(before: dict, after: dict, headline: dict[str, tuple[str, ...]]) -> dict:
    """For each ``name -> path`` to a scorer-judged number: its change and, as ``name (independent)``, the
    change of the same number judged by the independent evaluators (the path with ``"independent"`` before
    its last key); then ``reward_vs_independent``, a line saying whether the two agree."""
    out, gaps = {}, {}
    for name, path in headline.items():
        scorer = out[name] = _change(before, after, *path)
        independent = out[f"{name} (independent)"] = _change(before, after, *path[:-1], "independent", path[-1])
        gaps[name] = scorer["change"] - independent["change"]
    hacked = {name: gap for name, gap in gaps.items() if gap > HACKING_GAP}
    out["reward_vs_independent"] = (
        "REWARD HACKING: the scorer's gain exceeds the independent evaluators' by "
        + ", ".join(f"{gap:+.3f} ({name})" for name, gap in hacked.items())
        if hacked
        else f"reward and independent evaluators agree (every gap <= {HACKING_GAP})"
    )
    return out


def _settings(
    card: Card, config, prompts: PromptSpec, prompts_per_step: int, evaluation: EvalSettings | None, **extra
) -> dict:
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
        raise ValueError(
            f"prompts of up to {prompts.max_words} words do not leave the refiner(s) room ({limit} words at most)"
        )


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
    """FlowGRPO on a text-to-image card (e.g. ``flux-t2i``) with the ``digit-scorer`` reward over ``prompts.terms``.

    Judged by ``generator_quality`` at the config's sampling steps; the headline compares the scorer's and the
    independent evaluators' gains (``HACKING_GAP``).

    Args:
        card: a text-to-image card (the policy).
        scorer: the ``digit-scorer`` card: the reward and, with the independent evaluators, the judge.
        config: the FlowGRPO settings.
        prompts: the prompt distribution; its ``terms`` are the reward's.
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``"flow-grpo"`` ``Run``, ready for ``execute``.

    Raises:
        ValueError: if ``card`` refines its prompts first (a ``unified`` card: use ``unified_run``).
    """
    _check_text_to_image(card, "flow-grpo")
    return _generator_run(
        "flow-grpo",
        FlowGRPO(card, scorer_reward(scorer, prompts.terms), config),
        card,
        scorer,
        config,
        prompts,
        prompts_per_step,
        seed,
        evaluation,
        config.sampling.num_steps,
        {"reward.png": ("reward_mean",), "kl.png": ("kl",)},
    )


def nft_run(
    card: Card,
    scorer: Card,
    config: DiffusionNFTConfig,
    prompts: PromptSpec = PromptSpec(),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """DiffusionNFT on a text-to-image card with the ``digit-scorer`` reward; judged as ``flow_grpo_run``.

    Args:
        card: a text-to-image card (the policy).
        scorer: the ``digit-scorer`` card: the reward and, with the independent evaluators, the judge.
        config: the DiffusionNFT settings.
        prompts: the prompt distribution; its ``terms`` are the reward's.
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``"nft"`` ``Run``, ready for ``execute``.

    Raises:
        ValueError: if ``card`` refines its prompts first (a ``unified`` card: use ``unified_run``).
    """
    _check_text_to_image(card, "nft")
    return _generator_run(
        "nft",
        DiffusionNFT(card, scorer_reward(scorer, prompts.terms), config),
        card,
        scorer,
        config,
        prompts,
        prompts_per_step,
        seed,
        evaluation,
        config.sampling.num_steps,
        {
            "reward.png": ("reward_mean",),
            "loss.png": ("loss_pos", "loss_neg"),
            "old_policy.png": ("ema_decay", "r_mean"),
        },
    )


def dmd2_run(
    card: Card,
    scorer: Card,
    config: DMD2Config,
    prompts: PromptSpec = PromptSpec(mention=0.5),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """DMD2: distil text-to-image ``card`` (the teacher) into a ``config.student_steps``-step student on
    ``prompts``; the scorer only judges (the student before training is the teacher at the student's steps).

    Args:
        card: a text-to-image card, the teacher (the student starts as a copy).
        scorer: the ``digit-scorer`` card (the judge only: DMD2 has no reward).
        config: the DMD2 settings (``student_steps``: the student's sampling steps).
        prompts: the prompt distribution of the training batches and the evaluation.
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The DMD2 ``Run``, ready for ``execute``.

    Raises:
        ValueError: if ``card`` refines its prompts first (a ``unified`` card: use ``unified_run``).
    """
    _check_text_to_image(card, "dmd2")
    return _generator_run(
        f"dmd2 ({config.student_steps}-step student)",
        DMD2(card, config),
        card,
        scorer,
        config,
        prompts,
        prompts_per_step,
        seed,
        evaluation,
        config.student_steps,
        {"losses.png": ("dm_loss", "critic_loss"), "gaps.png": ("real_gap", "fake_real_gap")},
        summary_keys=("dm_loss", "critic_loss", "real_gap", "fake_real_gap"),
    )


def self_forcing_run(
    card: Card,
    teacher: Card,
    scorer: Card,
    config: SelfForcingConfig,
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(samples=100),
) -> Run:
    """SelfForcing: causal ``card`` (``wan-causal``) trained on its own chunked rollouts against the
    bidirectional ``teacher`` (``wan-t2v``) on digit-and-motion prompts; judged by ``video_quality``.

    Args:
        card: the causal student card (``wan-causal``).
        teacher: the bidirectional teacher card (``wan-t2v``).
        scorer: the ``digit-scorer`` card (the judge only).
        config: the SelfForcing settings.
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream (``motion_batches``).
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``"self-forcing"`` ``Run``, ready for ``execute``.
    """
    method = SelfForcing(card, teacher, config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c, stop=None: video_quality(c, scorer, evaluation, should_stop=stop)

    def headline(before: dict, after: dict) -> dict:
        return {
            "motion_accuracy": _change(before, after, "full", "motion_accuracy"),
            **_judged(
                before,
                after,
                {
                    "first_frame_digit_accuracy": ("full", "first_frame_digit_accuracy"),
                    "last_frame_digit_accuracy": ("full", "last_frame_digit_accuracy"),
                },
            ),
        }

    return Run(
        name="self-forcing",
        method=method,
        batches=motion_batches(card, prompts_per_step, seed),
        settings={
            **_settings(card, config, PromptSpec(), prompts_per_step, evaluation, teacher=teacher.model_id),
            "prompts": "digit-and-motion captions",
        },
        evaluate=evaluate,
        curves={"losses.png": ("loss", "critic_loss"), "grad_norm.png": ("grad_norm", "critic_grad_norm")},
        headline=headline,
        summary_keys=("loss", "critic_loss"),
    )


def _generator_run(
    name: str,
    method,
    card: Card,
    scorer: Card,
    config,
    prompts: PromptSpec,
    prompts_per_step: int,
    seed: int,
    evaluation: EvalSettings | None,
    num_steps: int,
    curves: dict,
    **extra,
) -> Run:
    """A text-to-image method's ``Run``: ``prompts`` batches, judged by ``generator_quality`` at ``num_steps``."""
    return Run(
        name=name,
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(card, config, prompts, prompts_per_step, evaluation),
        evaluate=_generator_evaluation(scorer, prompts, evaluation, num_steps),
        curves=curves,
        headline=_generator_headline,
        **extra,
    )


def _check_text_to_image(card: Card, command: str) -> None:
    if "refine" in registry.default_program(card).inputs:
        raise ValueError(
            f"{command} trains a text-to-image card; {card.model_id!r} refines its prompts first (use `train unified`)"
        )


def _generator_evaluation(scorer: Card, prompts: PromptSpec, evaluation: EvalSettings | None, num_steps: int):
    if evaluation is None:
        return None
    return lambda c, stop=None: generator_quality(c, scorer, prompts, evaluation, num_steps=num_steps, should_stop=stop)


def _generator_headline(before: dict, after: dict) -> dict:
    return _judged(
        before,
        after,
        {
            "all_attributes_correct": ("all_attributes_correct",),
            "digit_accuracy_plain_prompts": ("digit_accuracy",),
            "run_prompts_all_right": ("run_prompts", "all_right"),
        },
    )


REFINEMENT_CURVES = {
    "reward.png": ("reward_mean",),
    "refined_vs_original.png": ("reward_refined", "reward_original"),
    "refined_tokens.png": ("refined_tokens",),
    "kl.png": ("lm_kl", "gen_kl"),
}
"""The curves of a run whose card rewrites its prompt first (a refiner LM, or a MoT that thinks)."""


def _refinement_headline(before: dict, after: dict) -> dict:
    return {
        **_judged(
            before,
            after,
            {
                "refined_all_right": ("refined", "all_right"),
                "original_all_right": ("original", "all_right"),
                "refined_prompted_right": ("refined", "prompted_right"),
            },
        ),
        "refined_minus_original_before": before["refined"]["all_right"] - before["original"]["all_right"],
        "refined_minus_original_after": after["refined"]["all_right"] - after["original"]["all_right"],
        "preferred_word_rate": _change(before, after, "preferred_word_rate"),
        "preferred_word_rate_in_order": _change(before, after, "preferred_word_rate_in_order"),
        "added_words": _change(before, after, "added_words"),
    }


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

    Args:
        card: a card with a refiner LM (``unified``).
        scorer: the ``digit-scorer`` card: the reward and, with the independent evaluators, the judge.
        config: the UnifiedRL settings.
        prompts: the prompt distribution; its ``terms`` are the reward's.
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``Run`` (``"unified"``, or ``"unified (prompt-only)"``), judged by ``refinement_quality``.

    Raises:
        ValueError: if ``card`` has no ``llm`` component,
            or if ``prompts`` can be longer than the card's ``max_prompt_words`` (no room for the refiners' words).
    """
    if "llm" not in card.components:
        raise ValueError(f"unified RL needs a card with a refiner LM (the 'unified' card); {card.model_id!r} has none")
    _check_room(card, prompts)
    method = UnifiedRL(card, scorer_reward(scorer, prompts.terms), config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c, stop=None: refinement_quality(
            c, scorer, prompts, evaluation, num_steps=config.generator.sampling.num_steps, should_stop=stop
        )

    headline = _refinement_headline

    return Run(
        name="unified" if config.joint else "unified (prompt-only)",
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(card, config, prompts, prompts_per_step, evaluation),
        evaluate=evaluate,
        curves=REFINEMENT_CURVES,
        headline=headline,
    )


def joint_run(
    card: Card,
    scorer: Card,
    config: JointMultiExpertRLConfig,
    prompts: PromptSpec = PromptSpec(mention=0.0, prefer=(("stroke", 1), ("position", 2), ("brightness", 0))),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """JointMultiExpertRL on a ``multi-expert`` card (build one with ``toy_multi_expert.from_unified``).

    The reward's parts are the scorer's per-term probabilities, so under ``credit="per_expert"`` refiner
    i is credited with the term of the attribute it owns; the curves include every part (one per expert).

    Args:
        card: a ``multi-expert`` card (stacked refiners).
        scorer: the ``digit-scorer`` card: the reward and, with the independent evaluators, the judge.
        config: the JointMultiExpertRL settings.
        prompts: the prompt distribution (default: bare digits, each attribute's preferred word rewarded).
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``"joint (...)"`` ``Run``, judged by ``refinement_quality``.

    Raises:
        ValueError: if ``card`` has no stacked refiners,
            or if ``prompts`` can be longer than the card's ``max_prompt_words`` (no room for the refiners' words).
    """
    if toy_multi_expert.COMPONENT not in card.components:
        raise ValueError(f"joint RL needs a multi-expert card (stacked refiners); {card.model_id!r} has none")
    _check_room(card, prompts)
    method = JointMultiExpertRL(card, scorer_reward(scorer, prompts.terms), config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c, stop=None: refinement_quality(
            c, scorer, prompts, evaluation, num_steps=config.generator.sampling.num_steps, should_stop=stop
        )
    names = toy_multi_expert.expert_names(card)

    def headline(before: dict, after: dict) -> dict:
        rates = {
            f"preferred_{name}_rate": _change(before, after, "preferred_word_rate_by_attribute", name)
            for name in before["preferred_word_rate_by_attribute"]
        }
        return {
            **_judged(
                before,
                after,
                {"refined_all_right": ("refined", "all_right"), "original_all_right": ("original", "all_right")},
            ),
            **rates,
        }

    parts = tuple(f"reward_{t}" for t in prompts.terms if t != "digit")
    return Run(
        name=f"joint ({len(names)} refiners, {config.credit} credit{'' if config.joint else ', prompt-only'})",
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(
            card,
            config,
            prompts,
            prompts_per_step,
            evaluation,
            refiners=len(names),
            slots=[card.spec.config.slot(i) for i in range(len(names))],
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


def mot_run(
    card: Card,
    scorer: Card,
    config: SharedMoTRLConfig,
    prompts: PromptSpec = PromptSpec(mention=0.5),
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """RL on shared weights (``SharedMoTRL``) on a MoT card: the thinker and the generator are one
    transformer. Prompts and evaluation as ``unified_run`` (thinking plays the refiner's part).

    Args:
        card: a Mixture-of-Transformers card (``bagel-mot``).
        scorer: the ``digit-scorer`` card: the reward and, with the independent evaluators, the judge.
        config: the SharedMoTRL settings.
        prompts: the prompt distribution; its ``terms`` are the reward's.
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``"mot"`` ``Run``, judged by ``refinement_quality``.

    Raises:
        ValueError: if ``card`` is not a ``toy_mot`` card,
            or if ``prompts`` can be longer than the card's ``max_prompt_words`` (no room for the refiners' words).
    """
    if card.spec.family != "toy_mot":
        raise ValueError(
            f"train mot needs a Mixture-of-Transformers card (e.g. 'bagel-mot'); {card.model_id!r} is not one"
        )
    _check_room(card, prompts)
    method = SharedMoTRL(card, scorer_reward(scorer, prompts.terms), config)
    evaluate = None
    if evaluation is not None:
        evaluate = lambda c, stop=None: refinement_quality(
            c, scorer, prompts, evaluation, num_steps=config.generator.sampling.num_steps, should_stop=stop
        )
    return Run(
        name="mot",
        method=method,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(card, config, prompts, prompts_per_step, evaluation),
        evaluate=evaluate,
        curves={
            **REFINEMENT_CURVES,
            "interference.png": ("cos_all", "cos_shared", "cos_understanding", "cos_generation", "cos_io"),
        },
        headline=_refinement_headline,
    )
