"""A ``Run``: what ``execute`` trains — a trainer, its batches, its evaluation, its curves and report headline.

Worlds build them (``jaxpipe.digits.runs``); so can a user, for their own card, prompts and reward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["Run"]


@dataclasses.dataclass
class Run:
    """One RL run, ready for ``execute``.

    name: the method's command name (``"flow-grpo"``); method: ``init(key)``, ``step(state, batch,
    key)``, ``card(state)``; batches: endless batches for ``step``; settings: a JSON-able record;
    evaluate: ``(card, should_stop=None) -> quality dict`` (with ``"diversity"``; raises ``Stopped`` between
    batches once ``should_stop()`` is true), or None to skip evaluation;
    curves: PNG file name -> metric keys drawn in it; headline: ``(before, after) -> numbers`` for
    the report's summary; summary_keys: the metrics whose first and last steps the report compares.
    """

    name: str
    method: Any
    batches: Iterator[Any]
    settings: dict
    evaluate: Callable[..., dict] | None = None
    curves: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=lambda: {"reward.png": ("reward_mean",)})
    headline: Callable[[dict, dict], dict] | None = None
    summary_keys: tuple[str, ...] = ("reward_mean", "reward_refined", "reward_original")
