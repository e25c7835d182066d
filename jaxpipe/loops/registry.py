"""The one table of loop kinds: kind -> the driver that runs and steps loops of that kind.

A card's ``LoopSpec.kind`` must be a key here (checked when the card is built), and the program
and the engine reach every loop through its kind's driver. A new loop kind is one module (its
state, pure ``step``, fused ``run`` and a ``Driver``) plus one line in ``KINDS`` (or a call to
``register`` from outside the package).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Protocol

import jax
import numpy as np

from jaxpipe.loops import ar_driver, chunk, denoise_driver

__all__ = ["LoopDriver", "KINDS", "driver", "register", "unregister"]


class LoopDriver(Protocol):
    """What the program and the engine need of a loop kind (every function pure and jittable but ``check``).

    ``models`` is the tuple of the components the loop binds, in ``LoopSpec.binds`` order; ``state`` is
    the kind's state pytree (leading axis ``B`` on every leaf) and ``config`` its static config.

    Attributes:
      kind: the loop kind this driver runs (its key in ``KINDS``).
    """

    kind: str

    def check(self, loop) -> None:
        """Check, when a card is built, that ``loop`` can run.

        Args:
          loop: the ``LoopSpec`` (its config, binds and latent shape).

        Raises:
          ValueError: if it cannot, saying why.
        """

    def step(self, models, state, config) -> Any:
        """Advance every unfinished row of ``state`` by one step (finished rows stay as they are).

        Args:
          models: the bound components.
          state: the batch's state.
          config: the batch's config.

        Returns:
          The new state.
        """

    def run(self, models, state, config, *, capture: bool = False) -> tuple[Any, Any]:
        """Every remaining step, as fused ``lax.scan`` loops.

        Args:
          models: the bound components.
          state: the batch's state.
          config: the batch's config (static under ``jit``).
          capture: also return the kind's per-step records (static under ``jit``).

        Returns:
          ``(final state, records or None)``.
        """

    def num_steps(self, config) -> int:
        """How many ``step`` calls a request with ``config`` takes.

        Args:
          config: the request's config.
        """

    def batch_key(self, config) -> Hashable:
        """The key requests batch by: requests whose configs give equal keys may share a batch.

        Args:
          config: a request's config.
        """

    def batch_config(self, config, width: int) -> Hashable:
        """The config a batch of ``width`` steps starts with.

        Args:
          config: a member's config.
          width: the batch's step count (at least every member's ``num_steps``).
        """

    def schedule(self, config, width: int) -> np.ndarray:
        """One request's per-row schedule in a batch of ``width`` steps (an empty row for kinds without one).

        Args:
          config: the request's config.
          width: the batch's step count.
        """

    def with_schedule(self, state, schedule: jax.Array) -> Any:
        """``state`` with each row's own schedule.

        Args:
          state: the batch's state.
          schedule: the stacked rows of ``schedule``.
        """

    def deactivate(self, state, rows: jax.Array) -> Any:
        """``state`` with ``rows`` retired: later steps leave them unchanged.

        Args:
          state: the batch's state.
          rows: ``(B,)`` bool, the rows to retire.
        """

    def empty(self, state, capacity: int) -> Any:
        """``capacity`` inert (finished) rows shaped like one row of ``state``, to pad a batch.

        Args:
          state: a state to take the row shapes from.
          capacity: the number of rows.
        """

    def latents(self, state) -> jax.Array:
        """What a preview of the loop shows: its current latents (or token buffer), leading axis ``B``.

        Args:
          state: the batch's state.
        """


KINDS: dict[str, LoopDriver | None] = {
    "denoise": denoise_driver.DRIVER,
    "ar_decode": ar_driver.DRIVER,
    "chunk_rollout": chunk.DRIVER,
    # a reward model's single forward pass: programs run it as a component node, nothing steps it
    "score": None,
}
"""Loop kind -> its driver (``None``: a kind no program steps)."""


def driver(kind: str) -> LoopDriver:
    """The driver of loop kind ``kind``.

    Args:
      kind: a loop kind (``LoopSpec.kind``).

    Returns:
      Its ``LoopDriver``.

    Raises:
      ValueError: if ``kind`` has no driver (unknown, or a kind no program steps such as ``"score"``);
        the message names the kinds that have one.
    """
    found = KINDS.get(kind)
    if found is None:
        drivable = sorted(k for k, d in KINDS.items() if d is not None)
        raise ValueError(f"no driver for loop kind {kind!r}; loops of kinds {drivable} can be driven")
    return found


def register(kind: str, loop_driver: LoopDriver | None, *, replace: bool = False) -> None:
    """Add loop kind ``kind`` to ``KINDS``.

    Args:
      kind: the new kind's name, a non-empty string.
      loop_driver: its driver (``None``: a kind no program steps).
      replace: allow changing an existing kind.

    Raises:
      ValueError: if ``kind`` is not a non-empty string, or is registered already and ``replace`` is false.
    """
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a loop kind is a non-empty string (got {kind!r})")
    if kind in KINDS and not replace:
        raise ValueError(f"loop kind {kind!r} is already registered (pass replace=True)")
    KINDS[kind] = loop_driver


def unregister(kind: str) -> None:
    """Remove loop kind ``kind`` from ``KINDS``.

    Args:
      kind: a registered loop kind.

    Raises:
      KeyError: if ``kind`` is not registered.
    """
    del KINDS[kind]
