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

from jaxpipe.loops import ar, chunk, denoise

__all__ = ["LoopDriver", "KINDS", "driver", "register", "unregister"]


class LoopDriver(Protocol):
    """What the program and the engine need of a loop kind (every function pure and jittable but ``check``).

    ``models`` is the tuple of the components the loop binds, in ``LoopSpec.binds`` order.
    """

    kind: str

    def check(self, loop) -> None: ...

    def step(self, models, state, config) -> Any: ...

    def run(self, models, state, config, *, capture: bool = False) -> tuple[Any, Any]: ...

    def num_steps(self, config) -> int: ...

    def batch_key(self, config) -> Hashable: ...

    def batch_config(self, config, width: int) -> Hashable: ...

    def schedule(self, config, width: int) -> np.ndarray: ...

    def with_schedule(self, state, schedule: jax.Array) -> Any: ...

    def deactivate(self, state, rows: jax.Array) -> Any: ...

    def empty(self, state, capacity: int) -> Any: ...

    def latents(self, state) -> jax.Array: ...


KINDS: dict[str, LoopDriver | None] = {
    "denoise": denoise.DRIVER,
    "ar_decode": ar.DRIVER,
    "chunk_rollout": chunk.DRIVER,
    # a reward model's single forward pass: programs run it as a component node, nothing steps it
    "score": None,
}
"""Loop kind -> its driver (``None``: a kind no program steps)."""


def driver(kind: str) -> LoopDriver:
    """The driver of loop kind ``kind`` (``ValueError`` naming the kinds that have one otherwise)."""
    found = KINDS.get(kind)
    if found is None:
        drivable = sorted(k for k, d in KINDS.items() if d is not None)
        raise ValueError(f"no driver for loop kind {kind!r}; loops of kinds {drivable} can be driven")
    return found


def register(kind: str, loop_driver: LoopDriver | None, *, replace: bool = False) -> None:
    """Add loop kind ``kind`` (``replace=True`` to change an existing one)."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a loop kind is a non-empty string (got {kind!r})")
    if kind in KINDS and not replace:
        raise ValueError(f"loop kind {kind!r} is already registered (pass replace=True)")
    KINDS[kind] = loop_driver


def unregister(kind: str) -> None:
    del KINDS[kind]
