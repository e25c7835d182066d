"""Pure flow-matching sampler math: schedules, Euler, the FlowGRPO SDE step and its log-prob.

Conventions: ``x_σ = (1-σ)·x0 + σ·ε`` and the network predicts ``v = ε - x0``.
Arrays have a leading batch axis; every other axis is an event axis. A ``sigma`` argument is a
scalar or a per-example ``(B,)`` array, so requests at different steps can share one batch.
Everything here is float32, shape-polymorphic and safe under ``jit``, ``vmap`` and ``grad``.
This module imports only ``jax`` (and the standard library).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "SDEStep",
    "SDECoefficients",
    "flow_sigmas",
    "shift_sigmas",
    "noised",
    "euler_step",
    "sde_coefficients",
    "sde_step",
    "sde_mean",
    "sde_log_prob",
    "ml_velocity",
    "cfg_combine",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class SDECoefficients(NamedTuple):
    """The affine form of one FlowGRPO SDE step: ``mean = a·x + b·v``, ``sample = mean + std·noise``.

    Attributes:
      a: float32 coefficient of the latents ``x``.
      b: float32 coefficient of the velocity ``v``.
      std: ``σ_eff``, the step's float32 standard deviation.
    """

    a: jax.Array
    b: jax.Array
    std: jax.Array


class SDEStep(NamedTuple):
    """One FlowGRPO SDE step, as ``sde_step`` returns it.

    Attributes:
      sample: the next latents ``mean + σ_eff·noise``, float32, shaped like ``x``.
      log_prob: ``(B,)`` float32: the Gaussian log-density of ``sample``, averaged over the event axes.
      mean: the step's mean ``a·x + b·v``, float32, shaped like ``x``.
      std: ``σ_eff``, broadcastable against ``x`` (a scalar for scalar sigmas, ``(B, 1, ..., 1)`` for
        per-example ones).
    """

    sample: jax.Array
    log_prob: jax.Array
    mean: jax.Array
    std: jax.Array


def _static_value(value):
    """The Python value of ``value`` if it is concrete, else ``None`` (it is being traced)."""
    try:
        return float(value)
    except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _check_noise_level(noise_level) -> None:
    value = _static_value(noise_level) if jnp.ndim(noise_level) == 0 else None
    if value is not None and not value >= 0.0:
        raise ValueError(f"noise_level must be >= 0 (got {value})")


def _check_same_shape(name: str, array: jax.Array, x: jax.Array) -> None:
    if jnp.shape(array) != jnp.shape(x):
        raise ValueError(f"{name} must have the shape of x {jnp.shape(x)}, got {jnp.shape(array)}")


def _as_per_example(sigma, x: jax.Array) -> jax.Array:
    """float32 ``sigma`` broadcastable against ``x``: a scalar stays a scalar, ``(B,)`` -> ``(B, 1, ...)``."""
    sigma = jnp.asarray(sigma, jnp.float32)
    if sigma.ndim == 0:
        return sigma
    if sigma.ndim != 1 or jnp.ndim(x) == 0 or sigma.shape[0] != jnp.shape(x)[0]:
        raise ValueError(
            f"sigma must be a scalar or a per-example array of shape ({jnp.shape(x)[0] if jnp.ndim(x) else '?'},); "
            f"got shape {sigma.shape} for x of shape {jnp.shape(x)}"
        )
    return sigma.reshape(sigma.shape + (1,) * (jnp.ndim(x) - 1))


def _event_mean(values: jax.Array) -> jax.Array:
    """Mean over every axis but the leading batch axis: ``(B, ...) -> (B,)``."""
    return jnp.mean(values.reshape(values.shape[0], -1), axis=-1)


def shift_sigmas(sigmas, shift: float = 1.0) -> jax.Array:
    """Flow-shift a noise schedule: ``σ' = shift·σ / (1 + (shift-1)·σ)``.

    ``shift > 1`` moves the levels towards 1 (more of the schedule at high noise); 0 and 1 stay where
    they are, and ``shift = 1`` is the identity.

    Args:
      sigmas: noise levels in [0, 1], any shape.
      shift: the shift factor, a Python number > 0.

    Returns:
      The shifted levels, float32, shaped like ``sigmas``.

    Raises:
      ValueError: if ``shift`` is not > 0.
    """
    if not shift > 0:
        raise ValueError(f"shift must be > 0 (got {shift})")
    sigmas = jnp.asarray(sigmas, jnp.float32)
    if shift == 1.0:
        return sigmas
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def flow_sigmas(num_steps: int, shift: float = 1.0) -> jax.Array:
    """The flow-matching sampling schedule from 1 down to 0: ``shift_sigmas(linspace(1, 0, N + 1), shift)``.

    Args:
      num_steps: the number of sampling steps N, a positive Python int.
      shift: the flow-shift applied to the uniform ladder (``shift_sigmas``), > 0.

    Returns:
      ``(num_steps + 1,)`` float32 noise levels, ``sigmas[0] == 1`` and ``sigmas[-1] == 0``.

    Raises:
      ValueError: if ``num_steps`` is not a positive int (a bool is refused) or ``shift`` is not > 0.
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps <= 0:
        raise ValueError(f"num_steps must be a positive int (got {num_steps!r})")
    return shift_sigmas(jnp.linspace(1.0, 0.0, num_steps + 1, dtype=jnp.float32), shift)


def noised(x0: jax.Array, eps: jax.Array, sigma) -> jax.Array:
    """The forward (noising) process ``x_σ = (1 - σ)·x0 + σ·ε``.

    Args:
      x0: clean samples ``(B, ...)``.
      eps: the noise ε, shaped like ``x0``.
      sigma: the noise level, a scalar or per-example ``(B,)`` (padded with trailing unit axes to the
        rank of ``x0``).

    Returns:
      The noisy samples, shaped like ``x0``, in the dtype the inputs promote to (no cast to float32).
    """
    sigma = jnp.asarray(sigma)
    s = sigma.reshape(sigma.shape + (1,) * (x0.ndim - sigma.ndim))
    return (1.0 - s) * x0 + s * eps


def euler_step(x: jax.Array, v: jax.Array, sigma, sigma_next) -> jax.Array:
    """The deterministic flow-matching Euler step ``x + (σ_next - σ)·v``.

    Args:
      x: latents ``(B, ...)`` at ``sigma``.
      v: the velocity at ``(x, sigma)``, shaped like ``x``.
      sigma: the current noise level, a scalar or per-example ``(B,)``.
      sigma_next: the next noise level, a scalar or ``(B,)``.

    Returns:
      The latents at ``sigma_next``, float32, shaped like ``x``.

    Raises:
      ValueError: if ``v`` is not shaped like ``x`` or a sigma is neither a scalar nor ``(B,)``.
    """
    _check_same_shape("v", v, x)
    x = jnp.asarray(x, jnp.float32)
    dt = _as_per_example(sigma_next, x) - _as_per_example(sigma, x)
    return x + dt * jnp.asarray(v, jnp.float32)


def sde_coefficients(sigma, sigma_next, noise_level=0.7) -> SDECoefficients:
    """FlowGRPO's SDE step as the coefficients ``(a, b, σ_eff)`` of ``mean = a·x + b·v``.

    With ``dt = σ_next - σ`` (negative) and ``s = η·sqrt(σ / (1 - σ_d))``, where ``σ_d = σ_next`` if
    ``σ >= 1`` and ``σ_d = σ`` otherwise:

        a     = 1 + s²·dt / (2σ)
        b     = (1 + s²·(1 - σ) / (2σ))·dt
        σ_eff = s·sqrt(-dt)

    i.e. ``mean = x + dt·[v + s²/(2σ)·(x + (1 - σ)·v)]``: the Euler step plus FlowGRPO's drift
    correction. Using ``σ_next`` in the denominator where ``σ >= 1`` (FlowGRPO's choice) keeps the first
    step finite: ``a = 1 - η²/2`` at σ = 1 whatever the schedule. ``η = 0`` is the Euler step
    (``a = 1``, ``b = dt``, ``σ_eff = 0``).

    Args:
      sigma: the current noise level(s) σ, any shape that broadcasts against ``sigma_next``.
      sigma_next: the next noise level(s), below ``sigma``.
      noise_level: the SDE's noise scale η >= 0 (FlowGRPO uses 0.7).

    Returns:
      ``SDECoefficients(a, b, std=σ_eff)``, float32, in the broadcast shape of the inputs.

    Raises:
      ValueError: if ``noise_level`` is a concrete scalar below 0.
    """
    _check_noise_level(noise_level)
    sigma = jnp.asarray(sigma, jnp.float32)
    sigma_next = jnp.asarray(sigma_next, jnp.float32)
    eta = jnp.asarray(noise_level, jnp.float32)
    dt = sigma_next - sigma
    sigma_den = jnp.where(sigma >= 1.0, sigma_next, sigma)
    std = jnp.sqrt(sigma / (1.0 - sigma_den)) * eta
    a = 1.0 + std**2 * dt / (2.0 * sigma)
    b = (1.0 + std**2 * (1.0 - sigma) / (2.0 * sigma)) * dt
    return SDECoefficients(a=a, b=b, std=std * jnp.sqrt(-dt))


def _coefficients_for(x, sigma, sigma_next, noise_level) -> SDECoefficients:
    sigma = _as_per_example(sigma, x)
    sigma_next = _as_per_example(sigma_next, x)
    return sde_coefficients(sigma, sigma_next, noise_level)


def _gaussian_log_prob(sample, mean, std) -> jax.Array:
    sample = jax.lax.stop_gradient(sample)
    elementwise = -((sample - mean) ** 2) / (2.0 * std**2) - jnp.log(std) - _HALF_LOG_2PI
    return _event_mean(jnp.broadcast_to(elementwise, jnp.broadcast_shapes(elementwise.shape, sample.shape)))


def sde_step(x: jax.Array, v: jax.Array, sigma, sigma_next, noise: jax.Array, *, noise_level=0.7) -> SDEStep:
    """One FlowGRPO SDE step, ``sample = mean + σ_eff·noise``, and the sample's log-prob.

    ``mean`` and ``σ_eff`` are ``sde_mean``'s. The log-prob is the per-element Gaussian log-density
    ``-(sample - mean)² / (2σ_eff²) - log σ_eff - ½·log 2π`` averaged (not summed) over the event axes,
    with ``sample`` held constant (stop-gradient), so its gradient reaches ``v`` and ``x`` through
    ``mean`` only. It is finite only where ``σ_eff > 0`` (``η > 0`` and ``σ_next < σ``).

    Args:
      x: latents ``(B, ...)`` at ``sigma``.
      v: the velocity at ``(x, sigma)``, shaped like ``x``.
      sigma: the current noise level, a scalar or per-example ``(B,)``.
      sigma_next: the next noise level, a scalar or ``(B,)``.
      noise: standard-normal noise, shaped like ``x``.
      noise_level: the SDE's noise scale η >= 0.

    Returns:
      ``SDEStep(sample, log_prob (B,), mean, std=σ_eff)``, float32.

    Raises:
      ValueError: if ``v`` or ``noise`` is not shaped like ``x``, a sigma is neither a scalar nor
        ``(B,)``, or ``noise_level`` is below 0.
    """
    _check_same_shape("v", v, x)
    _check_same_shape("noise", noise, x)
    mean, std = sde_mean(x, v, sigma, sigma_next, noise_level=noise_level)
    sample = mean + std * jnp.asarray(noise, jnp.float32)
    return SDEStep(sample=sample, log_prob=_gaussian_log_prob(sample, mean, std), mean=mean, std=std)


def sde_log_prob(x: jax.Array, v: jax.Array, sigma, sigma_next, sample: jax.Array, *, noise_level=0.7) -> jax.Array:
    """The log-prob of a realised ``sample`` under the SDE step from ``x`` with velocity ``v``.

    The same density as ``sde_step``'s ``log_prob`` (the per-element Gaussian log-density averaged over
    the event axes). ``sample`` is a constant here, so gradients flow only through ``v`` (and ``x``):
    what a trainer recomputes for its PPO ratios.

    Args:
      x: latents ``(B, ...)`` at ``sigma``.
      v: the velocity at ``(x, sigma)``, shaped like ``x``.
      sigma: the current noise level, a scalar or per-example ``(B,)``.
      sigma_next: the next noise level, a scalar or ``(B,)``.
      sample: the realised next latents, shaped like ``x``.
      noise_level: the SDE's noise scale η >= 0.

    Returns:
      ``(B,)`` float32 log-probs.

    Raises:
      ValueError: if ``v`` or ``sample`` is not shaped like ``x``, a sigma is neither a scalar nor
        ``(B,)``, or ``noise_level`` is below 0.
    """
    _check_same_shape("v", v, x)
    _check_same_shape("sample", sample, x)
    mean, std = sde_mean(x, v, sigma, sigma_next, noise_level=noise_level)
    return _gaussian_log_prob(jnp.asarray(sample, jnp.float32), mean, std)


def sde_mean(x: jax.Array, v: jax.Array, sigma, sigma_next, *, noise_level=0.7) -> tuple[jax.Array, jax.Array]:
    """The Gaussian of one SDE step: its mean ``a·x + b·v`` and ``σ_eff`` (``sde_coefficients``).

    Args:
      x: latents ``(B, ...)`` at ``sigma``.
      v: the velocity at ``(x, sigma)``, shaped like ``x``.
      sigma: the current noise level, a scalar or per-example ``(B,)``.
      sigma_next: the next noise level, a scalar or ``(B,)``.
      noise_level: the SDE's noise scale η >= 0.

    Returns:
      ``(mean, std)``: ``mean`` float32 shaped like ``x``; ``std`` (σ_eff) broadcastable against it, a
      scalar for scalar sigmas and ``(B, 1, ..., 1)`` for per-example ones.

    Raises:
      ValueError: if ``v`` is not shaped like ``x``, a sigma is neither a scalar nor ``(B,)``, or
        ``noise_level`` is below 0.
    """
    _check_same_shape("v", v, x)
    x = jnp.asarray(x, jnp.float32)
    coef = _coefficients_for(x, sigma, sigma_next, noise_level)
    return coef.a * x + coef.b * jnp.asarray(v, jnp.float32), coef.std


def ml_velocity(x: jax.Array, sample: jax.Array, sigma, sigma_next, *, noise_level=0.7) -> jax.Array:
    """The max-likelihood velocity: the ``v`` whose SDE mean lands exactly on ``sample``.

    Solves ``a·x + b·v = sample``: ``v = (sample - a·x) / b`` with ``a``, ``b`` from
    ``sde_coefficients``, the velocity under which ``sample`` has the highest ``sde_log_prob``.
    Finite only where ``b != 0``, i.e. ``σ_next != σ``.

    Args:
      x: latents ``(B, ...)`` at ``sigma``.
      sample: the target next latents, shaped like ``x``.
      sigma: the current noise level, a scalar or per-example ``(B,)``.
      sigma_next: the next noise level, a scalar or ``(B,)``.
      noise_level: the SDE's noise scale η >= 0.

    Returns:
      The velocity, float32, shaped like ``x``.

    Raises:
      ValueError: if ``sample`` is not shaped like ``x``, a sigma is neither a scalar nor ``(B,)``, or
        ``noise_level`` is below 0.
    """
    _check_same_shape("sample", sample, x)
    x = jnp.asarray(x, jnp.float32)
    coef = _coefficients_for(x, sigma, sigma_next, noise_level)
    return (jnp.asarray(sample, jnp.float32) - coef.a * x) / coef.b


def cfg_combine(v_cond: jax.Array, v_uncond: jax.Array, guidance) -> jax.Array:
    """Classifier-free guidance: ``v_uncond + g·(v_cond - v_uncond)``.

    Args:
      v_cond: the conditional velocity ``(B, ...)``.
      v_uncond: the unconditional velocity, shaped like ``v_cond``.
      guidance: the scale g (1 gives ``v_cond``), a scalar or per-example ``(B,)``.

    Returns:
      The guided velocity, shaped like ``v_cond``.

    Raises:
      ValueError: if ``v_uncond`` is not shaped like ``v_cond`` or ``guidance`` is neither a scalar nor
        ``(B,)``.
    """
    _check_same_shape("v_uncond", v_uncond, v_cond)
    g = _as_per_example(guidance, v_cond)
    return v_uncond + g * (v_cond - v_uncond)
