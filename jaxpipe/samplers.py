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
    """The affine SDE step ``mean = a·x + b·v``, ``sample = mean + std·noise`` (std = σ_eff)."""

    a: jax.Array
    b: jax.Array
    std: jax.Array


class SDEStep(NamedTuple):
    """One FlowGRPO SDE step: the sample, its log-prob ``(B,)``, the mean and ``std = σ_eff``."""

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
    """Flow-shift a schedule: ``σ' = shift·σ / (1 + (shift-1)·σ)``; ``shift = 1`` is the identity."""
    if not shift > 0:
        raise ValueError(f"shift must be > 0 (got {shift})")
    sigmas = jnp.asarray(sigmas, jnp.float32)
    if shift == 1.0:
        return sigmas
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def flow_sigmas(num_steps: int, shift: float = 1.0) -> jax.Array:
    """The ``(num_steps + 1,)`` schedule from 1 down to 0: ``linspace(1, 0, N+1)``, flow-shifted."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps <= 0:
        raise ValueError(f"num_steps must be a positive int (got {num_steps!r})")
    return shift_sigmas(jnp.linspace(1.0, 0.0, num_steps + 1, dtype=jnp.float32), shift)


def noised(x0: jax.Array, eps: jax.Array, sigma) -> jax.Array:
    """The forward process ``x_σ = (1 - σ)·x0 + σ·ε`` for clean ``x0`` and noise ``eps`` ``(B, ...)`` at a
    scalar or per-example ``(B,)`` ``sigma`` (computed in the inputs' dtype)."""
    sigma = jnp.asarray(sigma)
    s = sigma.reshape(sigma.shape + (1,) * (x0.ndim - sigma.ndim))
    return (1.0 - s) * x0 + s * eps


def euler_step(x: jax.Array, v: jax.Array, sigma, sigma_next) -> jax.Array:
    """Deterministic flow-matching Euler step ``x + (σ_next - σ)·v`` (float32, shape of ``x``)."""
    _check_same_shape("v", v, x)
    x = jnp.asarray(x, jnp.float32)
    dt = _as_per_example(sigma_next, x) - _as_per_example(sigma, x)
    return x + dt * jnp.asarray(v, jnp.float32)


def sde_coefficients(sigma, sigma_next, noise_level=0.7) -> SDECoefficients:
    """FlowGRPO's SDE step as ``(a, b, σ_eff)`` for ``mean = a·x + b·v``.

    Where ``σ >= 1`` the denominator uses ``σ_next`` instead of σ (FlowGRPO's choice), so the
    first step is well-conditioned: ``a = 1 - η²/2`` at σ = 1 whatever the schedule.
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
    """One FlowGRPO SDE step from ``x`` (B, ...) with velocity ``v`` and standard-normal ``noise``.

    Returns ``SDEStep(sample, log_prob (B,), mean, std=σ_eff)``; log_prob is the per-element
    Gaussian log-density averaged over the event axes.
    """
    _check_same_shape("v", v, x)
    _check_same_shape("noise", noise, x)
    mean, std = sde_mean(x, v, sigma, sigma_next, noise_level=noise_level)
    sample = mean + std * jnp.asarray(noise, jnp.float32)
    return SDEStep(sample=sample, log_prob=_gaussian_log_prob(sample, mean, std), mean=mean, std=std)


def sde_log_prob(x: jax.Array, v: jax.Array, sigma, sigma_next, sample: jax.Array, *, noise_level=0.7) -> jax.Array:
    """``(B,)`` log-prob of a realized ``sample`` under the SDE step from ``x`` with velocity ``v``.

    ``sample`` is a constant here: gradients flow only through ``v`` (and ``x``).
    """
    _check_same_shape("v", v, x)
    _check_same_shape("sample", sample, x)
    mean, std = sde_mean(x, v, sigma, sigma_next, noise_level=noise_level)
    return _gaussian_log_prob(jnp.asarray(sample, jnp.float32), mean, std)


def sde_mean(x: jax.Array, v: jax.Array, sigma, sigma_next, *, noise_level=0.7) -> tuple[jax.Array, jax.Array]:
    """The SDE step's Gaussian: ``(mean = a·x + b·v`` shaped like ``x``, ``σ_eff`` broadcastable to it)."""
    _check_same_shape("v", v, x)
    x = jnp.asarray(x, jnp.float32)
    coef = _coefficients_for(x, sigma, sigma_next, noise_level)
    return coef.a * x + coef.b * jnp.asarray(v, jnp.float32), coef.std


def ml_velocity(x: jax.Array, sample: jax.Array, sigma, sigma_next, *, noise_level=0.7) -> jax.Array:
    """The velocity whose SDE mean lands exactly on ``sample``: ``(sample - a·x) / b``."""
    _check_same_shape("sample", sample, x)
    x = jnp.asarray(x, jnp.float32)
    coef = _coefficients_for(x, sigma, sigma_next, noise_level)
    return (jnp.asarray(sample, jnp.float32) - coef.a * x) / coef.b


def cfg_combine(v_cond: jax.Array, v_uncond: jax.Array, guidance) -> jax.Array:
    """Classifier-free guidance ``v_uncond + g·(v_cond - v_uncond)``; ``g`` scalar or ``(B,)``."""
    _check_same_shape("v_uncond", v_uncond, v_cond)
    g = _as_per_example(guidance, v_cond)
    return v_uncond + g * (v_cond - v_uncond)
