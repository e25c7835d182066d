"""The denoise loop: a pure ``step``, a fused ``lax.scan`` runner and its engine driver.

The loop drives any model satisfying the ``Denoiser`` protocol, ``velocity(x, sigma, cond) ->
v``, where ``cond`` is a pytree its family defines (text K/V, a first frame, a packed context
...). A loop may bind several denoisers; the config's routing policy picks one per request and
step inside the same jitted step (``policies.routed_velocity``).

State is an explicit pytree holding everything per request: latents, per-request sigma
schedules and step indices, per-request PRNG keys and the conditioning (and, for guidance, the
unconditional input). The noise of step ``i`` of a request is drawn from ``fold_in(key, i)``, so
a request's bits do not depend on which other requests share its batch or on who drives the
loop (``run`` or the engine).

Sampling policies are static (``DenoiseConfig``) and compose as small pure pieces
(``jaxpipe.loops.policies``): routing, guidance (``guidance == 1`` runs one forward, otherwise
CFG; ``stg > 0`` adds spatio-temporal guidance) and the sampler (Euler, or the FlowGRPO SDE inside
its window). The guidance *scale* is per request: ``init`` puts ``config.guidance`` into the
state's ``(B,)`` ``guidance`` row, and a step whose config has ``guidance=None`` (``step_config``:
CFG on, the scale left to each row) reads it from there, so requests with different scales share
one batch and one compiled step. A config with a number applies that number to every row.

A loop may start part-way down the noise ladder (``start_sigma = σ₀ < 1``, e.g. a refine stage
that re-noises upsampled latents): its schedule is ``σ₀ · flow_sigmas(N, shift)`` and
``init_from_latents`` starts it from ``σ₀·ε + (1 - σ₀)·x0``. Under ``capture=True``
``run`` also returns the ``Transition`` of every captured step (the SDE window), stacked on a
leading time axis; serving compiles without it. The engine's ``Driver`` (batching, padding) is
``jaxpipe.loops.denoise_driver``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp

from jaxpipe import samplers
from jaxpipe.loops import common, policies
from jaxpipe.loops.denoise_config import MAX_NOISE_LEVEL, DenoiseConfig

__all__ = [
    "Denoiser",
    "DenoiseConfig",
    "DenoiseState",
    "Transition",
    "init",
    "init_from_latents",
    "schedule",
    "step_config",
    "step",
    "run",
    "velocity",
    "trajectory_stats",
    "trajectory_log_probs",
    "MAX_NOISE_LEVEL",
]


@runtime_checkable
class Denoiser(Protocol):
    """What the denoise loop drives: a flow-matching velocity network ``velocity(x, sigma, cond) -> v``."""

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: Any) -> jax.Array:
        """The predicted velocity ``v ≈ ε - x0`` at the noisy latents ``x``.

        Args:
          x: latents ``(B, ...)``.
          sigma: ``(B,)`` noise levels.
          cond: the conditioning, a pytree (leading axis ``B``) of the model family's own making.

        Returns:
          ``v``, float32, shaped like ``x``.
        """


class DenoiseState(NamedTuple):
    """Everything per request of a denoise loop (leading axis ``B`` on every leaf).

    Attributes:
      x: ``(B, *latent_shape)`` float32 latents.
      sigmas: ``(B, N+1)``: each request's noise schedule.
      step: ``(B,)`` int32: steps taken (``N``: finished).
      key: ``(B,)`` typed PRNG keys (step ``i`` draws its noise from ``fold_in(key, i)``).
      cond: the family's conditioning pytree.
      uncond: its unconditional counterpart for guidance, or ``None``.
      guidance: ``(B,)`` float32: each request's CFG scale, read by a step whose config has
        ``guidance=None`` (``step_config``); ``None`` in a state built by hand.
    """

    x: jax.Array
    sigmas: jax.Array
    step: jax.Array
    key: jax.Array
    cond: Any
    uncond: Any = None
    guidance: jax.Array | None = None


class Transition(NamedTuple):
    """One step of a trajectory (under ``run`` each field gains a leading time axis ``S``).

    Attributes:
      x: ``(B, ...)``: the step's input latents.
      sample: ``(B, ...)``: its output.
      mean: ``(B, ...)``: the SDE Gaussian's mean (``== sample`` for an ODE step).
      std: ``(B,)``: the SDE's ``σ_eff`` (0 for an ODE step).
      log_prob: ``(B,)``: the sample's log-prob (``samplers.sde_step``; 0 for ODE steps and finished rows).
      sigma: ``(B,)``: the step's noise level.
      sigma_next: ``(B,)``: the level it steps to.
      step: ``(B,)`` int32: the step's index.
    """

    x: jax.Array
    sample: jax.Array
    mean: jax.Array
    std: jax.Array
    log_prob: jax.Array
    sigma: jax.Array
    sigma_next: jax.Array
    step: jax.Array


def _as_models(models) -> tuple:
    return tuple(models) if isinstance(models, (tuple, list)) else (models,)


def schedule(config: DenoiseConfig) -> jax.Array:
    """The loop's noise schedule ``start_sigma · flow_sigmas(num_steps, shift)``, from σ₀ down to 0.

    Args:
      config: the loop's config.

    Returns:
      ``(num_steps + 1,)`` float32 sigmas.
    """
    sigmas = samplers.flow_sigmas(config.num_steps, config.shift)
    # σ₀ = 1 multiplies by nothing, so the full schedule keeps its bits exactly.
    return sigmas if config.start_sigma == 1.0 else jnp.float32(config.start_sigma) * sigmas


def _start(
    keys: jax.Array, latent_shape: Sequence[int], cond: Any, config: DenoiseConfig, uncond: Any, guidance
) -> tuple[jax.Array, DenoiseState]:
    """Check a loop's start: ``(noise (B, *latent_shape), the state at step 0 with x = None)``.

    Each request key splits in two: the first draws the starting noise, the second is the step key.
    """
    keys = common.check_keys(keys)
    if latent_shape is None:
        raise ValueError("a denoise loop needs a per-request latent_shape (LoopSpec.latent_shape)")
    b = keys.shape[0]
    chex.assert_tree_shape_prefix(cond, (b,))
    if config.guide.needs_uncond and uncond is None:
        raise ValueError(f"guidance={config.guidance} needs the unconditional input (uncond)")
    if uncond is not None:
        chex.assert_trees_all_equal_structs(cond, uncond)
        chex.assert_tree_shape_prefix(uncond, (b,))
    init_keys, step_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    noise = jax.vmap(lambda k: jax.random.normal(k, tuple(latent_shape), jnp.float32))(init_keys)
    sigmas = jnp.broadcast_to(schedule(config), (b, config.num_steps + 1))
    if guidance is None and config.guidance is None:
        raise ValueError("config.guidance is None (each row's own scale): pass every request's guidance")
    scales = common.row_scales(config.guidance if guidance is None else guidance, b)
    state = DenoiseState(None, sigmas, jnp.zeros((b,), jnp.int32), step_keys, cond, uncond, scales)
    return noise, state


def init(
    keys: jax.Array,
    latent_shape: Sequence[int],
    cond: Any,
    config: DenoiseConfig,
    uncond: Any = None,
    *,
    guidance: jax.Array | float | None = None,
) -> DenoiseState:
    """Start ``B = len(keys)`` requests from pure noise.

    Each request key splits in two: the first draws the starting noise, the second becomes the step
    key, so the same key gives the same request whatever else is in the batch.

    Args:
      keys: ``(B,)`` typed PRNG keys (e.g. ``jax.random.key(seed)`` stacked), one per request.
      latent_shape: the per-request latent shape (e.g. ``(T, h, w, C)``).
      cond: the conditioning, a pytree whose leaves all have leading axis ``B``.
      config: the loop's config, with ``start_sigma == 1``.
      uncond: the unconditional conditioning (same structure as ``cond``), required when the config's
        guidance needs it.
      guidance: each request's CFG scale, a number or ``(B,)`` (``None``: ``config.guidance``, which
        must then be a number).

    Returns:
      The ``DenoiseState`` at step 0: ``x`` ``(B, *latent_shape)`` float32 noise, ``guidance`` ``(B,)``.

    Raises:
      ValueError: if ``start_sigma < 1`` (use ``init_from_latents``), ``keys`` are not ``(B,)`` typed keys,
        ``latent_shape`` is ``None``, or the guidance needs ``uncond`` and it is missing.
    """
    if config.start_sigma != 1.0:
        raise ValueError(
            f"start_sigma={config.start_sigma} starts part-way down the schedule, from latents: use init_from_latents"
        )
    noise, state = _start(keys, latent_shape, cond, config, uncond, guidance)
    return state._replace(x=noise)


def init_from_latents(
    keys: jax.Array,
    x0: jax.Array,
    cond: Any,
    config: DenoiseConfig,
    uncond: Any = None,
    *,
    guidance: jax.Array | float | None = None,
) -> DenoiseState:
    """Start ``B = len(keys)`` requests from clean latents re-noised to σ₀ = ``config.start_sigma``.

    ``x = σ₀·ε + (1 - σ₀)·x0`` (the flow-matching interpolant at σ₀), with ``ε`` drawn from each request
    key exactly as ``init`` draws its noise (and the step keys likewise), so at σ₀ = 1 this is ``init``.
    The schedule is ``schedule(config)``, from σ₀.

    Args:
      keys: ``(B,)`` typed PRNG keys, one per request.
      x0: clean latents ``(B, *latent_shape)``.
      cond: the conditioning, as in ``init``.
      config: the loop's config.
      uncond: the unconditional conditioning, as in ``init``.
      guidance: each request's CFG scale, as in ``init``.

    Returns:
      The ``DenoiseState`` at step 0, ``x`` float32.

    Raises:
      ValueError: if ``x0`` is not ``(B, *latent_shape)`` with ``B = len(keys)``, or as ``init``.
    """
    x0 = jnp.asarray(x0)
    noise, state = _start(keys, x0.shape[1:], cond, config, uncond, guidance)
    b = noise.shape[0]
    if x0.ndim < 2 or x0.shape[0] != b:
        raise ValueError(f"x0 must be (B, *latent_shape) with B = len(keys) = {b} (got {x0.shape})")
    s = jnp.float32(config.start_sigma)
    return state._replace(x=s * noise + (1.0 - s) * x0.astype(jnp.float32))


def velocity(
    models,
    x: jax.Array,
    sigma: jax.Array,
    cond: Any,
    config: DenoiseConfig,
    uncond: Any = None,
    guidance: jax.Array | float | None = None,
) -> jax.Array:
    """The loop's velocity at ``(x, sigma)``: the routed denoiser(s) under the config's guidance.

    Args:
      models: the bound denoiser(s), one or a sequence in ``LoopSpec.binds`` order.
      x: latents ``(B, ...)``.
      sigma: ``(B,)`` noise levels.
      cond: the conditioning pytree (leading axis ``B``).
      config: the loop's config (its ``router`` and ``guide``).
      uncond: the unconditional conditioning, when the guidance needs it.
      guidance: the rows' CFG scales ``(B,)``, used when ``config.guidance`` is ``None`` (a number there
        applies to every row).

    Returns:
      The guided velocity, shaped like ``x``.

    Raises:
      ValueError: if the router's expert count differs from the number of ``models``, the guidance
        needs ``uncond`` and it is missing, or ``config.guidance`` and ``guidance`` are both ``None``
        under CFG.
    """
    routed = policies.routed_velocity(_as_models(models), config.router)
    return config.guide(routed, x, sigma, cond, uncond, _scale(config, guidance))


def _scale(config: DenoiseConfig, rows):
    if config.guidance is not None:
        return None  # the config's own number, a constant of the compiled step
    if rows is None and config.guide.needs_uncond:
        raise ValueError("config.guidance is None (each row's own scale) but the state carries no guidance")
    return rows


def step_config(config: DenoiseConfig) -> DenoiseConfig:
    """The config the engine steps with: ``config`` with its guidance value left to each row.

    With ``guidance=None`` a step reads each row's scale from ``DenoiseState.guidance`` (which ``init``
    filled from the request's own config) and the config says only whether CFG runs, so configs that
    differ only in their scale give one ``step_config``: one compiled step, one batch.

    Args:
      config: a request's config.

    Returns:
      ``config`` itself without CFG (``guidance == 1``) or already per row (``None``); otherwise
      ``config`` with ``guidance=None``.
    """
    return config if config.guidance in (1.0, None) else dataclasses.replace(config, guidance=None)


def step(models, state: DenoiseState, config: DenoiseConfig) -> tuple[DenoiseState, Transition]:
    """Advance every unfinished request by one step.

    Each request reads its own ``sigmas[step]`` and guidance scale, so a batch may mix requests at
    different steps and scales; a finished request (``step == N``) is left unchanged. With ``sampler="sde"`` a step inside the SDE
    window takes ``samplers.sde_step`` with noise ``normal(fold_in(key, step))``; every other step is
    the Euler step.

    Args:
      models: the bound denoiser(s).
      state: the requests' state.
      config: the loop's config.

    Returns:
      ``(new state, Transition)`` of this step, fields ``(B, ...)``.
    """
    num_steps = state.sigmas.shape[1] - 1
    active = state.step < num_steps
    idx, sigma, sigma_next = common.row_sigmas(state.sigmas, state.step)
    x = state.x
    v = velocity(models, x, sigma, state.cond, config, state.uncond, state.guidance)
    sample = samplers.euler_step(x, v, sigma, sigma_next)
    mean, std, log_prob = sample, jnp.zeros_like(sigma), jnp.zeros_like(sigma)
    if config.sampler == "sde":
        sde = samplers.sde_step(
            x, v, sigma, sigma_next, common.fold_in_normal(state.key, idx, x.shape[1:]), noise_level=config.noise_level
        )
        in_window = config.window.contains(idx, num_steps)
        pick = lambda a, b: jnp.where(common.rows_like(in_window, a), a, b)
        sample, mean = pick(sde.sample, sample), pick(sde.mean, mean)
        std = jnp.where(in_window, sde.std.reshape(-1), 0.0)
        log_prob = jnp.where(in_window, sde.log_prob, 0.0)
    keep = common.rows_like(active, x)
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
    models, state: DenoiseState, config: DenoiseConfig, *, capture: bool = False
) -> tuple[DenoiseState, Transition | None]:
    """Run all ``num_steps`` steps as fused ``lax.scan`` loops.

    Args:
      models: the bound denoiser(s).
      state: the requests' state (e.g. from ``init``).
      config: the loop's config (static under ``jit``).
      capture: record the steps in ``config.captured_steps`` (static under ``jit``); the others run
        without a record.

    Returns:
      ``(final state, trajectory)``: with ``capture`` the recorded steps' ``Transition`` fields
      stacked ``(S, B, ...)``; otherwise ``None``.

    Raises:
      ValueError: if ``state`` has another step count than ``config.num_steps``.
    """
    num_steps = state.sigmas.shape[1] - 1
    if num_steps != config.num_steps:
        raise ValueError(f"state has {num_steps} steps but config.num_steps is {config.num_steps}")

    def plain(s, _):
        return step(models, s, config)[0], None

    def recorded(s, _):
        return step(models, s, config)

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
    models,
    trajectory: Transition,
    cond: Any,
    config: DenoiseConfig,
    uncond: Any = None,
    *,
    detach_uncond: bool = False,
    guidance: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Recompute a captured SDE trajectory under ``models``: its log-probs and SDE means.

    Teacher-forced: each step's stored ``(x, sample)`` pair is scored independently
    (``samplers.sde_log_prob`` / ``samplers.sde_mean`` at the velocity of ``models``), ``vmap``ped
    over the time axis, so no re-scan is needed. With the rollout's weights this reproduces
    ``trajectory.log_prob`` and ``trajectory.mean`` (C2, PPO ratio == 1). Differentiable in ``models``.

    Args:
      models: the bound denoiser(s).
      trajectory: the captured steps, ``Transition`` fields ``(S, B, ...)``.
      cond: the conditioning the rollout used (leading axis ``B``).
      config: the rollout's loop config, with ``sampler="sde"``.
      uncond: the unconditional conditioning, when the guidance needs it.
      detach_uncond: stop the gradient through CFG's unconditional branch (the values are unchanged).
      guidance: the rollout's per-row CFG scales ``(B,)``, used when ``config.guidance`` is ``None``.

    Returns:
      ``(log_probs (S, B), means (S, B, ...))``, float32.

    Raises:
      ValueError: if ``config.sampler`` is not ``"sde"``, or ``detach_uncond`` under a guidance other
        than plain CFG.
    """
    if config.sampler != "sde":
        raise ValueError("trajectory_stats needs an SDE trajectory (config.sampler='sde')")
    guide = config.guide
    if detach_uncond and isinstance(guide, policies.CFG):
        guide = dataclasses.replace(guide, detach_uncond=True)
    elif detach_uncond and not isinstance(guide, policies.Unguided):
        raise ValueError(f"detach_uncond applies to classifier-free guidance, not {type(guide).__name__}")
    routed = policies.routed_velocity(_as_models(models), config.router)

    def one(t: Transition) -> tuple[jax.Array, jax.Array]:
        v = guide(routed, t.x, t.sigma, cond, uncond, _scale(config, guidance))
        mean, _ = samplers.sde_mean(t.x, v, t.sigma, t.sigma_next, noise_level=config.noise_level)
        return samplers.sde_log_prob(t.x, v, t.sigma, t.sigma_next, t.sample, noise_level=config.noise_level), mean

    return jax.vmap(one)(trajectory)


def trajectory_log_probs(
    models, trajectory: Transition, cond: Any, config: DenoiseConfig, uncond: Any = None
) -> jax.Array:
    """The ``(S, B)`` log-probs of ``trajectory_stats`` (same arguments).

    Args:
      models: the bound denoiser(s).
      trajectory: the captured steps, ``Transition`` fields ``(S, B, ...)``.
      cond: the conditioning the rollout used.
      config: the rollout's loop config, with ``sampler="sde"``.
      uncond: the unconditional conditioning, when the guidance needs it.

    Returns:
      ``(S, B)`` float32 log-probs.
    """
    return trajectory_stats(models, trajectory, cond, config, uncond)[0]


def __getattr__(name: str):
    # The engine's driver builds on this module's loop, so it lives in its own module and is
    # reached here lazily (``denoise.DRIVER`` / ``denoise.Driver`` keep working).
    if name in ("Driver", "DRIVER"):
        from jaxpipe.loops import denoise_driver

        return getattr(denoise_driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
