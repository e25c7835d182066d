"""Concrete cards, by id. ``available()`` lists the ids; ``build(id)`` makes a freshly initialised card."""

from __future__ import annotations

from collections.abc import Callable

from jaxpipe.card import Card
from jaxpipe.cards import flux_t2i

_BUILDERS: dict[str, Callable[..., Card]] = {
    flux_t2i.MODEL_ID: flux_t2i.build,
}


def available() -> list[str]:
    """Ids of the cards jaxpipe can build."""
    return sorted(_BUILDERS)


def build(model_id: str, *, seed: int = 0, config=None) -> Card:
    """A randomly initialised card ``model_id`` (deterministic in ``seed``), with an optional family config."""
    if model_id not in _BUILDERS:
        raise KeyError(f"unknown card {model_id!r}; available cards: {available()}")
    builder = _BUILDERS[model_id]
    return builder(seed=seed) if config is None else builder(config, seed=seed)


__all__ = ["available", "build", "flux_t2i"]
