"""The generator half of policy-gradient RL: FlowGRPO's objective and update on a captured denoise trajectory.

``FlowGRPO`` trains a generator with it alone; ``UnifiedRL``, ``JointMultiExpertRL`` and ``SharedMoTRL``
train their generator with it next to a refiner (``jaxpipe.training.refine``). Per captured SDE step
``(s, b)`` of a rollout with group advantages ``A`` ``(B,)``:

    ℓ = max(-A·ρ, -A·clip(ρ, 1-ε, 1+ε)) + β · KL(μ_θ ‖ μ_ref),   ρ = exp(logp_θ - logp_rollout)

averaged over the captured steps (``losses.flow_grpo_loss``). The log-probs and SDE means are
recomputed by teacher-forcing the captured ``(x_t, x_next)`` pairs through the loop's bound
denoiser(s) (``rollout.generator_stats``), so at the rollout weights ``ρ == 1`` (C2).

KL convention (``FlowGRPOConfig.kl``, in ``methods.flow_grpo``): ``"exact"`` (default) is the exact Gaussian KL of the SDE
step, ``mean((μθ − μref)²) / (2σ_eff²)``; ``"flowgrpo"`` is the official FlowGRPO code's
``mean((μθ − μref)²) / (2·std_dev_t²)`` with ``std_dev_t = σ_eff / sqrt(|Δt|)``, i.e. exact · |Δt|.
A β ported from an official config therefore pulls ``1/|Δt|`` times harder under ``"exact"``
(10× at 10 uniform steps); divide it by that, or set ``kl="flowgrpo"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import optax
from flax import nnx

from jaxpipe._exports import deprecated
from jaxpipe.loops import denoise
from jaxpipe.training import losses, ppo, rollout, update

if TYPE_CHECKING:  # the settings live with the method (importing them here would be a cycle)
    from jaxpipe.training.methods.flow_grpo import FlowGRPOConfig

__all__ = ["KL_CONVENTIONS", "generator_loss", "generator_update"]

__getattr__ = deprecated(__name__, {"FlowGRPOConfig": ("jaxpipe.training.methods.flow_grpo", "FlowGRPOConfig")})

KL_CONVENTIONS = ("exact", "flowgrpo")
"""The accepted values of ``FlowGRPOConfig.kl`` (module docstring)."""


def generator_loss(
    models,
    reference,
    generated: rollout.Generated,
    advantages: jax.Array,
    config: FlowGRPOConfig,
    sampling: denoise.DenoiseConfig,
    reference_generated: rollout.Generated | None = None,
) -> tuple[jax.Array, dict]:
    """FlowGRPO's objective on a captured rollout: clipped PPO on every captured SDE step plus ``β ·`` KL.

    The log-probs and SDE means of the captured steps are recomputed under ``models``
    (``rollout.generator_stats``), the reference's means likewise (only when ``β > 0``), and
    ``losses.flow_grpo_loss`` combines them with the captured log-probs and ``σ_eff``.

    Args:
      models: the loop's bound denoiser(s) under the current weights (differentiable).
      reference: the frozen reference denoiser(s).
      generated: the rendered batch with its captured trajectory (fields ``(S, B, ...)``).
      advantages: ``(B,)`` group advantages.
      config: the FlowGRPO settings (``clip_eps``, ``beta``, ``kl``).
      sampling: the rollout's loop policy (its guidance the rollout's).
      reference_generated: the batch as the reference conditions on it (default ``generated``; a MoT
        recomputes its text conditioning under each weight set).

    Returns:
      ``(loss, metrics)`` of ``losses.flow_grpo_loss``.
    """
    log_prob, mean = rollout.generator_stats(models, generated, sampling, detach_uncond=config.detach_uncond)
    if config.beta > 0:
        ref_batch = generated if reference_generated is None else reference_generated
        _, mean_ref = rollout.generator_stats(reference, ref_batch, sampling)
        mean_ref = jax.lax.stop_gradient(mean_ref)
    else:
        mean_ref = jax.lax.stop_gradient(mean)
    traj = generated.trajectory
    mask = (advantages != 0)[None, :] if config.filter_zero_advantages else None
    return losses.flow_grpo_loss(
        log_prob,
        traj.log_prob,
        advantages,
        mean,
        mean_ref,
        traj.std,
        clip_eps=config.clip_eps,
        beta=config.beta,
        kl=config.kl,
        dt=traj.sigma_next - traj.sigma,
        mask=mask,
    )


def generator_update(
    tx: optax.GradientTransformation,
    models_of: Callable[[nnx.State], tuple],
    params: nnx.State,
    reference: nnx.State,
    opt_state: Any,
    generated: rollout.Generated,
    advantages: jax.Array,
    rows: jax.Array | None,
    key: jax.Array | None,
    config: FlowGRPOConfig,
    sampling: denoise.DenoiseConfig,
) -> update.Step:
    """One guarded optimiser step of the generator on one minibatch of a captured rollout.

    The minibatch is ``ppo.minibatch``'s: the rollout's ``rows`` and, when
    ``config.ppo.timestep_fraction < 1``, a random subset of each row's captured steps.

    Args:
      tx: the generator's optimiser.
      models_of: ``params -> the denoiser(s) the loop binds``.
      params: the trained parameters.
      reference: the reference parameters (built with ``models_of`` too).
      opt_state: the optimiser state.
      generated: the rendered batch with its captured trajectory.
      advantages: ``(B,)`` group advantages.
      rows: ``(b,)`` row indices of the minibatch (``None``: all, in order).
      key: the key that draws the steps kept (``None`` at fraction 1).
      config: the FlowGRPO settings.
      sampling: the rollout's loop policy.

    Returns:
      The ``update.Step`` (kept params and moments if the loss or gradient is not finite).
    """
    generated, advantages = ppo.minibatch(generated, advantages, rows, key, config.ppo)

    def loss(p):
        return generator_loss(models_of(p), models_of(reference), generated, advantages, config, sampling)

    return update.step(loss, tx, params, opt_state)
