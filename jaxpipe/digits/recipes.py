"""The digits world's training recipes: what ``jaxpipe train METHOD`` (``--world digits``, the default) runs.

Each method's run is a ``jaxpipe.digits.runs`` builder on the world's prompt grammar, with the ``digit-scorer``
reward over the ``terms`` options and its evaluation (the scorer beside independent judges). The options, as
``jaxpipe train`` takes them: ``terms`` (``--terms``), ``mention`` (``--mention``), ``prefer`` (``--prefer``),
``scorer`` (``--scorer``), and per method ``teacher`` (self-forcing) and ``refiners`` (joint).
"""

from __future__ import annotations

import functools

from jaxpipe import cards
from jaxpipe.card import Card
from jaxpipe.digits import runs
from jaxpipe.digits.evaluation import EvalSettings
from jaxpipe.training.runs.recipes import Recipe, RunSettings, register_recipe

__all__ = ["MENTION", "PREFER", "evaluation", "prompt_spec", "register"]

WORLD = "digits"
MENTION = {"flow-grpo": 1.0, "nft": 1.0, "dmd2": 0.5, "unified": 0.5, "mot": 0.5, "joint": 0.0}
"""Each method's default probability that a prompt names each rewarded attribute."""
PREFER = {"unified": "", "mot": "", "joint": "stroke=thick,position=right,brightness=dim"}
"""Each refining method's default preferred attributes (what the reward asks for when a prompt leaves them out)."""
PRESETS = {"nft": "geneval"}
"""Each method's default preset on this world: NFT's official recipe, which beats its method flags by the independent
judges (all right 85 -> 97%, two seeds; the flags' defaults: 85 -> 86%; ``docs/training/nft.md``). FlowGRPO keeps its
method flags (the README's +12 points)."""
TERMS = "digit,stroke,position,brightness"
SCORER = "digit-scorer"
MODEL = {
    "flow-grpo": "flux-t2i",
    "nft": "flux-t2i",
    "dmd2": "flux-t2i",
    "self-forcing": "wan-causal",
    "unified": "unified",
    "mot": "bagel-mot",
    "joint": "unified",
}


def prompt_spec(method: str, settings: RunSettings) -> runs.PromptSpec:
    """The ``PromptSpec`` of ``method``'s run: its ``terms`` / ``mention`` / ``prefer`` options or their defaults.

    Args:
      method: the ``jaxpipe train`` command.
      settings: the run's settings.

    Returns:
      The prompt distribution and reward terms.

    Raises:
      ValueError: naming a bad term, mention or preference.
    """
    return runs.PromptSpec(
        terms=runs.parse_terms(str(settings.option("terms", TERMS))),
        mention=float(settings.option("mention", MENTION.get(method, 1.0))),
        prefer=runs.parse_preferences(str(settings.option("prefer", PREFER.get(method, "")))),
    )


def evaluation(settings: RunSettings) -> EvalSettings | None:
    """The before/after evaluation of ``settings``.

    Args:
      settings: the run's settings (``eval_samples``: prompts judged, default ``EvalSettings.samples``).

    Returns:
      The ``EvalSettings``, or ``None`` when ``settings.evaluate`` is off.
    """
    if not settings.evaluate:
        return None
    return EvalSettings(
        samples=settings.eval_samples or EvalSettings.samples,
        diversity_prompts=settings.diversity_prompts,
        diversity_seeds=settings.diversity_seeds,
        seed=settings.eval_seed,
    )


def _check_prompts(method: str, settings: RunSettings) -> None:
    prompt_spec(method, settings)


def _scorer(settings: RunSettings) -> Card:
    return cards.load(str(settings.option("scorer", SCORER)))


def _generator(method: str):
    """The recipe build of ``method``'s row of ``runs.METHODS``."""

    def build(card: Card, config, settings: RunSettings):
        if method == "joint":  # each refiner owns an attribute slot of the digits prompts
            from jaxpipe.digits import cards as digit_cards

            card = digit_cards.multi_expert(card, int(settings.option("refiners", 3)))
        return runs.build(
            method,
            card,
            _scorer(settings),
            config,
            prompt_spec(method, settings),
            prompts_per_step=settings.prompts_per_step,
            seed=settings.seed,
            evaluation=evaluation(settings),
        )

    return build


def _self_forcing(card: Card, config, settings: RunSettings):
    teacher = cards.load(str(settings.option("teacher", "wan-t2v")))
    return runs.self_forcing_run(
        card,
        teacher,
        _scorer(settings),
        config,
        prompts_per_step=settings.prompts_per_step,
        seed=settings.seed,
        evaluation=evaluation(settings),
    )


_PROMPT_OPTIONS = {
    "terms": f"the digit-scorer's reward terms, comma-separated (default {TERMS}; digit required)",
    "mention": "probability that a prompt names each rewarded attribute",
    "prefer": "ATTRIBUTE=WORD,...: the labels the reward asks for when a prompt leaves the attribute out",
    "scorer": f"the reward model card (default {SCORER})",
}


def register() -> None:
    """Register a recipe for each method ``jaxpipe train`` has."""
    for method in runs.METHODS:
        options = dict(_PROMPT_OPTIONS)
        if method == "joint":
            options["refiners"] = "refiner experts, each owning one attribute slot (default 3)"
        register_recipe(
            Recipe(
                WORLD,
                method,
                build=_generator(method),
                model=MODEL[method],
                preset=PRESETS.get(method),
                options=options,
                description=f"{method} on {MODEL[method]}: digit-scorer reward, judged by it and by independent judges",
                check_options=functools.partial(_check_prompts, method),
            )
        )
    register_recipe(
        Recipe(
            WORLD,
            "self-forcing",
            build=_self_forcing,
            model=MODEL["self-forcing"],
            options={
                "scorer": _PROMPT_OPTIONS["scorer"],
                "teacher": "the bidirectional teacher card (default wan-t2v)",
            },
            description="self-forcing on wan-causal against wan-t2v, on digit-and-motion captions",
        )
    )
