"""What a server's front admits: the ``Budget``, a ``FrontLoad`` snapshot, and a request's memory estimate.

Memory estimate (``estimate_bytes``): a card request holds, per loop with a latent shape, the
latents in float32 plus the copies a step makes of them (the classifier-free-guidance pair of
model inputs, the model's prediction, the updated state): ``STATE_COPIES * 4 * prod(latent_shape)``
bytes summed over the card's loops, at least ``MIN_REQUEST_BYTES`` (text loops: a token buffer and
its attention cache). A workflow request runs its stages one at a time: the largest stage's
estimate. Weights are resident once per card and not counted per request.
"""

from __future__ import annotations

import dataclasses
import math

from jaxpipe import validate
from jaxpipe.engine import Engine

__all__ = ["Budget", "FrontLoad", "MIN_REQUEST_BYTES", "STATE_COPIES", "estimate_bytes"]

STATE_COPIES = 4
"""Copies of a loop's latents a request holds while stepping: the state, the CFG pair of model inputs, the prediction."""
MIN_REQUEST_BYTES = 64 * 1024
"""The floor of a request's estimate: loops without latents (text) still hold a token buffer and an attention cache."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a ``Front`` admits.

    Attributes:
      max_rows: rows (one per request; ``n`` for an ``n``-image call) stepping at once; a call of more rows is
        refused at once.
      max_queued: rows admitted beyond ``max_rows``, waiting to start; past it, requests are refused as busy (429).
      max_memory_bytes: the sum of the admitted requests' memory estimates (``estimate_bytes``); ``None``: no limit.
      max_wait_ms: how long work arriving at an idle engine waits for more to fill its first batch.

    Raises:
      ValueError: on a non-positive ``max_rows``, a negative ``max_queued`` or ``max_wait_ms``, or a
        non-positive ``max_memory_bytes``.
    """

    max_rows: int = 64
    max_queued: int = 256
    max_memory_bytes: int | None = None
    max_wait_ms: float = 5.0

    def __post_init__(self):
        validate.counts(self, "max_rows", prefix="Budget.")
        validate.counts(self, "max_queued", minimum=0, prefix="Budget.")
        validate.positive(self, "max_memory_bytes", optional=True, prefix="Budget.")
        validate.non_negative(self, "max_wait_ms", prefix="Budget.")


@dataclasses.dataclass(frozen=True)
class FrontLoad:
    """A snapshot of a front's work.

    Attributes:
      queued: admitted requests not started yet.
      running: admitted requests started and not finished.
      rows: batch rows that stepped in the last tick.
      in_flight_rows: rows admitted and not finished (what ``max_rows + max_queued`` bounds).
      memory_bytes: the memory estimates of the admitted, unfinished requests.
    """

    queued: int = 0
    running: int = 0
    rows: int = 0
    in_flight_rows: int = 0
    memory_bytes: int = 0


def estimate_bytes(engine: Engine, model_id: str) -> int:
    """The memory one request for ``model_id`` holds while it runs (see the module docstring).

    Args:
      engine: the engine serving ``model_id``.
      model_id: a served card or workflow id.

    Returns:
      The estimate in bytes.

    Raises:
      EngineError: if ``model_id`` is not served.
    """
    return _estimate(engine, model_id, ())


def _estimate(engine: Engine, model_id: str, seen: tuple[str, ...]) -> int:
    if model_id in engine.workflows():
        if model_id in seen:  # a cycle: the engine refuses it at run time; count it once here
            return MIN_REQUEST_BYTES
        stages = engine.workflow(model_id).stages
        return max([_estimate(engine, s.model, (*seen, model_id)) for s in stages] or [MIN_REQUEST_BYTES])
    loops = engine.card(model_id).spec.loops
    latents = sum(math.prod(loop.latent_shape) for loop in loops if loop.latent_shape is not None)
    return max(MIN_REQUEST_BYTES, STATE_COPIES * 4 * latents)
