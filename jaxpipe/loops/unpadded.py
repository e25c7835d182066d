"""Batching for loop kinds without per-request schedules (``ar_decode``, ``chunk_rollout``).

Their requests batch only with requests of the same config, hence the same step count, so a batch
needs no padded schedule: the driver methods the engine calls for padding are identities. A loop
kind's ``Driver`` inherits them from ``SameConfigBatching``.
"""

from __future__ import annotations

from collections.abc import Hashable

import jax
import numpy as np

__all__ = ["SameConfigBatching"]

_NO_SCHEDULE = np.zeros((0,), np.float32)
_NO_SCHEDULE.flags.writeable = False


class SameConfigBatching:
    """``batch_key`` / ``batch_config`` / ``schedule`` / ``with_schedule`` of a loop kind whose batch members share one config."""

    def batch_key(self, config) -> Hashable:
        """The whole config: only requests with equal configs share a batch.

        Args:
          config: a request's config (hashable).
        """
        return config

    def batch_config(self, config, width: int):
        """``config`` itself (every member has it, hence the same step count).

        Args:
          config: a member's config.
          width: the batch's step count (unused).
        """
        del width  # every member has the same config (batch_key), hence the same step count
        return config

    def schedule(self, config, width: int) -> np.ndarray:
        """An empty, read-only ``(0,)`` float32 row: these kinds have no per-row schedule.

        Args:
          config: the request's config (unused).
          width: the batch's step count (unused).
        """
        del config, width
        return _NO_SCHEDULE

    def with_schedule(self, state, schedule: jax.Array):
        """``state`` unchanged.

        Args:
          state: the batch's state.
          schedule: the stacked (empty) schedule rows (unused).
        """
        del schedule
        return state
