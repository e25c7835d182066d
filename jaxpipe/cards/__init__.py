"""Concrete cards. ``load(id)`` gives a bundled pretrained card; ``build(id)`` a freshly initialised one.

Each card family is a module with ``MODEL_ID``, a frozen ``Config`` dataclass and
``build(config, *, seed, model_id)``; its checkpoints are written by ``jaxpipe.checkpoint``.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from jaxpipe.card import Card
from jaxpipe.cards import digit_scorer, flux_t2i, multi_expert, unified, wan_i2v

ASSETS = Path(__file__).resolve().parent.parent / "assets"
"""Where the bundled pretrained cards live (one folder per card id)."""

_FAMILIES: dict[str, ModuleType] = {
    "digit_scorer": digit_scorer,
    "flux_t2i": flux_t2i,
    "multi_expert": multi_expert,
    "unified": unified,
    "wan_i2v": wan_i2v,
}


def family_module(family: str) -> ModuleType:
    """The module that builds cards of ``family`` (ValueError listing the families otherwise)."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown card family {family!r}; known families: {sorted(_FAMILIES)}")
    return _FAMILIES[family]


def _family_of(model_id: str) -> ModuleType:
    for module in _FAMILIES.values():
        if module.MODEL_ID == model_id:
            return module
    raise KeyError(f"unknown card {model_id!r}; buildable cards: {buildable()}")


def stacked_components(card: Card) -> dict[str, tuple[str, ...]]:
    """The components of ``card`` stored stacked on a leading expert axis, each mapped to its experts'
    names in axis order (``{"refiners": ("refiner_0", ...)}`` for ``multi-expert``); ``{}`` when none.

    A family declares them with a module-level ``stacked_components(card)``; families without that
    hook (and cards of unknown families) stack nothing. The engine versions, publishes and syncs
    each expert under its own name.
    """
    hook = getattr(_FAMILIES.get(card.spec.family), "stacked_components", None)
    return {} if hook is None else {name: tuple(experts) for name, experts in hook(card).items()}


def buildable() -> list[str]:
    """Ids of the cards jaxpipe can build from scratch."""
    return sorted(m.MODEL_ID for m in _FAMILIES.values())


def available() -> list[str]:
    """Ids of the bundled pretrained cards (``load(id)`` works for each)."""
    if not ASSETS.is_dir():
        return []
    return sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file())


def build(model_id: str, *, seed: int = 0, config=None) -> Card:
    """A freshly initialised card ``model_id`` (deterministic in ``seed``), with an optional family ``Config``."""
    module = _family_of(model_id)
    return module.build(module.Config() if config is None else config, seed=seed)


def load(model_id_or_path: str | os.PathLike) -> Card:
    """A pretrained card: a bundled id (see ``available()``) or a directory written by ``save_card``."""
    from jaxpipe.checkpoint import load_card

    name = os.fspath(model_id_or_path)
    if name in available():
        return load_card(ASSETS / name)
    if Path(name).is_dir():
        return load_card(name)
    raise KeyError(
        f"unknown card {name!r}: not a bundled card ({available() or 'none bundled yet'}) nor a checkpoint directory"
    )


__all__ = ["ASSETS", "available", "build", "buildable", "family_module", "digit_scorer", "flux_t2i", "load", "multi_expert", "stacked_components", "unified", "wan_i2v"]
