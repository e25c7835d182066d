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
        return config

    def batch_config(self, config, width: int):
        del width  # every member has the same config (batch_key), hence the same step count
        return config

    def schedule(self, config, width: int) -> np.ndarray:
        del config, width
        return _NO_SCHEDULE

    def with_schedule(self, state, schedule: jax.Array):
        del schedule
        return state
