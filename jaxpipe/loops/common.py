"""What the loops share: per-request keys, per-row sigma lookups, per-row noise and inert rows.

Every loop state carries one row per request (leading axis ``B``), each with its own typed PRNG
key and counters, so a request's bits do not depend on its batch. These helpers are the pieces
the denoise and chunk loops (and their drivers) would otherwise each write again.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["check_keys", "row_scales", "row_sigmas", "fold_in_normal", "inert_rows", "rows_like"]


def check_keys(keys: jax.Array) -> jax.Array:
    """``keys`` as an array, checked to be ``(B,)`` typed PRNG keys (``jax.random.key``), one per request.

    Args:
      keys: the requests' keys.

    Returns:
      ``jnp.asarray(keys)``.

    Raises:
      ValueError: if they are not a ``(B,)`` array of typed keys.
    """
    keys = jnp.asarray(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.ndim != 1:
        raise ValueError(f"keys must be a (B,) array of typed PRNG keys (jax.random.key), got {keys.dtype}{keys.shape}")
    return keys


def row_scales(scale, b: int) -> jax.Array:
    """A per-request scalar (e.g. the CFG scale) as ``(B,)`` float32: a scalar is broadcast, ``(B,)`` kept.

    Args:
      scale: a number or a ``(B,)`` array.
      b: the batch size ``B``.

    Returns:
      ``(B,)`` float32.

    Raises:
      ValueError: if ``scale`` is neither a scalar nor ``(B,)``.
    """
    scale = jnp.asarray(scale, jnp.float32)
    if scale.ndim == 0:
        return jnp.full((b,), scale, jnp.float32)
    if scale.shape != (b,):
        raise ValueError(f"a per-request scale must be a scalar or ({b},) (got shape {scale.shape})")
    return scale


def row_sigmas(sigmas: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each row's current and next noise level.

    Args:
      sigmas: ``(B, N+1)`` per-row schedules.
      step: ``(B,)`` int32 steps taken (``N``: finished; read as step ``N - 1``).

    Returns:
      ``(idx, sigma, sigma_next)``: ``idx = min(step, N - 1)`` and the ``(B,)`` levels at ``idx`` and ``idx + 1``.
    """
    num_steps = sigmas.shape[1] - 1
    idx = jnp.minimum(step, num_steps - 1)
    sigma = jnp.take_along_axis(sigmas, idx[:, None], axis=1)[:, 0]
    sigma_next = jnp.take_along_axis(sigmas, idx[:, None] + 1, axis=1)[:, 0]
    return idx, sigma, sigma_next


def fold_in_normal(keys: jax.Array, index: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Row ``i``'s standard normal noise ``normal(fold_in(keys[i], index[i]), shape)``, stacked.

    Args:
      keys: ``(B,)`` typed PRNG keys.
      index: ``(B,)`` ints (a step or chunk index).
      shape: the per-row shape.

    Returns:
      ``(B, *shape)`` float32.
    """
    return jax.vmap(lambda k, i: jax.random.normal(jax.random.fold_in(k, i), shape, jnp.float32))(keys, index)


def inert_rows(state: Any, capacity: int) -> Any:
    """``capacity`` zero rows shaped like one row of ``state`` (a NamedTuple with a ``key`` field), with
    fresh keys that nothing reads; the caller marks them finished.

    Args:
      state: a loop state (leading axis ``B`` on every leaf).
      capacity: the rows to make.

    Returns:
      The same kind of state with ``capacity`` rows.
    """
    rows = jax.tree.map(lambda a: jnp.zeros((capacity,) + a.shape[1:], a.dtype), state._replace(key=None))
    return rows._replace(key=jax.random.split(jax.random.key(0), capacity))


def rows_like(mask: jax.Array, a: jax.Array) -> jax.Array:
    """A ``(B,)`` mask reshaped ``(B, 1, ..., 1)`` to broadcast against ``a`` ``(B, ...)``.

    Args:
      mask: ``(B,)`` values.
      a: an array with leading axis ``B``.

    Returns:
      ``mask`` with ``a.ndim - 1`` trailing unit axes.
    """
    return mask.reshape(mask.shape + (1,) * (a.ndim - 1))
