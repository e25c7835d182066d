"""The two moving averages of trained weights: ``EMA``, the old policy's decay schedule (DiffusionNFT), and
``EvalEMA``, the evaluation average kept beside the trained weights.

``EMA``: DiffusionNFT's old policy ``θ_old`` follows the trained ``θ`` with a decay that ramps linearly
from ``start`` to ``end`` over ``ramp_steps`` updates (``methods.nft.ema_decay``).

``EvalEMA``: the official FlowGRPO and DiffusionNFT recipes evaluate (and release) an EMA of the trained
weights, not the last iterate: the RL iterate is noisy step to step. After update ``n`` (0-based) the
average follows the parameters ``θ`` by

    ema ← ema + (1 − d(n))·(θ − ema),    d(n) = min((1 + n) / (10 + n), decay)

(the official ``EMAModuleWrapper``'s warm-up: early averages do not lean on the starting weights), every
``every`` updates. A trainer with ``eval_ema`` set keeps it as the copy (and role) ``"ema"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe import validate

__all__ = ["EMA", "EvalEMA", "ROLE", "follow"]


@dataclasses.dataclass(frozen=True)
class EMA:
    """The old policy's EMA decay: ``start`` at the first update, ramping linearly to ``end`` over ``ramp_steps``.

    Attributes:
      start: the decay at the first update, in [0, 1].
      end: the decay after the ramp, in [0, 1].
      ramp_steps: updates the ramp takes, >= 0 (0: ``end`` from the start).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    start: float = 0.0
    end: float = 0.5
    ramp_steps: int = 100

    def __post_init__(self):
        validate.fractions(self, "start", "end", prefix="the EMA's ")
        validate.counts(self, "ramp_steps", minimum=0, prefix="the EMA's ")


ROLE = "ema"
"""The copy and the role the average is kept and served as."""


@dataclasses.dataclass(frozen=True)
class EvalEMA:
    """The evaluation average's settings (hashable: static under ``jit``).

    Attributes:
      decay: the decay after the warm-up, in [0, 1) (the official recipes: 0.9).
      every: fold the parameters in every ``every`` updates, a positive int (the official FlowGRPO: 8
        optimiser steps; DiffusionNFT: 1).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    decay: float = 0.9
    every: int = 1

    def __post_init__(self):
        validate.within(self, "decay", low=0.0, high=1.0, open_high=True, prefix="the evaluation EMA's ")
        validate.counts(self, "every", prefix="the evaluation EMA's ")

    def decay_at(self, n: jax.Array) -> jax.Array:
        """``d(n) = min((1 + n) / (10 + n), decay)``, float32, for the 0-based update count ``n``."""
        n = jnp.asarray(n, jnp.float32)
        return jnp.minimum((1.0 + n) / (10.0 + n), jnp.float32(self.decay))


def follow(config: EvalEMA, ema: Any, params: Any, n: jax.Array) -> Any:
    """The average after update ``n``: moved toward ``params`` on every ``config.every``-th update, else as it was.

    Args:
      config: the settings.
      ema: the average, a pytree like ``params``.
      params: the parameters after the update.
      n: the 0-based update count (int32 scalar).

    Returns:
      The new average (same structure and dtypes as ``ema``).
    """
    d = config.decay_at(n)
    due = (n + 1) % config.every == 0
    return jax.tree.map(lambda e, p: jnp.where(due, e + (1.0 - d).astype(e.dtype) * (p - e), e), ema, params)
