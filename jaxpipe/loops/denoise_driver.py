"""How the engine and the program drive denoise loops: check, step, pad and batch them.

The loop itself (state, pure ``step``, fused ``run``) is ``jaxpipe.loops.denoise``; this module is
its ``LoopDriver`` (``jaxpipe.loops.registry``), also reachable as ``denoise.DRIVER``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.loops import common, denoise
from jaxpipe.loops.denoise import DenoiseConfig, DenoiseState

__all__ = ["Driver", "DRIVER"]


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
        return denoise.step(models, state, config)[0]

    def run(self, models, state: DenoiseState, config: DenoiseConfig, *, capture: bool = False):
        """``run``: ``(final state, stacked Transition or None)``.

        Args:
          models: the bound denoiser(s).
          state: the batch's state.
          config: the batch's config.
          capture: record the captured steps.
        """
        return denoise.run(models, state, config, capture=capture)

    def num_steps(self, config: DenoiseConfig) -> int:
        """The steps a request takes: ``config.num_steps``.

        Args:
          config: the request's config.
        """
        return config.num_steps

    def step_config(self, config: DenoiseConfig) -> DenoiseConfig:
        """The config a step compiles with (``denoise.step_config``: the guidance value neutralised).

        Args:
          config: a request's (or a batch's) config.
        """
        return denoise.step_config(config)

    def batch_key(self, config: DenoiseConfig) -> Hashable:
        """``config`` with ``num_steps`` and the guidance value neutralised: configs that differ only in
        those batch together (and step with this key as their config).

        Args:
          config: a request's config.
        """
        # step() reads num_steps only through the width of state.sigmas and each row's guidance scale
        # from the state (only whether CFG runs is static); the SDE window is validated per request, so
        # everything else must agree.
        neutral = denoise.step_config(config)
        return dataclasses.replace(neutral, num_steps=config.sde_window[1] if config.sde_window else 1)

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
        width = state.sigmas.shape[1] - 1
        return common.inert_rows(state, capacity)._replace(step=jnp.full((capacity,), width, jnp.int32))

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


_schedule_jit = jax.jit(denoise.schedule, static_argnums=0)
