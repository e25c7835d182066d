"""Executing a program: the fused path and the split-at-loops steps, as pure functions.

``execute`` runs every node of a ``jaxpipe.program.Program``, loops as fused ``lax.scan``s, in one
jitted function (``Program.run``, ``jp.generate``, RL rollouts with ``capture``); ``enter`` moves a
batch to one loop of the program, the way the engine drives it (see ``jaxpipe.program``'s module
docstring for how the two paths relate). Everything here is pure; jit with the program and the
settings static. ``jaxpipe.program`` re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxpipe.program import Settings, Slots, config_of, driver

if TYPE_CHECKING:
    from jaxpipe.card import Card
    from jaxpipe.program import ComponentNode, Program

__all__ = ["Execution", "artifacts", "concat_rows", "enter", "execute", "split_rows"]


def concat_rows(rows: Sequence[Mapping[str, Any]]) -> Slots:
    """Slots of several requests concatenated along the batch axis.

    Args:
      rows: each request's slots (pytrees of arrays, leading batch axis), all with the same keys.

    Returns:
      ``{slot: (sum of B, ...)}`` as device arrays.
    """
    rows = list(rows)
    if len(rows) == 1:
        return {k: jax.tree.map(jnp.asarray, v) for k, v in rows[0].items()}
    return {
        k: jax.tree.map(lambda *xs: jnp.concatenate([jnp.asarray(x) for x in xs], axis=0), *[r[k] for r in rows])
        for k in rows[0]
    }


def _apply(card: Card, slots: Slots, nodes: Sequence[ComponentNode], settings_: Settings) -> Slots:
    slots = dict(slots)
    for node in nodes:
        if all(w in slots for w in node.writes):  # resolved ahead (e.g. from the feature cache)
            continue
        slots.update(node(card, slots, settings_))
    return slots


def enter(
    program: Program, index: int, settings_: Settings, card: Card, slots: Slots, state=None, *, schedule=None
) -> tuple[Slots, Any]:
    """Move a batch of requests to loop ``index`` of ``program``: ``(slots, loop state or None)``.

    For ``index > 0`` first binds ``result(state)`` of loop ``index - 1`` to its slot; then runs
    the component nodes before loop ``index`` (skipping nodes whose writes are already present)
    and starts loop ``index``; ``schedule`` (per-row schedules, e.g. padded sigmas ``(B, W+1)``)
    replaces the one ``settings_`` implies, so requests with different step counts can start
    together (the driver's ``with_schedule``). For ``index == len(program.loops)`` it runs the
    trailing nodes and returns ``(slots, None)``. Pure; jit it with ``program``, ``index`` and
    ``settings_`` static.

    Args:
      program: the program.
      index: the loop to enter, in ``[0, len(program.loops)]``.
      settings_: static per-loop settings.
      card: the card.
      slots: the batch's slots so far.
      state: the final state of loop ``index - 1`` (unused for ``index == 0``).
      schedule: per-row schedules replacing the settings' one, or ``None``.

    Returns:
      ``(slots, state)``: the slots with this segment's writes, and loop ``index``'s first state (``None``
      past the last loop).
    """
    loops = program.loops
    slots = dict(slots)
    if index > 0:
        done = loops[index - 1]
        slots[done.writes[0]] = done.result(state)
    slots = _apply(card, slots, program.segment(index), settings_)
    if index == len(loops):
        return slots, None
    node = loops[index]
    spec = card.spec.loop(node.loop)
    state = node.start(card, spec, {r: slots[r] for r in node.reads}, config_of(settings_, node.loop))
    if schedule is not None:
        state = driver(spec.kind).with_schedule(state, schedule)
    return slots, state


def artifacts(program: Program, slots: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The program's output artifacts from its final slots.

    Args:
      program: the program.
      slots: its final slots.

    Returns:
      ``{artifact name: (B, ...)}``.
    """
    return {name: slots[slot] for name, slot in program.outputs}


def split_rows(batched: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """Batched artifacts -> one dict per row, for the first ``count`` rows (inside jit: no extra dispatch).

    Args:
      batched: ``{name: (B, ...)}``; an artifact may be a pytree of arrays (e.g. scores per head).
      count: how many rows to take (at most B).

    Returns:
      ``[{name: (...)}, ...]``, ``count`` dicts.
    """
    return [{k: jax.tree.map(lambda a, i=i: a[i], v) for k, v in batched.items()} for i in range(count)]


class Execution(NamedTuple):
    """A fused run with capture.

    Attributes:
      artifacts: ``{name: (B, ...)}``.
      slots: every final slot.
      captures: ``{loop id: (final loop state, records)}``, records stacked on a leading step axis (a
        denoise loop's captured ``Transition``s, an AR loop's ``TokenRecord``s; ``None`` for a loop
        that did not record).
    """

    artifacts: dict[str, Any]
    slots: dict[str, Any]
    captures: dict[str, tuple[Any, Any]]


def execute(
    program: Program,
    settings_: Settings,
    card: Card,
    slots: Mapping[str, Any],
    *,
    capture: bool | tuple[str, ...] = False,
) -> dict[str, jax.Array] | Execution:
    """The whole program on batched input ``slots``: artifacts ``{name: (B, ...)}``, or, unless
    ``capture`` is ``False``, an ``Execution`` (``capture=True``: every loop records its trajectory;
    a tuple of loop ids: those loops do, the others run as when serving).

    Loops run as their fused runner (``lax.scan``). Pure; jit with ``program``, ``settings_`` and
    ``capture`` static. RL rollouts are this call with capture: the same nodes, keys and loops the
    card serves with.

    Args:
      program: the program.
      settings_: static per-loop settings.
      card: the card.
      slots: the batched input slots.
      capture: ``False``, ``True`` (every loop records), or the ids of the loops that record.

    Returns:
      ``{name: (B, ...)}`` artifacts when ``capture`` is ``False``, else an ``Execution``.
    """
    slots, state = enter(program, 0, settings_, card, slots)
    captures = {}
    for i, node in enumerate(program.loops):
        spec = card.spec.loop(node.loop)
        record = capture is True or (bool(capture) and node.loop in capture)
        state, records = driver(spec.kind).run(
            card.bound(node.loop), state, config_of(settings_, node.loop), capture=record
        )
        captures[node.loop] = (state, records)
        slots, state = enter(program, i + 1, settings_, card, slots, state)
    out = artifacts(program, slots)
    return out if capture is False else Execution(out, slots, captures)


_execute_jit = jax.jit(execute, static_argnums=(0, 1))
