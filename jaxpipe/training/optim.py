"""Optimisers: one frozen config, one optax transformation, the same for every method and every trained part.

Every trainer in jaxpipe updates its parameters with global-norm clipping followed by Adam:
``Optimizer(learning_rate).make()`` is ``optax.chain(clip_by_global_norm(grad_clip), adam(lr, b1, b2))``.
With ``schedule="warmup_cosine"`` (the pretraining recipes) the rate warms up linearly from 0 over
``warmup_steps`` and decays by a cosine to ``end_fraction · learning_rate`` at ``total_steps``, and
the update is AdamW with ``weight_decay``; a constant rate with ``weight_decay > 0`` is AdamW too.
"""

from __future__ import annotations

import dataclasses
import math

import optax

from jaxpipe import validate

__all__ = ["Optimizer", "SCHEDULES"]

SCHEDULES = ("constant", "warmup_cosine")
"""The accepted values of ``Optimizer.schedule``."""


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """Clipped Adam(W) settings (hashable: static under ``jit``).

    Attributes:
      learning_rate: the (peak) rate, > 0.
      grad_clip: the global gradient norm is clipped to this, > 0.
      b1: Adam's first-moment decay, in [0, 1) (DMD2 and self-forcing use ``b1 = 0``).
      b2: Adam's second-moment decay, in [0, 1).
      weight_decay: AdamW's decoupled weight decay, >= 0.
      schedule: ``"constant"`` or ``"warmup_cosine"``.
      warmup_steps: the warm-up's steps, an int >= 0 (``"warmup_cosine"`` only).
      total_steps: the steps at which the cosine reaches its end, an int > 0 (needed by ``"warmup_cosine"``).
      end_fraction: the cosine schedule's final rate as a fraction of ``learning_rate``, in [0, 1].

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    learning_rate: float = 1e-4
    grad_clip: float = 1.0
    b1: float = 0.9
    b2: float = 0.999
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    end_fraction: float = 0.1

    def __post_init__(self):
        for name in ("learning_rate", "grad_clip"):
            value = getattr(self, name)
            validate.rule(
                not (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not (math.isfinite(value) and value > 0)
                ),
                f"{name} must be a finite number > 0 (got {value!r})",
            )
        validate.rule(
            0.0 <= self.b1 < 1.0 and 0.0 <= self.b2 < 1.0, f"b1 and b2 must be in [0, 1) (got {self.b1}, {self.b2})"
        )
        validate.rule(
            math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            f"weight_decay must be >= 0 (got {self.weight_decay})",
        )
        validate.rule(self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES} (got {self.schedule!r})")
        if self.schedule == "warmup_cosine":
            validate.rule(
                not (
                    isinstance(self.total_steps, bool) or not isinstance(self.total_steps, int) or self.total_steps <= 0
                ),
                f"a warmup_cosine schedule needs total_steps > 0 (got {self.total_steps!r})",
            )
            validate.rule(
                not (
                    isinstance(self.warmup_steps, bool)
                    or not isinstance(self.warmup_steps, int)
                    or self.warmup_steps < 0
                ),
                f"warmup_steps must be an int >= 0 (got {self.warmup_steps!r})",
            )
        validate.rule(0.0 <= self.end_fraction <= 1.0, f"end_fraction must be in [0, 1] (got {self.end_fraction})")

    def rate(self) -> float | optax.Schedule:
        """The learning rate: a constant, or the warm-up + cosine-decay schedule over the step count."""
        if self.schedule == "constant":
            return self.learning_rate
        return optax.warmup_cosine_decay_schedule(
            0.0,
            self.learning_rate,
            max(self.warmup_steps, 1),
            max(self.total_steps, self.warmup_steps + 1),
            end_value=self.end_fraction * self.learning_rate,
        )

    def make(self) -> optax.GradientTransformation:
        """``chain(clip_by_global_norm, adam)`` — AdamW under a schedule or with weight decay."""
        clip = optax.clip_by_global_norm(self.grad_clip)
        if self.schedule == "constant" and self.weight_decay == 0.0:
            return optax.chain(clip, optax.adam(self.learning_rate, b1=self.b1, b2=self.b2))
        return optax.chain(clip, optax.adamw(self.rate(), b1=self.b1, b2=self.b2, weight_decay=self.weight_decay))
