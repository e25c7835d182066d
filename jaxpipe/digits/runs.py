"""The digits world's RL runs, which ``jaxpipe train`` and the examples execute: a trainer, its prompt stream,
its evaluation and curves.

A ``Run`` (``jaxpipe.training.runs``) bundles a trainer (``init``, jitted ``step``, ``card(state)``), an
endless stream of prompt batches, a before/after evaluation and the curves to draw;
``jaxpipe.training.runs.execute`` trains it (re-exported here as ``execute``).

``build(method, card, scorer, config, prompts)`` builds the run of any method in ``METHODS`` — a table of
``RunMethod`` rows (the trainer, the default prompts, the judge, the curves and the headline of each method);
``flow_grpo_run``, ``nft_run``, ``dmd2_run``, ``unified_run``, ``joint_run`` and ``mot_run`` name its rows.
``self_forcing_run`` builds the video distillation (a teacher, motion captions). Another method needs one row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jaxpipe.card import Card
from jaxpipe.cards import registry, toy_multi_expert
from jaxpipe.cards.checkpoint import config_to_dict
from jaxpipe.digits import headlines
from jaxpipe.digits.evaluation import EvalSettings, generator_quality, refinement_quality, video_quality
from jaxpipe.digits.headlines import HACKING_GAP
from jaxpipe.digits.headlines import judged as _judged  # noqa: F401  (the name tests and older callers use)
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
    "RunMethod",
    "METHODS",
    "build",
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


@dataclasses.dataclass(frozen=True)
class RunMethod:
    """How ``build`` makes one method's run on the digits world.

    Attributes:
      trainer: ``(card, scorer, config, prompts) -> method`` (``init``, ``step``, ``card``).
      prompts: the default prompt distribution of the training batches and the evaluation.
      quality: the before/after judge, ``(card, scorer, prompts, evaluation, *, num_steps, should_stop) -> dict``
        (``generator_quality`` or ``refinement_quality``).
      num_steps: ``config -> sampling steps`` the judge renders with.
      name: ``(card, config) -> the run's name``.
      curves: ``(card, prompts) -> {file: metrics}``.
      headline: ``(before, after) -> dict`` (``jaxpipe.digits.headlines``).
      check: ``(card, prompts) -> None``, raising ``ValueError`` when ``card`` cannot be trained so.
      settings: ``card -> extra settings`` recorded in ``report.json`` (``None``: none).
      summary_keys: the metrics the report compares (``None``: ``Run``'s default).
    """

    trainer: Callable[[Card, Card, Any, PromptSpec], Any]
    prompts: PromptSpec
    quality: Callable[..., dict]
    num_steps: Callable[[Any], int]
    name: Callable[[Card, Any], str]
    curves: Callable[[Card, PromptSpec], Mapping[str, tuple[str, ...]]]
    headline: Callable[[dict, dict], dict]
    check: Callable[[Card, PromptSpec], None]
    settings: Callable[[Card], dict] | None = None
    summary_keys: tuple[str, ...] | None = None


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


def build(
    method: str,
    card: Card,
    scorer: Card,
    config,
    prompts: PromptSpec | None = None,
    *,
    prompts_per_step: int = 4,
    seed: int = 0,
    evaluation: EvalSettings | None = EvalSettings(),
) -> Run:
    """The ``Run`` of ``method`` (a key of ``METHODS``) on ``card`` with the ``digit-scorer`` ``scorer``.

    The scorer is the reward over ``prompts.terms`` (DMD2 has none) and, with the independent evaluators, the
    judge; the headline compares the scorer's and the independent evaluators' gains (``HACKING_GAP``).

    Args:
        method: ``"flow-grpo"``, ``"nft"``, ``"dmd2"``, ``"unified"``, ``"joint"`` or ``"mot"``.
        card: the card trained (its kind is the method's: a text-to-image card, a ``unified`` card, ...).
        scorer: the ``digit-scorer`` card.
        config: the method's settings (``FlowGRPOConfig``, ``DiffusionNFTConfig``, ...).
        prompts: the prompt distribution; its ``terms`` are the reward's (``None``: the method's default).
        prompts_per_step: prompts per training step.
        seed: the seed of the prompt stream.
        evaluation: the before/after evaluation's settings (``None``: no evaluation).

    Returns:
        The ``Run``, ready for ``execute``.

    Raises:
        KeyError: if ``method`` is not in ``METHODS``.
        ValueError: if ``card`` cannot be trained by ``method`` (e.g. a ``unified`` card under ``flow-grpo``),
            or if ``prompts`` leave a refining card no room for its words.
    """
    row = METHODS[method]
    prompts = row.prompts if prompts is None else prompts
    row.check(card, prompts)
    trainer = row.trainer(card, scorer, config, prompts)
    evaluate = None
    if evaluation is not None:
        num_steps = row.num_steps(config)
        evaluate = lambda c, stop=None: row.quality(
            c, scorer, prompts, evaluation, num_steps=num_steps, should_stop=stop
        )
    extra = {} if row.summary_keys is None else {"summary_keys": row.summary_keys}
    recorded = {} if row.settings is None else row.settings(card)
    return Run(
        name=row.name(card, config),
        method=trainer,
        batches=prompt_batches(card, prompts, prompts_per_step, seed),
        settings=_settings(card, config, prompts, prompts_per_step, evaluation, **recorded),
        evaluate=evaluate,
        curves=row.curves(card, prompts),
        headline=row.headline,
        **extra,
    )


def flow_grpo_run(
    card: Card, scorer: Card, config: FlowGRPOConfig, prompts: PromptSpec | None = None, **settings
) -> Run:
    """FlowGRPO on a text-to-image card (e.g. ``flux-t2i``): ``build("flow-grpo", ...)``, judged by
    ``generator_quality`` at the config's sampling steps.

    Args:
        card: a text-to-image card (the policy).
        scorer: the ``digit-scorer`` card.
        config: the FlowGRPO settings.
        prompts: the prompt distribution (``None``: every rewarded attribute named).
        **settings: ``prompts_per_step``, ``seed``, ``evaluation`` as ``build`` takes them.

    Returns:
        The ``"flow-grpo"`` ``Run``.
    """
    return build("flow-grpo", card, scorer, config, prompts, **settings)


def nft_run(card: Card, scorer: Card, config: DiffusionNFTConfig, prompts: PromptSpec | None = None, **settings) -> Run:
    """DiffusionNFT on a text-to-image card: ``build("nft", ...)``, judged as ``flow_grpo_run``.

    Args:
        card: a text-to-image card (the policy).
        scorer: the ``digit-scorer`` card.
        config: the DiffusionNFT settings.
        prompts: the prompt distribution (``None``: every rewarded attribute named).
        **settings: ``prompts_per_step``, ``seed``, ``evaluation`` as ``build`` takes them.

    Returns:
        The ``"nft"`` ``Run``.
    """
    return build("nft", card, scorer, config, prompts, **settings)


def dmd2_run(card: Card, scorer: Card, config: DMD2Config, prompts: PromptSpec | None = None, **settings) -> Run:
    """DMD2: distil text-to-image ``card`` (the teacher) into a ``config.student_steps``-step student:
    ``build("dmd2", ...)``; the scorer only judges (the student before training is the teacher at its steps).

    Args:
        card: a text-to-image card, the teacher (the student starts as a copy).
        scorer: the ``digit-scorer`` card (the judge only).
        config: the DMD2 settings.
        prompts: the prompt distribution (``None``: each attribute named half the time).
        **settings: ``prompts_per_step``, ``seed``, ``evaluation`` as ``build`` takes them.

    Returns:
        The ``"dmd2 (N-step student)"`` ``Run``.
    """
    return build("dmd2", card, scorer, config, prompts, **settings)


def unified_run(
    card: Card, scorer: Card, config: UnifiedRLConfig, prompts: PromptSpec | None = None, **settings
) -> Run:
    """UnifiedRL (joint, or prompt-only with ``config.joint=False``) on a ``unified`` card: ``build("unified", ...)``,
    judged by ``refinement_quality``. ``prompts.prefer`` labels the attributes a prompt leaves out, which the
    refiner can learn to ask for.

    Args:
        card: a card with a refiner LM (``unified``).
        scorer: the ``digit-scorer`` card.
        config: the UnifiedRL settings.
        prompts: the prompt distribution (``None``: each attribute named half the time).
        **settings: ``prompts_per_step``, ``seed``, ``evaluation`` as ``build`` takes them.

    Returns:
        The ``"unified"`` (or ``"unified (prompt-only)"``) ``Run``.
    """
    return build("unified", card, scorer, config, prompts, **settings)


def joint_run(
    card: Card, scorer: Card, config: JointMultiExpertRLConfig, prompts: PromptSpec | None = None, **settings
) -> Run:
    """JointMultiExpertRL on a ``multi-expert`` card (``toy_multi_expert.from_unified``): ``build("joint", ...)``.
    The reward's parts are the scorer's per-term probabilities, so under ``credit="per_expert"`` refiner i is
    credited with the term of the attribute it owns; the curves include every part.

    Args:
        card: a ``multi-expert`` card (stacked refiners).
        scorer: the ``digit-scorer`` card.
        config: the JointMultiExpertRL settings.
        prompts: the prompt distribution (``None``: bare digits, each attribute's preferred word rewarded).
        **settings: ``prompts_per_step``, ``seed``, ``evaluation`` as ``build`` takes them.

    Returns:
        The ``"joint (...)"`` ``Run``.
    """
    return build("joint", card, scorer, config, prompts, **settings)


def mot_run(card: Card, scorer: Card, config: SharedMoTRLConfig, prompts: PromptSpec | None = None, **settings) -> Run:
    """RL on shared weights (``SharedMoTRL``) on a MoT card, whose thinker and generator are one transformer:
    ``build("mot", ...)``; prompts and evaluation as ``unified_run`` (thinking plays the refiner's part).

    Args:
        card: a Mixture-of-Transformers card (``bagel-mot``).
        scorer: the ``digit-scorer`` card.
        config: the SharedMoTRL settings.
        prompts: the prompt distribution (``None``: each attribute named half the time).
        **settings: ``prompts_per_step``, ``seed``, ``evaluation`` as ``build`` takes them.

    Returns:
        The ``"mot"`` ``Run``.
    """
    return build("mot", card, scorer, config, prompts, **settings)


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
        headline=headlines.video,
        summary_keys=("loss", "critic_loss"),
    )


def _rewarded(cls) -> Callable[[Card, Card, Any, PromptSpec], Any]:
    """The trainer of an RL method ``cls(card, reward, config)`` rewarded by the scorer over ``prompts.terms``."""
    return lambda card, scorer, config, prompts: cls(card, scorer_reward(scorer, prompts.terms), config)


def _text_to_image(command: str) -> Callable[[Card, PromptSpec], None]:
    def check(card: Card, prompts: PromptSpec) -> None:
        if "refine" in registry.default_program(card).inputs:
            raise ValueError(
                f"{command} trains a text-to-image card; {card.model_id!r} refines its prompts first "
                "(use `train unified`)"
            )

    return check


def _refining(has_room: Callable[[Card], bool], missing: str) -> Callable[[Card, PromptSpec], None]:
    """The check of a card that rewrites its prompts: ``has_room(card)`` (else ``missing``, formatted with the
    card's id), and prompts short enough to leave the refiner(s) room for their words."""

    def check(card: Card, prompts: PromptSpec) -> None:
        if not has_room(card):
            raise ValueError(missing.format(card.model_id))
        limit = card.spec.config.max_prompt_words
        if prompts.max_words > limit:
            raise ValueError(
                f"prompts of up to {prompts.max_words} words do not leave the refiner(s) room ({limit} words at most)"
            )

    return check


def _joint_name(card: Card, config: JointMultiExpertRLConfig) -> str:
    refiners = len(toy_multi_expert.expert_names(card))
    return f"joint ({refiners} refiners, {config.credit} credit{'' if config.joint else ', prompt-only'})"


def _joint_curves(card: Card, prompts: PromptSpec) -> dict:
    return {
        "reward.png": ("reward_mean",),
        "reward_per_expert.png": tuple(f"reward_{t}" for t in prompts.terms if t != "digit"),
        "refined_vs_original.png": ("reward_refined", "reward_original"),
        "refiner_losses.png": tuple(f"{name}_loss" for name in toy_multi_expert.expert_names(card)),
    }


def _joint_settings(card: Card) -> dict:
    refiners = len(toy_multi_expert.expert_names(card))
    return {"refiners": refiners, "slots": [card.spec.config.slot(i) for i in range(refiners)]}


REFINEMENT_CURVES = {
    "reward.png": ("reward_mean",),
    "refined_vs_original.png": ("reward_refined", "reward_original"),
    "refined_tokens.png": ("refined_tokens",),
    "kl.png": ("lm_kl", "gen_kl"),
}
"""The curves of a run whose card rewrites its prompt first (a refiner LM, or a MoT that thinks)."""

_generator = dict(quality=generator_quality, headline=headlines.generator)
_refiner = dict(
    quality=refinement_quality, headline=headlines.refinement, num_steps=lambda c: c.generator.sampling.num_steps
)

METHODS: dict[str, RunMethod] = {
    "flow-grpo": RunMethod(
        trainer=_rewarded(FlowGRPO),
        prompts=PromptSpec(),
        num_steps=lambda config: config.sampling.num_steps,
        name=lambda card, config: "flow-grpo",
        curves=lambda card, prompts: {"reward.png": ("reward_mean",), "kl.png": ("kl",)},
        check=_text_to_image("flow-grpo"),
        **_generator,
    ),
    "nft": RunMethod(
        trainer=_rewarded(DiffusionNFT),
        prompts=PromptSpec(),
        num_steps=lambda config: config.sampling.num_steps,
        name=lambda card, config: "nft",
        curves=lambda card, prompts: {
            "reward.png": ("reward_mean",),
            "loss.png": ("loss_pos", "loss_neg"),
            "old_policy.png": ("ema_decay", "r_mean"),
        },
        check=_text_to_image("nft"),
        **_generator,
    ),
    "dmd2": RunMethod(
        trainer=lambda card, scorer, config, prompts: DMD2(card, config),
        prompts=PromptSpec(mention=0.5),
        num_steps=lambda config: config.student_steps,
        name=lambda card, config: f"dmd2 ({config.student_steps}-step student)",
        curves=lambda card, prompts: {
            "losses.png": ("dm_loss", "critic_loss"),
            "gaps.png": ("real_gap", "fake_real_gap"),
        },
        check=_text_to_image("dmd2"),
        summary_keys=("dm_loss", "critic_loss", "real_gap", "fake_real_gap"),
        **_generator,
    ),
    "unified": RunMethod(
        trainer=_rewarded(UnifiedRL),
        prompts=PromptSpec(mention=0.5),
        name=lambda card, config: "unified" if config.joint else "unified (prompt-only)",
        curves=lambda card, prompts: REFINEMENT_CURVES,
        check=_refining(
            lambda card: "llm" in card.components,
            "unified RL needs a card with a refiner LM (the 'unified' card); {!r} has none",
        ),
        **_refiner,
    ),
    "mot": RunMethod(
        trainer=_rewarded(SharedMoTRL),
        prompts=PromptSpec(mention=0.5),
        name=lambda card, config: "mot",
        curves=lambda card, prompts: {
            **REFINEMENT_CURVES,
            "interference.png": ("cos_all", "cos_shared", "cos_understanding", "cos_generation", "cos_io"),
        },
        check=_refining(
            lambda card: card.spec.family == "toy_mot",
            "train mot needs a Mixture-of-Transformers card (e.g. 'bagel-mot'); {!r} is not one",
        ),
        **_refiner,
    ),
    "joint": RunMethod(
        trainer=_rewarded(JointMultiExpertRL),
        prompts=PromptSpec(mention=0.0, prefer=(("stroke", 1), ("position", 2), ("brightness", 0))),
        quality=refinement_quality,
        num_steps=lambda config: config.generator.sampling.num_steps,
        name=_joint_name,
        curves=_joint_curves,
        headline=headlines.experts,
        check=_refining(
            lambda card: toy_multi_expert.COMPONENT in card.components,
            "joint RL needs a multi-expert card (stacked refiners); {!r} has none",
        ),
        settings=_joint_settings,
    ),
}
"""The methods ``build`` knows, by ``jaxpipe train`` command: a new method is one ``RunMethod`` row."""
