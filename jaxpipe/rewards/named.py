"""Reward models a world ships under an id (the digits world's ``digit-scorer``), for servers to score with.

A world registers each one with ``register(id, card, build)`` from its ``register()``: ``card`` is the
id of the card the reward scores with, and ``build(card) -> Scoring`` makes the reward from that card
once it is loaded. ``available()`` registers the worlds first (``jaxpipe.worlds.load``), so the core
never imports a world to find them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["NamedReward", "Scoring", "available", "register"]


@dataclasses.dataclass(frozen=True)
class Scoring:
    """What a named reward scores with.

    Attributes:
      reward: ``reward(artifacts, prompts) -> (B,)`` or ``{part: (B,)}``.
      labels: ``labels(texts) -> {name: (B,)}``, the metadata the reward reads from prompt texts, or ``None``.
      label_names: the names ``labels`` gives.
    """

    reward: Callable
    labels: Callable[[list[str]], Mapping[str, np.ndarray]] | None = None
    label_names: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class NamedReward:
    """A reward model a world ships: its ``id``, the ``card`` it scores with and how to ``build`` it from that card."""

    id: str
    card: str
    build: Callable[[Any], Scoring]


_NAMED: dict[str, NamedReward] = {}


def register(reward_id: str, card: str, build: Callable[[Any], Scoring]) -> None:
    """Ship the reward model ``reward_id``, built by ``build(card)`` from the card ``card`` (a world's ``register()``
    calls it; registering an id again replaces it).

    Args:
      reward_id: the id requests name it by (e.g. ``"digit-scorer"``).
      card: the id of the card it scores with.
      build: ``build(loaded card) -> Scoring``.

    Raises:
      ValueError: on an empty id or card id.
    """
    if not reward_id or not card:
        raise ValueError(f"a named reward needs an id and a card id (got {reward_id!r}, {card!r})")
    _NAMED[reward_id] = NamedReward(reward_id, card, build)


def available() -> dict[str, NamedReward]:
    """Every registered reward model by id (the worlds registered first).

    Returns:
      ``{id: NamedReward}``.
    """
    from jaxpipe import worlds

    worlds.load()
    return dict(_NAMED)
