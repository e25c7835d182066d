"""The denoise loop: a pure ``step`` and a fused ``lax.scan`` runner (DESIGN §7).

State is an explicit pytree holding everything per request: latents, per-request sigma
schedules and step indices, per-request PRNG keys and the conditioning. The noise of step ``i``
of a request is drawn from ``fold_in(request_key, i)``, so a request's bits do not depend on
which other requests share its batch or on who drives the loop (``run`` or the engine).

Sampling policies are static (``DenoiseConfig``): ODE (Euler) or SDE (FlowGRPO) with an
optional SDE window, and classifier-free guidance (``guidance == 1`` runs one forward).
Under ``capture=True`` ``run`` also returns the ``Transition`` of every captured step
(the SDE window), stacked on a leading time axis; serving compiles without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxpipe import samplers

__all__ = [
    "DenoiseConfig",
    "Conditioning",
    "DenoiseState",
    "Transition",
    "init",
    "step",
    "run",
    "velocity",
    "trajectory_stats",
    "trajectory_log_probs",
]

Denoiser = Callable[..., jax.Array]
"""``model(x, sigma, context, context_mask, first_frame) -> v``, e.g. ``jaxpipe.nn.DiT``."""


@dataclasses.dataclass(frozen=True)
class DenoiseConfig:
    """Static sampling policy of a denoise loop.

    num_steps: Euler/SDE steps; shift: flow-shift of the schedule; sampler: ``"ode"`` or
    ``"sde"``; noise_level: the SDE's η; sde_window: ``(i, j)`` runs SDE only on steps
    ``[i, j)`` (``None``: every step); guidance: CFG scale (1 = no guidance, one forward).
    """

    num_steps: int = 8
    shift: float = 1.0
    sampler: str = "ode"
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    guidance: float = 1.0

    def __post_init__(self):
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps <= 0:
            raise ValueError(f"num_steps must be a positive int (got {self.num_steps!r})")
        if not self.shift > 0:
            raise ValueError(f"shift must be > 0 (got {self.shift})")
        if self.sampler not in ("ode", "sde"):
            raise ValueError(f"sampler must be 'ode' or 'sde' (got {self.sampler!r})")
        if not self.noise_level >= 0:
            raise ValueError(f"noise_level must be >= 0 (got {self.noise_level})")
        if not self.guidance >= 0:
            raise ValueError(f"guidance must be >= 0 (got {self.guidance})")
        if self.sde_window is not None:
            window = tuple(self.sde_window)
            if len(window) != 2 or not 0 <= window[0] < window[1] <= self.num_steps:
                raise ValueError(
                    f"sde_window must be (i, j) with 0 <= i < j <= num_steps={self.num_steps} (got {self.sde_window})"
                )
            object.__setattr__(self, "sde_window", window)

    @property
    def captured_steps(self) -> tuple[int, int]:
        """The ``[i, j)`` steps a rollout captures: the SDE window, or every step for ODE."""
        if self.sampler == "sde" and self.sde_window is not None:
            return self.sde_window
        return (0, self.num_steps)

    def replace(self, **changes) -> "DenoiseConfig":
        return dataclasses.replace(self, **changes)


class Conditioning(NamedTuple):
    """Per-request conditioning: text ``context`` ``(B, L, D)`` with ``context_mask`` ``(B, L)``,
    the unconditional text for CFG (or ``None``) and an optional ``first_frame`` ``(B, h, w, C)``."""

    context: jax.Array
    context_mask: jax.Array
    uncond_context: jax.Array | None = None
    uncond_mask: jax.Array | None = None
    first_frame: jax.Array | None = None


class DenoiseState(NamedTuple):
    """Everything per request: latents ``x`` ``(B, T, h, w, C)``, ``sigmas`` ``(B, N+1)``,
    ``step`` ``(B,)`` int32, ``key`` ``(B,)`` PRNG keys and ``cond``."""

    x: jax.Array
    sigmas: jax.Array
    step: jax.Array
    key: jax.Array
    cond: Conditioning


class Transition(NamedTuple):
    """One step of a trajectory (under ``run`` each field gains a leading time axis).

    ``x`` is the step's input, ``sample`` its output, ``mean``/``std`` the SDE Gaussian
    (for an ODE step ``mean == sample`` and ``std == 0``), ``log_prob`` ``(B,)`` the sample's
    log-prob (0 for ODE steps), ``sigma``/``sigma_next``/``step`` ``(B,)``.
    """

    x: jax.Array
    sample: jax.Array
    mean: jax.Array
    std: jax.Array
    log_prob: jax.Array
    sigma: jax.Array
    sigma_next: jax.Array
    step: jax.Array


def init(keys: jax.Array, latent_shape: tuple[int, ...], cond: Conditioning, config: DenoiseConfig) -> DenoiseState:
    """Start ``B = len(keys)`` requests from pure noise of per-request ``latent_shape`` ``(T, h, w, C)``.

    ``keys`` are per-request PRNG keys ``(B,)`` (e.g. ``jax.random.key(seed)`` stacked): the same
    key gives the same request whatever else is in the batch.
    """
    keys = jnp.asarray(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.ndim != 1:
        raise ValueError(f"keys must be a (B,) array of typed PRNG keys (jax.random.key), got {keys.dtype}{keys.shape}")
    b = keys.shape[0]
    chex.assert_shape(cond.context, (b, None, None))
    chex.assert_shape(cond.context_mask, (b, cond.context.shape[1]))
    if config.guidance != 1.0 and cond.uncond_context is None:
        raise ValueError(f"guidance={config.guidance} needs cond.uncond_context (the unconditional text)")
    init_keys, step_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    x = jax.vmap(lambda k: jax.random.normal(k, tuple(latent_shape), jnp.float32))(init_keys)
    sigmas = jnp.broadcast_to(samplers.flow_sigmas(config.num_steps, config.shift), (b, config.num_steps + 1))
    return DenoiseState(x=x, sigmas=sigmas, step=jnp.zeros((b,), jnp.int32), key=step_keys, cond=cond)


def velocity(model: Denoiser, x: jax.Array, sigma: jax.Array, cond: Conditioning, guidance: float) -> jax.Array:
    """The model's velocity at ``(x, sigma)``, with classifier-free guidance when ``guidance != 1``.

    Guided evaluation runs conditional and unconditional halves as one doubled batch.
    """
    if guidance == 1.0:
        return model(x, sigma, cond.context, cond.context_mask, cond.first_frame)
    if cond.uncond_context is None:
        raise ValueError(f"guidance={guidance} needs cond.uncond_context (the unconditional text)")
    two = lambda a, b: None if a is None else jnp.concatenate([a, b], axis=0)
    uncond_mask = cond.uncond_mask if cond.uncond_mask is not None else jnp.ones(cond.uncond_context.shape[:2], bool)
    v = model(
        two(x, x),
        two(sigma, sigma),
        two(cond.context, cond.uncond_context),
        two(cond.context_mask, uncond_mask),
        two(cond.first_frame, cond.first_frame),
    )
    v_cond, v_uncond = jnp.split(v, 2, axis=0)
    return samplers.cfg_combine(v_cond, v_uncond, guidance)


def _step_noise(keys: jax.Array, steps: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.vmap(lambda k, i: jax.random.normal(jax.random.fold_in(k, i), shape, jnp.float32))(keys, steps)


def step(model: Denoiser, state: DenoiseState, config: DenoiseConfig) -> tuple[DenoiseState, Transition]:
    """Advance every unfinished request by one step: ``(state, Transition)``.

    Each request reads its own ``sigmas[step]``, so a batch may mix requests at different steps;
    a finished request (``step == N``) is left unchanged.
    """
    num_steps = state.sigmas.shape[1] - 1
    active = state.step < num_steps
    idx = jnp.minimum(state.step, num_steps - 1)
    sigma = jnp.take_along_axis(state.sigmas, idx[:, None], axis=1)[:, 0]
    sigma_next = jnp.take_along_axis(state.sigmas, idx[:, None] + 1, axis=1)[:, 0]
    x = state.x
    v = velocity(model, x, sigma, state.cond, config.guidance)
    sample = samplers.euler_step(x, v, sigma, sigma_next)
    mean, std, log_prob = sample, jnp.zeros_like(sigma), jnp.zeros_like(sigma)
    if config.sampler == "sde":
        sde = samplers.sde_step(
            x, v, sigma, sigma_next, _step_noise(state.key, idx, x.shape[1:]), noise_level=config.noise_level
        )
        lo, hi = config.sde_window or (0, num_steps)
        in_window = (idx >= lo) & (idx < hi)
        pick = lambda a, b: jnp.where(in_window.reshape(in_window.shape + (1,) * (a.ndim - 1)), a, b)
        sample, mean = pick(sde.sample, sample), pick(sde.mean, mean)
        std = jnp.where(in_window, sde.std.reshape(-1), 0.0)
        log_prob = jnp.where(in_window, sde.log_prob, 0.0)
    keep = active.reshape(active.shape + (1,) * (x.ndim - 1))
    record = Transition(
        x=x,
        sample=sample,
        mean=mean,
        std=std,
        log_prob=jnp.where(active, log_prob, 0.0),
        sigma=sigma,
        sigma_next=sigma_next,
        step=idx,
    )
    new_state = state._replace(x=jnp.where(keep, sample, x), step=state.step + active.astype(jnp.int32))
    return new_state, record


def run(
    model: Denoiser, state: DenoiseState, config: DenoiseConfig, *, capture: bool = False
) -> tuple[DenoiseState, Transition | None]:
    """Run every remaining step as fused ``lax.scan``s: ``(final state, trajectory or None)``.

    With ``capture`` the steps in ``config.captured_steps`` are recorded, stacked as
    ``Transition`` fields of shape ``(S, B, ...)``; the others run without a record.
    ``config`` and ``capture`` are static under ``jit``.
    """
    num_steps = state.sigmas.shape[1] - 1
    if num_steps != config.num_steps:
        raise ValueError(f"state has {num_steps} steps but config.num_steps is {config.num_steps}")

    def plain(s, _):
        return step(model, s, config)[0], None

    def recorded(s, _):
        return step(model, s, config)

    if not capture:
        state, _ = jax.lax.scan(plain, state, length=num_steps)
        return state, None
    lo, hi = config.captured_steps
    if lo:
        state, _ = jax.lax.scan(plain, state, length=lo)
    state, trajectory = jax.lax.scan(recorded, state, length=hi - lo)
    if hi < num_steps:
        state, _ = jax.lax.scan(plain, state, length=num_steps - hi)
    return state, trajectory


def trajectory_stats(
    model: Denoiser, trajectory: Transition, cond: Conditioning, config: DenoiseConfig
) -> tuple[jax.Array, jax.Array]:
    """Recompute a captured SDE trajectory under ``model``: ``(S, B)`` log-probs and ``(S, B, ...)`` SDE means.

    Teacher-forced: each step's stored ``(x, sample)`` pair is scored independently, ``vmap``ped
    over the time axis, so no re-scan is needed. With the rollout's weights this reproduces
    ``trajectory.log_prob`` and ``trajectory.mean`` (C2, PPO ratio == 1). Differentiable in ``model``.
    """
    if config.sampler != "sde":
        raise ValueError("trajectory_stats needs an SDE trajectory (config.sampler='sde')")

    def one(t: Transition) -> tuple[jax.Array, jax.Array]:
        v = velocity(model, t.x, t.sigma, cond, config.guidance)
        mean, _ = samplers.sde_mean(t.x, v, t.sigma, t.sigma_next, noise_level=config.noise_level)
        return samplers.sde_log_prob(t.x, v, t.sigma, t.sigma_next, t.sample, noise_level=config.noise_level), mean

    return jax.vmap(one)(trajectory)


def trajectory_log_probs(
    model: Denoiser, trajectory: Transition, cond: Conditioning, config: DenoiseConfig
) -> jax.Array:
    """The ``(S, B)`` log-probs of ``trajectory_stats``."""
    return trajectory_stats(model, trajectory, cond, config)[0]
