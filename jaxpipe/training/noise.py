"""Noise levels: how a method draws the σ at which it re-noises clean samples, ``x_σ = (1-σ)·x0 + σ·ε``.

Flow-matching pretraining (``Finetune``), DiffusionNFT, DMD2's critic and student updates and
self-forcing all regress or compare velocities at a re-noised sample; ``NoiseLevels`` is the one
setting of how that σ is drawn, and ``samplers.noised`` the one re-noising.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxpipe import validate

__all__ = ["NoiseLevels", "SAMPLINGS"]

SAMPLINGS = ("uniform", "logit_normal")
"""The accepted values of ``NoiseLevels.sampling``."""


@dataclasses.dataclass(frozen=True)
class NoiseLevels:
    """σ per row: ``"uniform"`` on ``[min, max]`` or ``"logit_normal"`` (``sigmoid(N(0, 1))`` clipped to it).

    Attributes:
      sampling: ``"uniform"`` or ``"logit_normal"``.
      min: the lower end of the range, ``0 <= min < max``.
      max: the upper end, ``max <= 1``.

    Raises:
      ValueError: on construction, if ``sampling`` is unknown or the range is not ``0 <= min < max <= 1``.
    """

    sampling: str = "uniform"
    min: float = 0.02
    max: float = 0.98

    def __post_init__(self):
        validate.rule(
            self.sampling in SAMPLINGS, f"noise level sampling must be one of {SAMPLINGS} (got {self.sampling!r})"
        )
        validate.rule(
            0.0 <= self.min < self.max <= 1.0,
            f"noise levels need 0 <= min < max <= 1 (got min={self.min}, max={self.max})",
        )

    def draw(self, key: jax.Array, rows: int) -> jax.Array:
        """Draw one noise level per row.

        Args:
          key: a PRNG key.
          rows: how many levels.

        Returns:
          ``(rows,)`` float32 levels in ``[min, max]``.
        """
        if self.sampling == "uniform":
            return jax.random.uniform(key, (rows,), minval=self.min, maxval=self.max)
        sigma = jax.nn.sigmoid(jax.random.normal(key, (rows,)))
        if (self.min, self.max) == (0.0, 1.0):
            return sigma  # already in [0, 1]
        return jnp.clip(sigma, self.min, self.max)
