"""The engine's jitted batch operations: enter a program's loop, step it, and move rows in and out
of a batched loop state (continuous batching).

A resident card travels as ``(treedef, leaves)``: flattening a ``Card`` of NNX modules walks the
module graph in Python (~0.4 ms); a flat list of arrays is the C++ fast path. Every function is
keyed on static program / loop / config arguments, so the serial, interleaved and batched modes
share compiled code wherever their shapes agree (serial and interleaved always do: C1). A step compiles
with its driver's ``step_config``: per-request scalars a loop reads from its state (a denoise
loop's guidance scale) are not part of the compile key, so requests that differ only in them share one
compiled step.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import program as programs
from jaxpipe.card import Card
from jaxpipe.loops import registry as loop_kinds

__all__ = [
    "enter",
    "node",
    "step",
    "steps",
    "step_config",
    "stepped",
    "stepped_many",
    "empty",
    "admit",
    "retire",
    "resize",
    "bucket",
    "pow2",
    "padded",
]


def _card(treedef, leaves) -> Card:
    return jax.tree.unflatten(treedef, leaves)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def enter(program: programs.Program, index: int, settings, treedef, leaves, slots, state, schedule):
    """``program.enter`` (rows are concatenated at index 0); at the end: per-row artifacts."""
    if index == 0:
        slots = programs.concat_rows(slots)
    slots, state = programs.enter(program, index, settings, _card(treedef, leaves), slots, state, schedule=schedule)
    if state is None:
        out = programs.artifacts(program, slots)
        return programs.split_rows(out, jax.tree.leaves(out)[0].shape[0]), None
    return slots, state


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def node(program: programs.Program, name: str, settings, treedef, leaves, reads):
    """One component node of ``program`` on ``reads`` (the engine's feature-cache misses)."""
    found = next(n for n in program.nodes if n.name == name)
    return found(_card(treedef, leaves), reads, settings)


def step_config(kind: str, config):
    """The config a step of loop kind ``kind`` compiles with: its driver's ``step_config`` (a denoise
    loop's guidance value neutralised, read per row from the state), else ``config`` itself.

    Args:
      kind: the loop kind.
      config: the loop's config.

    Returns:
      A hashable config.
    """
    neutral = getattr(loop_kinds.driver(kind), "step_config", None)  # optional for drivers registered outside
    return config if neutral is None else neutral(config)


def step(kind: str, loop_id: str, config, treedef, leaves, state):
    """One pure step of the loop (all rows), compiled once per ``step_config``.

    Args:
      kind: the loop kind.
      loop_id: the card's loop id.
      config: the loop's config (compiled as its ``step_config``).
      treedef: the resident card's tree structure.
      leaves: the resident card's arrays.
      state: the batched loop state.

    Returns:
      The next loop state.
    """
    return stepped(kind, loop_id, step_config(kind, config), treedef, leaves, state)


def steps(kind: str, loop_id: str, config, treedef, leaves, state, count):
    """``count`` (traced) pure steps of the loop on the whole batch: one dispatch between scheduling events,
    compiled once per ``step_config`` (requests with different guidance share it).

    Args:
      kind: the loop kind.
      loop_id: the card's loop id.
      config: the loop's config (compiled as its ``step_config``).
      treedef: the resident card's tree structure.
      leaves: the resident card's arrays.
      state: the batched loop state.
      count: how many steps (traced).

    Returns:
      The next loop state.
    """
    return stepped_many(kind, loop_id, step_config(kind, config), treedef, leaves, state, count)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def stepped(kind: str, loop_id: str, config, treedef, leaves, state):
    """The jitted ``step`` (``config`` as compiled: a ``step_config``)."""
    card = _card(treedef, leaves)
    return loop_kinds.driver(kind).step(card.bound(loop_id), state, config)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def stepped_many(kind: str, loop_id: str, config, treedef, leaves, state, count):
    """The jitted ``steps`` (``config`` as compiled: a ``step_config``)."""
    card = _card(treedef, leaves)
    models, drive = card.bound(loop_id), loop_kinds.driver(kind)
    return jax.lax.fori_loop(0, count, lambda _, s: drive.step(models, s, config), state)


@functools.partial(jax.jit, static_argnums=(0, 1))
def empty(kind: str, capacity: int, like):
    """``capacity`` inert rows shaped like one row of ``like``."""
    return loop_kinds.driver(kind).empty(like, capacity)


@jax.jit
def admit(batch, source, slots, rows):
    """Copy ``source`` rows ``rows`` into ``batch`` slots ``slots`` (out-of-range slots are skipped)."""
    rows = jnp.clip(rows, 0, jax.tree.leaves(source)[0].shape[0] - 1)
    return jax.tree.map(lambda b, s: b.at[slots].set(s[rows], mode="drop"), batch, source)


@functools.partial(jax.jit, static_argnums=(0,))
def retire(kind: str, batch, target, slots, rows):
    """Copy ``batch`` slots ``slots`` back into ``target`` rows ``rows`` and make those slots inert."""
    capacity = jax.tree.leaves(batch)[0].shape[0]
    taken = jnp.clip(slots, 0, capacity - 1)
    target = jax.tree.map(lambda t, b: t.at[rows].set(b[taken], mode="drop"), target, batch)
    mask = jnp.zeros((capacity,), bool).at[slots].set(True, mode="drop")
    return loop_kinds.driver(kind).deactivate(batch, mask), target


@functools.partial(jax.jit, static_argnums=(0, 1))
def resize(kind: str, capacity: int, batch, keep):
    """A batch of ``capacity`` slots holding old slots ``keep`` (``-1``: an inert slot)."""
    fresh = loop_kinds.driver(kind).empty(batch, capacity)
    taken = jax.tree.map(lambda b: b[jnp.clip(keep, 0)], batch)
    pick = lambda e, t: jnp.where((keep >= 0).reshape((-1,) + (1,) * (t.ndim - 1)), t, e)
    return jax.tree.map(pick, fresh, taken)


def pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``).

    Args:
      n: a count.

    Returns:
      ``2**k``, an int.
    """
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def bucket(n: int) -> int:
    """The smallest batch size >= ``n`` of the form 2^k or 3·2^k (1, 2, 3, 4, 6, 8, 12, 16, 24, ...):
    few distinct shapes to compile, at most a third of a batch wasted on inert rows.

    Args:
      n: the number of rows to hold.

    Returns:
      The batch size, an int.
    """
    p = pow2(n)
    return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


def padded(slots: list[int], rows: list[int], capacity: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays of fixed length ``capacity`` (one compile per shape) for ``admit`` / ``retire``.

    Padding entries point out of range (``capacity`` for slots, ``size`` for rows) and are dropped by
    the scatters.

    Args:
      slots: the batch slots to write, at most ``capacity``.
      rows: the matching source / target rows.
      capacity: the batch's slot count.
      size: the source / target's row count.

    Returns:
      ``(slots, rows)``, two ``(capacity,)`` int32 arrays.
    """
    s = np.full((capacity,), capacity, np.int32)
    r = np.full((capacity,), size, np.int32)
    s[: len(slots)] = slots
    r[: len(rows)] = rows
    return s, r
