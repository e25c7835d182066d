"""Evaluation weights: an exponential moving average of the trained parameters, kept beside them.

The official FlowGRPO and DiffusionNFT recipes evaluate (and release) an EMA of the trained weights, not
the last iterate: the RL iterate is noisy step to step. After update ``n`` (0-based) the average follows
the parameters ``θ`` by

    ema ← ema + (1 − d(n))·(θ − ema),    d(n) = min((1 + n) / (10 + n), decay)

(the official ``EMAModuleWrapper``'s warm-up: early averages do not lean on the starting weights), every
``every`` updates. A trainer with ``eval_ema`` set keeps it as the copy (and role) ``"ema"``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["EvalEMA", "ROLE", "follow"]

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
        if not (isinstance(self.decay, (int, float)) and math.isfinite(self.decay) and 0.0 <= self.decay < 1.0):
            raise ValueError(f"the evaluation EMA's decay must be in [0, 1) (got {self.decay!r})")
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(f"the evaluation EMA's every must be a positive int (got {self.every!r})")

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
