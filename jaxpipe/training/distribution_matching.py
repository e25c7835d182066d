"""Distribution matching (DMD2) written once: the critic, the real and fake scores, the student's gradient.

``DMD2`` (a few-step image student) and ``SelfForcing`` (a causal video student on its own rollout)
share it. At a re-noised student sample ``x_t = (1−t)·x̂0 + t·ε`` (``t`` from ``noise``):

    x̂0_real = x_t − t·v_real(x_t, t)      the frozen teacher at guidance ``real_guidance``
    x̂0_fake = x_t − t·v_fake(x_t, t)      the critic, trained by flow matching on the student's samples
    g_b     = (x̂0_fake − x̂0_real)_b / sg(mean_d |x̂0 − x̂0_real|_b)        (DMD2's per-sample normaliser)
    L       = mean_b 0.5·‖x̂0_b − sg(x̂0_b − g_b)‖²                          (sum over the latent dims)

so ``∂L/∂x̂0_b = g_b / B``: descending moves ``x̂0`` toward the teacher's denoising of its own noisy
version and away from the critic's. In score form the unnormalised ``g`` is ``t²/(1−t)·(s_fake −
s_real)``: per sample, a positive multiple of DMD's ``∇ KL(p_student ‖ p_teacher)`` integrand at ``x_t``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe import samplers, validate
from jaxpipe.loops import denoise
from jaxpipe.training.noise import NoiseLevels
from jaxpipe.training.optim import Optimizer

__all__ = ["DistributionMatching", "dm_gradient", "dm_surrogate", "clean_estimates", "critic_loss", "per_row"]


@dataclasses.dataclass(frozen=True)
class DistributionMatching:
    """The settings of the fake score and the real one (hashable: static under ``jit``).

    Attributes:
      critic: the critic's optimiser (Adam with DMD2's ``b1 = 0`` by default).
      critic_steps: critic updates per student update (DMD2's two-time-scale rule), >= 1.
      real_guidance: the teacher's CFG scale, a finite number >= 0 (``None``: the teacher card's default).
      noise: the re-noising levels ``t`` of the critic's and the student's losses (``noise.min > 0``).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    critic: Optimizer = Optimizer(1e-4, b1=0.0)
    critic_steps: int = 5
    real_guidance: float | None = None
    noise: NoiseLevels = NoiseLevels()

    def __post_init__(self):
        validate.rule(
            not (
                isinstance(self.critic_steps, bool) or not isinstance(self.critic_steps, int) or self.critic_steps < 1
            ),
            f"critic_steps must be an int >= 1 (got {self.critic_steps!r})",
        )
        validate.rule(
            self.real_guidance is None or bool(jnp.isfinite(self.real_guidance) and self.real_guidance >= 0),
            f"real_guidance (the teacher's CFG scale) must be None or a finite number >= 0 (got {self.real_guidance})",
        )
        validate.rule(
            not self.noise.min <= 0.0,
            f"distribution matching re-noises at t > 0: noise.min must be > 0 (got {self.noise.min})",
        )


def per_row(a: jax.Array, like: jax.Array) -> jax.Array:
    """``a`` reshaped to broadcast against ``like``: trailing unit axes up to ``like``'s rank.

    Args:
      a: a per-row array, e.g. ``(B,)``.
      like: an array ``(B, ...)``.

    Returns:
      ``a`` reshaped to ``a.shape + (1,) * (like.ndim - a.ndim)``.
    """
    return a.reshape(a.shape + (1,) * (like.ndim - a.ndim))


def dm_gradient(x0: jax.Array, x0_real: jax.Array, x0_fake: jax.Array) -> jax.Array:
    """DMD2's distribution-matching gradient ``g = (x̂0_fake − x̂0_real) / mean_d |x̂0 − x̂0_real|`` per row.

    A constant: every input is stop-gradient. The per-row normaliser is floored at 1e-6, so a row the
    teacher already reproduces gets a finite ``g``.

    Args:
      x0: the student's clean estimates ``(B, ...)``.
      x0_real: the real score's (teacher's) clean predictions, shaped like ``x0``.
      x0_fake: the fake score's (critic's) clean predictions, shaped like ``x0``.

    Returns:
      ``g``, shaped like ``x0``.
    """
    x0, x0_real, x0_fake = jax.lax.stop_gradient((x0, x0_real, x0_fake))
    axes = tuple(range(1, x0.ndim))
    scale = jnp.mean(jnp.abs(x0 - x0_real), axis=axes, keepdims=True)
    return (x0_fake - x0_real) / jnp.maximum(scale, 1e-6)  # a row the teacher already reproduces gets a finite g


def dm_surrogate(x0: jax.Array, g: jax.Array) -> jax.Array:
    """The surrogate loss ``mean_b 0.5·‖x̂0_b − sg(x̂0_b − g_b)‖²`` (summed over the latent dims).

    Its value is ``mean_b 0.5·‖g_b‖²`` and its gradient in ``x̂0`` is ``g / B``: descending it moves
    ``x̂0`` along ``−g``.

    Args:
      x0: the student's clean estimates ``(B, ...)`` (differentiable).
      g: the distribution-matching gradient, shaped like ``x0`` (``dm_gradient``).

    Returns:
      A scalar.
    """
    target = jax.lax.stop_gradient(x0 - g)
    return jnp.mean(0.5 * jnp.sum((x0 - target) ** 2, axis=tuple(range(1, x0.ndim))))


def _renoised(x0: jax.Array, key: jax.Array, noise: NoiseLevels) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(x_t, t (B,), ε)``: ``x0`` re-noised at ``t`` drawn by ``noise`` per row, fresh ``ε``."""
    k_t, k_eps = jax.random.split(key)
    t = noise.draw(k_t, x0.shape[0])
    eps = jax.random.normal(k_eps, x0.shape)
    return samplers.noised(x0, eps, t), t, eps


def clean_estimates(
    real: tuple,
    fake: tuple,
    x0: jax.Array,
    key: jax.Array,
    cond: Any,
    uncond: Any,
    real_policy: denoise.DenoiseConfig,
    fake_policy: denoise.DenoiseConfig,
    noise: NoiseLevels,
) -> tuple[jax.Array, jax.Array]:
    """The real and fake clean predictions at ``x0`` re-noised: ``x̂0 = x_t − t·v(x_t, t)`` for each score.

    ``x_t = (1−t)·x0 + t·ε`` with ``t`` drawn per row by ``noise`` and fresh ``ε`` (both from ``key``);
    ``x0`` is stop-gradient.

    Args:
      real: the real score's denoiser(s) (the frozen teacher).
      fake: the fake score's denoiser(s) (the critic).
      x0: the student's clean samples ``(B, ...)``.
      key: a PRNG key for ``t`` and ``ε``.
      cond: the conditioning pytree (leading axis ``B``).
      uncond: the unconditional conditioning for the real score's guidance.
      real_policy: the real score's loop policy (its guidance and router).
      fake_policy: the fake score's loop policy (unguided).
      noise: how ``t`` is drawn.

    Returns:
      ``(x̂0_real, x̂0_fake)``, each shaped like ``x0``.
    """
    x0 = jax.lax.stop_gradient(x0)
    x_t, t, _ = _renoised(x0, key, noise)
    s = per_row(t, x_t)
    v_real = denoise.velocity(real, x_t, t, cond, real_policy, uncond)
    v_fake = denoise.velocity(fake, x_t, t, cond, fake_policy)
    return x_t - s * v_real, x_t - s * v_fake


def critic_loss(
    critic: tuple, x0: jax.Array, cond: Any, key: jax.Array, policy: denoise.DenoiseConfig, noise: NoiseLevels
) -> jax.Array:
    """Flow matching of the critic (the fake score) on the student's samples ``x0``.

    The loss is ``mean((v_φ(x_t, t, c) − (ε − x0))²)``.

    ``x_t = (1−t)·x0 + t·ε`` with ``t`` drawn per row by ``noise`` and fresh ``ε``; ``x0`` is a constant.

    Args:
      critic: the critic's denoiser(s).
      x0: the student's clean samples ``(B, ...)``.
      cond: the conditioning pytree (leading axis ``B``).
      key: a PRNG key for ``t`` and ``ε``.
      policy: the critic's loop policy (unguided).
      noise: how ``t`` is drawn.

    Returns:
      A scalar, differentiable in ``critic``.
    """
    x0 = jax.lax.stop_gradient(x0)
    x_t, t, eps = _renoised(x0, key, noise)
    v = denoise.velocity(critic, x_t, t, cond, policy)
    return jnp.mean((v - (eps - x0)) ** 2)
