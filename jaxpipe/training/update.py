"""One guarded optimiser step: the gradient of a loss, the optax update, and the non-finite guard.

The guard's one rule, for every trainer in jaxpipe: **an optimiser step whose loss or gradient is
not finite is skipped** — the parameters and the optimiser state it would have changed stay as
they were (so do the copies that follow them, e.g. an EMA), while every other trained part's step,
and the trainer's step counter, go on. Why per step and per part: a NaN in one part's update says
nothing about another's (a critic's bad batch must not freeze the student it judges; one refiner's
must not freeze the other N − 1), and a skipped step must leave no trace in the Adam moments, or the
next step would divide by a poisoned second moment. Trainers report ``skipped`` (1 when any step of
theirs was skipped) and ``jaxpipe.training.fit`` announces it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["Step", "finite", "guard", "apply_gradients", "step", "steps", "skipped"]


class Step(NamedTuple):
    """The outcome of one guarded optimiser step.

    Attributes:
      params: the updated parameters, or the old ones where the step was skipped.
      opt_state: the optimiser state, likewise.
      loss: the loss.
      aux: the loss function's auxiliary output.
      grad_norm: the gradient's global norm.
      finite: bool scalar: the loss and the gradient norm were finite.
    """

    params: Any
    opt_state: Any
    loss: jax.Array
    aux: Any
    grad_norm: jax.Array
    finite: jax.Array


def finite(loss: jax.Array, grad_norm: jax.Array) -> jax.Array:
    """Whether a step may apply: its loss and its gradient's global norm are both finite.

    Args:
      loss: the step's loss.
      grad_norm: its gradient's global norm.

    Returns:
      A bool array (scalar for scalar inputs).
    """
    return jnp.isfinite(loss) & jnp.isfinite(grad_norm)


def guard(ok: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``ok`` else ``old``, leaf by leaf.

    Args:
      ok: a bool scalar.
      new: a pytree.
      old: a pytree of the same structure.

    Returns:
      The selected pytree.
    """
    return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)


def skipped(ok: jax.Array) -> jax.Array:
    """The ``skipped`` metric of a step that applied where ``ok``: 1.0 if it did not, else 0.0.

    Args:
      ok: bool: whether the step applied.

    Returns:
      float32, shaped like ``ok``.
    """
    return 1.0 - ok.astype(jnp.float32)


def apply_gradients(
    tx: optax.GradientTransformation,
    params: Any,
    opt_state: Any,
    grads: Any,
    loss: jax.Array,
    aux: Any = None,
    *,
    when: jax.Array | bool = True,
) -> Step:
    """The optimiser step of ``grads``, applied where the loss and the gradient are finite and ``when`` holds.

    Elsewhere the params and the optimiser moments are kept as they were.

    Args:
      tx: the optimiser.
      params: the parameters.
      opt_state: ``tx``'s state.
      grads: the gradient of ``loss`` in ``params``.
      loss: the loss.
      aux: carried into the ``Step`` as it is.
      when: an extra condition for applying (e.g. past a warm-up).

    Returns:
      The ``Step``; its ``finite`` says whether loss and gradient were finite, whatever ``when``.
    """
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    grad_norm = optax.tree.norm(grads)
    ok = finite(loss, grad_norm)
    apply = ok if when is True else ok & when
    new_params, new_opt = guard(apply, (new_params, new_opt), (params, opt_state))
    return Step(new_params, new_opt, loss, aux, grad_norm, ok)


def step(
    loss_fn: Callable[..., tuple[jax.Array, Any]],
    tx: optax.GradientTransformation,
    params: Any,
    opt_state: Any,
    *args: Any,
    when: jax.Array | bool = True,
) -> Step:
    """One guarded optimiser step of ``loss_fn(params, *args) -> (loss, aux)``.

    Skipped (params and moments kept) where the loss or gradient is not finite, or where ``when`` is
    false (e.g. a warm-up).

    Args:
      loss_fn: the loss, differentiable in its first argument.
      tx: the optimiser.
      params: the parameters.
      opt_state: ``tx``'s state.
      *args: the loss's other arguments.
      when: an extra condition for applying.

    Returns:
      The ``Step``.
    """
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *args)
    return apply_gradients(tx, params, opt_state, grads, loss, aux, when=when)


def steps(
    loss_fn: Callable[[Any, jax.Array], jax.Array],
    tx: optax.GradientTransformation,
    params: Any,
    opt_state: Any,
    keys: jax.Array,
) -> tuple[Any, Any, jax.Array, jax.Array, jax.Array]:
    """One guarded step of ``loss_fn(params, key) -> scalar`` per key of ``keys``, as a ``lax.scan``.

    A critic's several updates per student update.

    Args:
      loss_fn: the loss, differentiable in its first argument.
      tx: the optimiser.
      params: the parameters.
      opt_state: ``tx``'s state.
      keys: ``(K,)`` PRNG keys, one per step.

    Returns:
      ``(params, opt_state, losses (K,), grad norms (K,), skipped (K,) float32)``.
    """

    def one(carry, key):
        out = step(lambda p, k: (loss_fn(p, k), None), tx, *carry, key)
        return (out.params, out.opt_state), (out.loss, out.grad_norm, skipped(out.finite))

    (params, opt_state), (losses, norms, skips) = jax.lax.scan(one, (params, opt_state), keys)
    return params, opt_state, losses, norms, skips
