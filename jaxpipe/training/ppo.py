"""Several PPO updates per rollout: shuffled minibatches × inner epochs as nested ``lax.scan``s.

As FlowGRPO's trainer (train batch < sample batch, inner epochs, ``timestep_fraction``) and
purejaxrl: one rollout of ``B`` rows feeds ``inner_epochs × minibatches`` optimiser steps inside the
one jitted step. Every epoch draws a permutation of the rows from the step key and cuts it into
``minibatches`` equal minibatches (each row trained exactly once per epoch); each minibatch may also
train on a random ``timestep_fraction`` of the captured denoising steps, drawn per row. The rollout's
captured log-probs stay the "old" policy of every update, so the first update sees ratio == 1 (C2)
and the later ones see how far the policy has moved, which is where the PPO clip binds.

A method gives ``run`` one update, ``update(carry, rows, key) -> (carry, metrics, finite)``: ``rows``
``(b,)`` are the minibatch's row indices (``None``: every row, in order) and ``key`` its own key.
With one minibatch, one epoch and every step (``Schedule().single``) ``run`` calls it once, with no
scan and no gather: bit for bit the single update of before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe import validate
from jaxpipe.loops import denoise
from jaxpipe.training import rollout

__all__ = [
    "Schedule",
    "minibatch",
    "minibatch_rows",
    "run",
    "summarize",
    "subsample",
    "subsample_steps",
    "PER_UPDATE",
    "Update",
]

PER_UPDATE = ("clip_frac", "ratio_mean", "approx_kl")
"""Metrics also reported per update (``<name>_u<i>``) when a rollout feeds several."""


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How many updates a rollout feeds: ``minibatches`` per epoch × ``inner_epochs``, each on a random
    ``timestep_fraction`` of the captured denoising steps.

    Attributes:
      minibatches: equal minibatches per epoch, a positive int that divides the rollout's rows.
      inner_epochs: passes over the rollout, a positive int.
      timestep_fraction: the fraction of each row's captured steps a minibatch trains on, in (0, 1].

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    minibatches: int = 1
    inner_epochs: int = 1
    timestep_fraction: float = 1.0

    def __post_init__(self):
        for name in ("minibatches", "inner_epochs"):
            value = getattr(self, name)
            validate.rule(
                not (isinstance(value, bool) or not isinstance(value, int) or value < 1),
                f"{name} must be a positive int (got {value!r})",
            )
        validate.rule(
            isinstance(self.timestep_fraction, (int, float)) and 0.0 < self.timestep_fraction <= 1.0,
            f"timestep_fraction must be in (0, 1] (got {self.timestep_fraction!r})",
        )

    @property
    def updates(self) -> int:
        """The optimiser steps a rollout feeds: ``minibatches × inner_epochs``."""
        return self.minibatches * self.inner_epochs

    @property
    def single(self) -> bool:
        """One update on every row and every step: the rollout is used once, as a plain update."""
        return self.updates == 1 and self.timestep_fraction == 1.0

    def check_rows(self, rows: int) -> None:
        """A clear error unless ``minibatches`` divides the rollout's ``rows``.

        Args:
          rows: the rollout's rows (prompts per step × group size).

        Raises:
          ValueError: if ``minibatches`` does not divide ``rows``.
        """
        if rows % self.minibatches:
            raise ValueError(
                f"minibatches={self.minibatches} must divide the rollout's {rows} rows (prompts per step × group size)"
            )

    def steps_kept(self, captured: int) -> int:
        """How many of ``captured`` denoising steps a minibatch trains on: ``max(1, floor(captured · fraction))``.

        Args:
          captured: the rollout's captured steps ``S``.
        """
        return max(1, math.floor(captured * self.timestep_fraction + 1e-9))


def minibatch_rows(key: jax.Array, rows: int, schedule: Schedule) -> jax.Array:
    """Every update's row indices: per epoch a permutation of the rows, cut into equal minibatches.

    Epoch ``e``'s permutation is drawn from ``fold_in(key, e)``; with one minibatch the rows keep their
    order (and ``key`` is not read).

    Args:
      key: a PRNG key.
      rows: the rollout's rows ``B``.
      schedule: the update schedule.

    Returns:
      ``(inner_epochs, minibatches, rows // minibatches)`` int32 row indices.

    Raises:
      ValueError: if ``schedule.minibatches`` does not divide ``rows``.
    """
    schedule.check_rows(rows)
    size = rows // schedule.minibatches
    if schedule.minibatches == 1:
        order = jnp.broadcast_to(jnp.arange(rows), (schedule.inner_epochs, rows))
    else:
        order = jax.vmap(lambda e: jax.random.permutation(jax.random.fold_in(key, e), rows))(
            jnp.arange(schedule.inner_epochs)
        )
    return order.reshape(schedule.inner_epochs, schedule.minibatches, size).astype(jnp.int32)


Update = Callable[[Any, jax.Array | None, jax.Array | None], tuple[Any, dict, jax.Array]]
"""One update of a method, ``update(carry, rows, key) -> (carry, metrics, finite)`` (module docstring)."""


def run(
    update: Update, carry: Any, key: jax.Array | None, rows: int, schedule: Schedule
) -> tuple[Any, dict, jax.Array]:
    """All of a rollout's updates, as nested ``lax.scan`` loops over epochs and minibatches.

    The minibatch order is ``minibatch_rows(fold_in(key, 0), ...)`` and the updates' own keys are split
    from ``fold_in(key, 1)``. A single update (``schedule.single``) runs as a plain call
    ``update(carry, None, None)``, its metrics untouched: the same program as before several updates
    existed.

    Args:
      update: the method's update.
      carry: what the updates thread (e.g. ``(params, opt_state)``).
      key: the updates' PRNG key (may be ``None`` for a single update).
      rows: the rollout's rows ``B``.
      schedule: the update schedule.

    Returns:
      ``(carry, metrics, finite)``: the final carry, the metrics reduced over the updates by ``summarize``, and
      whether every update was finite.

    Raises:
      ValueError: if several updates (or a timestep fraction) have no ``key``, or ``minibatches`` does not
        divide ``rows``.
    """
    if schedule.single:
        return update(carry, None, None)
    if key is None:
        raise ValueError("several updates per rollout (or a timestep fraction) need a key for the minibatch order")
    order = minibatch_rows(jax.random.fold_in(key, 0), rows, schedule)
    keys = jax.random.split(jax.random.fold_in(key, 1), schedule.updates).reshape(
        schedule.inner_epochs, schedule.minibatches
    )

    def minibatch(carry, xs):
        idx, k = xs
        carry, metrics, finite = update(carry, idx, k)
        return carry, (metrics, finite)

    def epoch(carry, xs):
        return jax.lax.scan(minibatch, carry, xs)

    carry, (metrics, finite) = jax.lax.scan(epoch, carry, (order, keys))
    flat = lambda v: v.reshape((schedule.updates,) + v.shape[2:])
    return carry, summarize(jax.tree.map(flat, metrics)), jnp.all(finite)


def summarize(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Reduce per-update metrics to the mean of each, plus ``<name>_u<i>`` for the ``PER_UPDATE`` ones.

    Args:
      metrics: ``{name: (updates,)}``.

    Returns:
      ``{name: mean}``, and, when there were several updates, ``<name>_u<i>`` (update ``i``'s value) for
      every name ending in one of ``PER_UPDATE``.
    """
    out = {name: jnp.mean(values) for name, values in metrics.items()}
    for name, values in metrics.items():
        if values.shape[0] > 1 and name.endswith(PER_UPDATE):
            out.update({f"{name}_u{i}": values[i] for i in range(values.shape[0])})
    return out


def subsample_steps(trajectory: denoise.Transition, key: jax.Array, kept: int) -> denoise.Transition:
    """``kept`` of a trajectory's ``S`` captured steps per row, drawn without replacement independently per row.

    FlowGRPO's ``timestep_fraction``: row ``b`` keeps the first ``kept`` steps of a permutation drawn
    from ``split(key, B)[b]``.

    Args:
      trajectory: the captured steps, ``Transition`` fields ``(S, B, ...)``.
      key: a PRNG key.
      kept: how many steps each row keeps, ``1 <= kept <= S``.

    Returns:
      The trajectory with fields ``(kept, B, ...)``.
    """
    captured, rows = trajectory.log_prob.shape
    order = jax.vmap(lambda k: jax.random.permutation(k, captured))(jax.random.split(key, rows))  # (B, S)
    picked = order[:, :kept].T  # (kept, B)

    def take(field: jax.Array) -> jax.Array:
        index = picked.reshape(picked.shape + (1,) * (field.ndim - 2))
        return jnp.take_along_axis(field, index, axis=0)

    return jax.tree.map(take, trajectory)


def subsample(generated, key: jax.Array | None, schedule: Schedule):
    """A rendered batch on a random ``timestep_fraction`` of each row's captured steps, or as it is at fraction 1.

    Args:
      generated: the rendered batch (``rollout.Generated``).
      key: the key of ``subsample_steps`` (unused at fraction 1).
      schedule: the update schedule (its ``timestep_fraction``).

    Returns:
      The ``rollout.Generated`` with ``schedule.steps_kept(S)`` steps per row.
    """
    if schedule.timestep_fraction < 1.0:
        kept = schedule.steps_kept(generated.trajectory.log_prob.shape[0])
        generated = generated._replace(trajectory=subsample_steps(generated.trajectory, key, kept))
    return generated


def minibatch(generated, advantages: jax.Array, rows: jax.Array | None, key: jax.Array | None, schedule: Schedule):
    """One minibatch of a rollout: the rendered batch's ``rows`` on ``subsample``'s captured steps.

    Args:
      generated: the rendered batch (``rollout.Generated``).
      advantages: ``(B,)`` advantages.
      rows: ``(b,)`` row indices (``None``: all, in order).
      key: the key of ``subsample``.
      schedule: the update schedule.

    Returns:
      ``(generated, advantages)`` of the minibatch.
    """
    if rows is not None:
        generated, advantages = rollout.take_rows(generated, rows), advantages[rows]
    return subsample(generated, key, schedule), advantages
