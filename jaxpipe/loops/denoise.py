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
its window).

A loop may start part-way down the noise ladder (``start_sigma = σ₀ < 1``, e.g. a refine stage
that re-noises upsampled latents): its schedule is ``σ₀ · flow_sigmas(N, shift)`` and
``init_from_latents`` starts it from ``σ₀·ε + (1 - σ₀)·x0``. Under ``capture=True``
``run`` also returns the ``Transition`` of every captured step (the SDE window), stacked on a
leading time axis; serving compiles without it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import samplers
from jaxpipe.loops import policies

__all__ = [
    "Denoiser",
    "DenoiseConfig",
    "DenoiseState",
    "Transition",
    "Driver",
    "DRIVER",
    "init",
    "init_from_latents",
    "schedule",
    "step",
    "run",
    "velocity",
    "trajectory_stats",
    "trajectory_log_probs",
    "MAX_NOISE_LEVEL",
]


MAX_NOISE_LEVEL = 1.0
"""The largest SDE noise level η accepted (FlowGRPO uses 0.7; above 1 the SDE's std exceeds the ODE's step)."""


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


@dataclasses.dataclass(frozen=True)
class DenoiseConfig:
    """The static sampling policy of a denoise loop (hashable: static under ``jit``).

    Attributes:
      num_steps: Euler/SDE steps, a positive int.
      shift: the flow-shift of the schedule, > 0.
      sampler: ``"ode"`` (Euler) or ``"sde"`` (the FlowGRPO SDE inside ``sde_window``, Euler outside).
      noise_level: the SDE's η, in ``[0, MAX_NOISE_LEVEL]``.
      sde_window: ``(i, j)``: the SDE runs on steps ``[i, j)`` only (``None``: every step).
      guidance: the CFG scale, >= 0 (1 = no guidance, one forward).
      router: which bound denoiser each request uses at its noise level (``policies.Single()`` for a
        loop binding one).
      stg: the spatio-temporal guidance scale, >= 0 (0 = off; ``policies.STG``).
      stg_blocks: the DiT blocks whose self-attention the STG's perturbed forward skips (needed when
        ``stg > 0``).
      start_sigma: the first noise level σ₀ in (0, 1]: the schedule is ``σ₀ · flow_sigmas(num_steps,
        shift)``; below 1 the loop starts from latents (``init_from_latents``).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    num_steps: int = 8
    shift: float = 1.0
    sampler: str = "ode"
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    guidance: float = 1.0
    router: policies.Router = policies.Single()
    stg: float = 0.0
    stg_blocks: tuple[int, ...] = ()
    start_sigma: float = 1.0

    def __post_init__(self):
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps <= 0:
            raise ValueError(f"num_steps must be a positive int (got {self.num_steps!r})")
        if not math.isfinite(self.shift) or not self.shift > 0:
            raise ValueError(f"shift must be a finite number > 0 (got {self.shift})")
        if self.sampler not in ("ode", "sde"):
            raise ValueError(f"sampler must be 'ode' or 'sde' (got {self.sampler!r})")
        if not 0.0 <= self.noise_level <= MAX_NOISE_LEVEL:
            raise ValueError(f"noise_level (the SDE's η) must be in [0, {MAX_NOISE_LEVEL}] (got {self.noise_level})")
        if not math.isfinite(self.guidance) or self.guidance < 0:
            raise ValueError(f"guidance must be a finite number >= 0 (got {self.guidance})")
        if self.sde_window is not None:
            window = tuple(self.sde_window)
            if len(window) != 2 or not 0 <= window[0] < window[1] <= self.num_steps:
                raise ValueError(
                    f"sde_window must be (i, j) with 0 <= i < j <= num_steps={self.num_steps} (got {self.sde_window})"
                )
            object.__setattr__(self, "sde_window", window)
        if not math.isfinite(self.stg) or self.stg < 0:
            raise ValueError(f"stg (the spatio-temporal guidance scale) must be a finite number >= 0 (got {self.stg})")
        blocks = tuple(self.stg_blocks)
        if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or i < 0 for i in blocks):
            raise ValueError(f"stg_blocks must be non-negative DiT block indices (got {self.stg_blocks!r})")
        object.__setattr__(self, "stg_blocks", tuple(int(i) for i in blocks))
        if self.stg > 0 and not blocks:
            raise ValueError(
                f"stg={self.stg} needs stg_blocks: the blocks whose self-attention the perturbed forward skips"
            )
        if not math.isfinite(self.start_sigma) or not 0.0 < self.start_sigma <= 1.0:
            raise ValueError(f"start_sigma (the first noise level σ₀) must be in (0, 1] (got {self.start_sigma})")
        hash(self.router)

    @property
    def captured_steps(self) -> tuple[int, int]:
        """The ``[i, j)`` steps a rollout captures: the SDE window, or every step for ODE."""
        if self.sampler == "sde" and self.sde_window is not None:
            return self.sde_window
        return (0, self.num_steps)

    @property
    def guide(self) -> policies.Unguided | policies.CFG | policies.STG:
        """The guidance policy (``policies.guidance(self.guidance, self.stg, self.stg_blocks)``)."""
        return policies.guidance(self.guidance, self.stg, self.stg_blocks)

    @property
    def window(self) -> policies.SDEWindow:
        """The SDE window policy (every step when ``sde_window`` is ``None``)."""
        return policies.SDEWindow() if self.sde_window is None else policies.SDEWindow(*self.sde_window)

    def replace(self, **changes) -> DenoiseConfig:
        """A copy with ``changes`` applied (``dataclasses.replace``; the fields are validated again).

        Args:
          **changes: field name -> new value.

        Returns:
          The new ``DenoiseConfig``.
        """
        return dataclasses.replace(self, **changes)


class DenoiseState(NamedTuple):
    """Everything per request of a denoise loop (leading axis ``B`` on every leaf).

    Attributes:
      x: ``(B, *latent_shape)`` float32 latents.
      sigmas: ``(B, N+1)``: each request's noise schedule.
      step: ``(B,)`` int32: steps taken (``N``: finished).
      key: ``(B,)`` typed PRNG keys (step ``i`` draws its noise from ``fold_in(key, i)``).
      cond: the family's conditioning pytree.
      uncond: its unconditional counterpart for guidance, or ``None``.
    """

    x: jax.Array
    sigmas: jax.Array
    step: jax.Array
    key: jax.Array
    cond: Any
    uncond: Any = None


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


def _start_noise(
    keys: jax.Array, latent_shape: Sequence[int], cond: Any, config: DenoiseConfig, uncond: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Check a loop's start; ``(noise (B, *latent_shape), per-step keys (B,), sigmas (B, N+1))``.

    Each request key splits in two: the first draws the starting noise, the second is the step key.
    """
    keys = jnp.asarray(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.ndim != 1:
        raise ValueError(f"keys must be a (B,) array of typed PRNG keys (jax.random.key), got {keys.dtype}{keys.shape}")
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
    return noise, step_keys, sigmas


def init(
    keys: jax.Array, latent_shape: Sequence[int], cond: Any, config: DenoiseConfig, uncond: Any = None
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

    Returns:
      The ``DenoiseState`` at step 0: ``x`` ``(B, *latent_shape)`` float32 noise.

    Raises:
      ValueError: if ``start_sigma < 1`` (use ``init_from_latents``), ``keys`` are not ``(B,)`` typed keys,
        ``latent_shape`` is ``None``, or the guidance needs ``uncond`` and it is missing.
    """
    if config.start_sigma != 1.0:
        raise ValueError(
            f"start_sigma={config.start_sigma} starts part-way down the schedule, from latents: use init_from_latents"
        )
    x, step_keys, sigmas = _start_noise(keys, latent_shape, cond, config, uncond)
    b = x.shape[0]
    return DenoiseState(x=x, sigmas=sigmas, step=jnp.zeros((b,), jnp.int32), key=step_keys, cond=cond, uncond=uncond)


def init_from_latents(
    keys: jax.Array, x0: jax.Array, cond: Any, config: DenoiseConfig, uncond: Any = None
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

    Returns:
      The ``DenoiseState`` at step 0, ``x`` float32.

    Raises:
      ValueError: if ``x0`` is not ``(B, *latent_shape)`` with ``B = len(keys)``, or as ``init``.
    """
    x0 = jnp.asarray(x0)
    noise, step_keys, sigmas = _start_noise(keys, x0.shape[1:], cond, config, uncond)
    b = noise.shape[0]
    if x0.ndim < 2 or x0.shape[0] != b:
        raise ValueError(f"x0 must be (B, *latent_shape) with B = len(keys) = {b} (got {x0.shape})")
    s = jnp.float32(config.start_sigma)
    x = s * noise + (1.0 - s) * x0.astype(jnp.float32)
    return DenoiseState(x=x, sigmas=sigmas, step=jnp.zeros((b,), jnp.int32), key=step_keys, cond=cond, uncond=uncond)


def velocity(models, x: jax.Array, sigma: jax.Array, cond: Any, config: DenoiseConfig, uncond: Any = None) -> jax.Array:
    """The loop's velocity at ``(x, sigma)``: the routed denoiser(s) under the config's guidance.

    Args:
      models: the bound denoiser(s), one or a sequence in ``LoopSpec.binds`` order.
      x: latents ``(B, ...)``.
      sigma: ``(B,)`` noise levels.
      cond: the conditioning pytree (leading axis ``B``).
      config: the loop's config (its ``router`` and ``guide``).
      uncond: the unconditional conditioning, when the guidance needs it.

    Returns:
      The guided velocity, shaped like ``x``.

    Raises:
      ValueError: if the router's expert count differs from the number of ``models``, or the guidance
        needs ``uncond`` and it is missing.
    """
    return config.guide(policies.routed_velocity(_as_models(models), config.router), x, sigma, cond, uncond)


def _step_noise(keys: jax.Array, steps: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jax.vmap(lambda k, i: jax.random.normal(jax.random.fold_in(k, i), shape, jnp.float32))(keys, steps)


def step(models, state: DenoiseState, config: DenoiseConfig) -> tuple[DenoiseState, Transition]:
    """Advance every unfinished request by one step.

    Each request reads its own ``sigmas[step]``, so a batch may mix requests at different steps; a
    finished request (``step == N``) is left unchanged. With ``sampler="sde"`` a step inside the SDE
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
    idx = jnp.minimum(state.step, num_steps - 1)
    sigma = jnp.take_along_axis(state.sigmas, idx[:, None], axis=1)[:, 0]
    sigma_next = jnp.take_along_axis(state.sigmas, idx[:, None] + 1, axis=1)[:, 0]
    x = state.x
    v = velocity(models, x, sigma, state.cond, config, state.uncond)
    sample = samplers.euler_step(x, v, sigma, sigma_next)
    mean, std, log_prob = sample, jnp.zeros_like(sigma), jnp.zeros_like(sigma)
    if config.sampler == "sde":
        sde = samplers.sde_step(
            x, v, sigma, sigma_next, _step_noise(state.key, idx, x.shape[1:]), noise_level=config.noise_level
        )
        in_window = config.window.contains(idx, num_steps)
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
    models, trajectory: Transition, cond: Any, config: DenoiseConfig, uncond: Any = None, *, detach_uncond: bool = False
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
        v = guide(routed, t.x, t.sigma, cond, uncond)
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


# --------------------------------------------------------------------------------------------
# The driver: how the engine steps, pads and batches denoise loops
# --------------------------------------------------------------------------------------------


class Driver:
    """Drives ``denoise`` loops for the engine and the program (all functions pure, jittable).

    Mixed step counts share a batch by **padding the schedule**: a request with ``n`` steps gets
    the sigma row ``[schedule(config), 0, ..., 0]`` of a common width ``W + 1`` (``schedule``); its
    steps read exactly the sigmas they read unpadded, and the engine, which knows each request's
    ``n``, retires it after its ``n``-th step (``deactivate`` then sets its step index to ``W``, so
    the pure ``step`` leaves the row unchanged). A batch starts with ``batch_config`` (``num_steps
    = W``) and ``with_schedule`` puts each row's own sigmas in. Configs that differ only in
    ``num_steps`` batch together (``batch_key``).
    """

    kind = "denoise"

    def check(self, loop) -> None:
        """Raise ``ValueError`` unless ``loop`` (a ``LoopSpec``) can run: a ``DenoiseConfig``, a
        latent shape, and as many bound components as its router has experts."""
        if not isinstance(loop.config, DenoiseConfig):
            raise ValueError(f"a denoise loop's config must be a DenoiseConfig (got {type(loop.config).__name__})")
        if loop.latent_shape is None:
            raise ValueError("a denoise loop needs latent_shape (the per-request latent shape, e.g. (T, h, w, C))")
        experts = loop.config.router.num_experts
        if len(loop.binds) != experts:
            raise ValueError(
                f"its router chooses among {experts} denoiser(s) but it binds {len(loop.binds)}: {list(loop.binds)}"
            )

    def step(self, models, state: DenoiseState, config: DenoiseConfig) -> DenoiseState:
        """One ``step`` of the bound denoiser(s), without its record.

        Args:
          models: the bound denoiser(s).
          state: the batch's state.
          config: the batch's config.

        Returns:
          The new ``DenoiseState``.
        """
        return step(models, state, config)[0]

    def run(self, models, state: DenoiseState, config: DenoiseConfig, *, capture: bool = False):
        """``run``: ``(final state, stacked Transition or None)``.

        Args:
          models: the bound denoiser(s).
          state: the batch's state.
          config: the batch's config.
          capture: record the captured steps.
        """
        return run(models, state, config, capture=capture)

    def num_steps(self, config: DenoiseConfig) -> int:
        """The steps a request takes: ``config.num_steps``.

        Args:
          config: the request's config.
        """
        return config.num_steps

    def batch_key(self, config: DenoiseConfig) -> Hashable:
        """``config`` with ``num_steps`` neutralised: configs that differ only in ``num_steps`` batch together.

        Args:
          config: a request's config.
        """
        # step() reads num_steps only through the width of state.sigmas, and the SDE window is
        # validated per request, so everything but num_steps must agree.
        return dataclasses.replace(config, num_steps=config.sde_window[1] if config.sde_window else 1)

    def batch_config(self, config: DenoiseConfig, width: int) -> DenoiseConfig:
        """The config a batch of width ``width`` (>= every member's ``num_steps``) starts with."""
        return dataclasses.replace(config, num_steps=width)

    def schedule(self, config: DenoiseConfig, width: int) -> np.ndarray:
        """One request's sigma row ``(width + 1,)``: its own schedule, then zeros."""
        return _padded_sigmas(config.num_steps, config.shift, width, config.start_sigma)

    def with_schedule(self, state: DenoiseState, schedule: jax.Array) -> DenoiseState:
        """``state`` with each row's own sigmas.

        Args:
          state: the batch's state.
          schedule: ``(B, W + 1)``: the stacked rows of ``schedule``.

        Raises:
          ValueError: if ``schedule`` is not shaped like ``state.sigmas``.
        """
        if schedule.shape != state.sigmas.shape:
            raise ValueError(f"schedule {schedule.shape} does not match the state's sigmas {state.sigmas.shape}")
        return state._replace(sigmas=jnp.asarray(schedule, state.sigmas.dtype))

    def deactivate(self, state: DenoiseState, rows: jax.Array) -> DenoiseState:
        """``state`` with ``rows`` finished (step index ``W``), so a step leaves them unchanged.

        Args:
          state: the batch's state.
          rows: ``(B,)`` bool, the rows to retire.
        """
        width = state.sigmas.shape[1] - 1
        return state._replace(step=jnp.where(rows, width, state.step))

    def empty(self, state: DenoiseState, capacity: int) -> DenoiseState:
        """``capacity`` inert rows shaped like one row of ``state`` (finished: ``step == W``)."""
        rows = jax.tree.map(lambda a: jnp.zeros((capacity,) + a.shape[1:], a.dtype), state._replace(key=None))
        keys = jax.random.split(jax.random.key(0), capacity)  # never read: the rows are inactive
        width = state.sigmas.shape[1] - 1
        return rows._replace(key=keys, step=jnp.full((capacity,), width, jnp.int32))

    def latents(self, state: DenoiseState) -> jax.Array:
        """What a preview shows: the current latents ``x`` ``(B, *latent_shape)``.

        Args:
          state: the batch's state.
        """
        return state.x


DRIVER = Driver()


@functools.lru_cache(maxsize=256)
def _padded_sigmas(num_steps: int, shift: float, width: int, start_sigma: float = 1.0) -> np.ndarray:
    if width < num_steps:
        raise ValueError(f"cannot pad a {num_steps}-step schedule to {width} steps")
    row = np.zeros((width + 1,), np.float32)
    row[: num_steps + 1] = np.asarray(_schedule_jit(DenoiseConfig(num_steps, shift, start_sigma=start_sigma)))
    row.flags.writeable = False
    return row


_schedule_jit = jax.jit(schedule, static_argnums=0)
