"""The family registry: family name -> ``Family`` (config, build, programs, stacked components).

Adding a card family to jaxpipe is one folder (``jaxpipe/cards/<family>/``, defining ``FAMILY``)
plus one line in ``BUNDLED`` below; from outside the package, ``register(family)``. Everything
that needs to know a family — checkpoints, the engine's default program, per-expert versions,
``Finetune``, ``jp.cards.build`` — looks it up here.
"""

from __future__ import annotations

from jaxpipe.card import Card
from jaxpipe.cards import bagel_mot, cosmos3, digit_scorer, flux, flux_t2i, multi_expert, unified, wan, wan_i2v, wan_t2v
from jaxpipe.cards import ltx2_two_stage
from jaxpipe.cards import wan22_moe
from jaxpipe.cards import wan_causal
from jaxpipe.cards.family import Family
from jaxpipe.program import Program

__all__ = ["BUNDLED", "FAMILIES", "register", "unregister", "family", "family_of", "by_model_id", "by_pipeline", "default_program", "stacked_components"]

BUNDLED: tuple[Family, ...] = (
    flux_t2i.FAMILY,
    wan_i2v.FAMILY,
    wan_t2v.FAMILY,
    ltx2_two_stage.FAMILY,
    wan22_moe.FAMILY,
    wan_causal.FAMILY,
    unified.FAMILY,
    multi_expert.FAMILY,
    digit_scorer.FAMILY,
    bagel_mot.FAMILY,
    cosmos3.FAMILY,
    flux.FAMILY,
    wan.FAMILY,
)
"""The families jaxpipe ships, one line each."""

FAMILIES: dict[str, Family] = {f.name: f for f in BUNDLED}


def register(new: Family, *, replace: bool = False) -> Family:
    """Add a family (``replace=True`` to change one); returns it. Its ``model_id`` must be unique."""
    if not isinstance(new, Family):
        raise TypeError(f"register takes a jaxpipe.cards.Family (got {type(new).__name__})")
    if new.name in FAMILIES and not replace:
        raise ValueError(f"family {new.name!r} is already registered (pass replace=True)")
    clash = [f.name for f in FAMILIES.values() if f.name != new.name and new.model_id and f.model_id == new.model_id]
    if clash:
        raise ValueError(f"family {new.name!r}: model id {new.model_id!r} is already built by family {clash[0]!r}")
    FAMILIES[new.name] = new
    return new


def unregister(name: str) -> None:
    """Remove family ``name`` (KeyError if unknown)."""
    family(name)
    del FAMILIES[name]


def family(name: str) -> Family:
    """The registered family ``name`` (ValueError listing the families otherwise)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown card family {name!r}; known families: {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_of(card: Card) -> Family:
    """The family that built ``card``."""
    return family(card.spec.family)


def by_model_id(model_id: str) -> Family:
    """The family whose ``build`` gives card ``model_id`` by default (KeyError listing them otherwise)."""
    for f in FAMILIES.values():
        if f.model_id == model_id:
            return f
    raise KeyError(f"unknown card {model_id!r}; buildable cards: {sorted(f.model_id for f in FAMILIES.values() if f.model_id)}")


def by_pipeline(class_name: str) -> Family:
    """The family that loads diffusers pipeline ``class_name`` (KeyError listing the loadable ones otherwise)."""
    for f in FAMILIES.values():
        if class_name in f.pipelines:
            return f
    known = sorted(name for f in FAMILIES.values() for name in f.pipelines)
    raise KeyError(f"no card family loads a diffusers {class_name or 'unnamed'} pipeline; loadable: {known}")


def default_program(card: Card) -> Program:
    """The program the engine serves ``card`` with by default: its family's first."""
    return family_of(card).program()


def stacked_components(card: Card) -> dict[str, tuple[str, ...]]:
    """The components of ``card`` stored stacked on a leading expert axis, each mapped to its experts'
    names in axis order (``{"refiners": ("refiner_0", ...)}`` for ``multi-expert``); ``{}`` when none
    (or when the card's family is not registered)."""
    f = FAMILIES.get(card.spec.family)
    if f is None or f.stacked is None:
        return {}
    return {name: tuple(experts) for name, experts in f.stacked(card).items()}
