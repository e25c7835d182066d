"""``DiffusionNFT``: likelihood-free online RL of a text-to-image card on the forward process (Zheng et al. 2025).

One ``step``: the OLD policy ``θ_old`` renders K samples per prompt with the card's own program
(ODE by default, guidance 1: no log-probs are needed); the reward gives group advantages ``A``
``(B,)``, mapped to optimality weights ``r = 0.5 + 0.5 · clip(A / adv_clip, −1, 1)`` in [0, 1].
Each clean sample ``x0`` is re-noised, ``x_σ = (1−σ)·x0 + σ·ε`` (σ from ``config.noise``, fresh ε;
``samplers.noised``), and the velocity ``v_θ(x_σ)`` is regressed onto the flow target
``v = ε − x0`` through two implicit policies:

    v⁺ = v_old + β·(v_θ − v_old) = (1−β)·v_old + β·v_θ
    v⁻ = v_old − β·(v_θ − v_old) = (1+β)·v_old − β·v_θ
    L  = mean_rows( r·mean(‖v⁺ − v‖²) + (1−r)·mean(‖v⁻ − v‖²) )

with ``v_old`` the old policy's velocity (stop-gradient) under the same conditioning. Written as
offsets from ``v_old``, ``θ == θ_old`` gives ``v⁺ == v⁻ == v_old`` exactly, so at ``r = 0.5`` (a
constant reward) the gradient is exactly 0 and the weights stay bit-identical.

After each update the old policy follows the trained one by an EMA,
``θ_old ← θ_old + (1−d)·(θ − θ_old)`` (= ``d·θ_old + (1−d)·θ``, written so equal weights stay
bit-identical), with the decay ramping linearly over the update count ``n`` (before this update):
``d(n) = ema.start + (ema.end − ema.start) · min(n / ema.ramp_steps, 1)`` (``ramp_steps = 0``:
``ema.end`` from the start). ``d = 0`` is on-policy (the old policy is the current one each step).

Trained components: the denoiser(s) the program's denoise loop binds (σ covers (0, 1), so every
expert of a routed loop is reached). The conditioning is the rollout's, so the text encoder stays
frozen. Networks run in the card's own dtype (no bfloat16 master-weight mode here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import samplers
from jaxpipe.card import Card
from jaxpipe.loops import denoise
from jaxpipe.nn.lora import LoRAConfig
from jaxpipe.program import Program
from jaxpipe.program import settings as loop_settings
from jaxpipe.prompts import Prompts
from jaxpipe.rewards import Reward
from jaxpipe.training import rollout, update
from jaxpipe.training.denoiser import GENERATOR, DenoiserMethod
from jaxpipe.training.noise import NoiseLevels
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling
from jaxpipe.training.trainer import TrainState

__all__ = ["EMA", "DiffusionNFTConfig", "NFTRollout", "DiffusionNFT", "nft_loss", "optimality_weight", "ema_decay"]


@dataclasses.dataclass(frozen=True)
class EMA:
    """The old policy's EMA decay: ``start`` at the first update, ramping linearly to ``end`` over ``ramp_steps``.

    Attributes:
      start: the decay at the first update, in [0, 1].
      end: the decay after the ramp, in [0, 1].
      ramp_steps: updates the ramp takes, >= 0 (0: ``end`` from the start).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    start: float = 0.0
    end: float = 0.5
    ramp_steps: int = 100

    def __post_init__(self):
        if not (0.0 <= self.start <= 1.0 and 0.0 <= self.end <= 1.0) or self.ramp_steps < 0:
            raise ValueError(
                f"the EMA's start and end must be in [0, 1] and ramp_steps >= 0 (got {self.start}, {self.end}, "
                f"{self.ramp_steps})"
            )


@dataclasses.dataclass(frozen=True)
class DiffusionNFTConfig:
    """Settings of a DiffusionNFT run (hashable: static under ``jit``).

    Attributes:
      group: K samples per prompt (>= 2) and ``adv_clip``, also the scale of ``r = 0.5 + 0.5·A/adv_clip``.
      sampling: the old policy's rollout (ODE at guidance 1 by default).
      beta: the implicit policies' step ``β ∈ (0, 1]``.
      ema: the old policy's EMA decay schedule (module docstring).
      noise: how the update's σ is drawn (uniform on [0.02, 0.98] by default).
      optimizer: clipped Adam, lr 1e-4 by default.
      lora: train LoRA adapters on the denoiser(s) instead of all their weights (``None``: full training);
        the old policy is then an EMA of the adapters (``jaxpipe.nn.lora``).

    Raises:
      ValueError: on construction, if K < 2 or ``beta`` is not in (0, 1].
    """

    group: Group = Group(adv_clip=2.0)
    sampling: Sampling = Sampling()
    beta: float = 1.0
    ema: EMA = EMA()
    noise: NoiseLevels = NoiseLevels()
    optimizer: Optimizer = Optimizer(1e-4)
    lora: LoRAConfig | None = None

    def __post_init__(self):
        self.group.check_relative()
        if not (math.isfinite(self.beta) and 0.0 < self.beta <= 1.0):
            raise ValueError(f"beta must be in (0, 1] (got {self.beta}): it sets v± = v_old ± β·(v_θ − v_old)")


class NFTRollout(NamedTuple):
    """One group rollout from the old policy (B = P·K rows, row ``p·K + k`` is sample k of prompt p).

    Attributes:
      images: the rendered artifacts (images or videos).
      latents: ``(B, *latent)`` the clean latents ``x0``.
      cond: the loop's conditioning.
      rewards: ``(B,)`` rewards.
      parts: ``{name: (B,)}`` their parts.
      advantages: ``(B,)`` group advantages.
      weights: ``(B,)`` the optimality weights ``r``.
    """

    images: jax.Array
    latents: jax.Array
    cond: Any
    rewards: jax.Array
    parts: dict[str, jax.Array]
    advantages: jax.Array
    weights: jax.Array


def optimality_weight(advantages: jax.Array, adv_clip: float) -> jax.Array:
    """The optimality weights ``r = 0.5 + 0.5 · clip(A / adv_clip, −1, 1)``, in [0, 1].

    Args:
      advantages: the group advantages ``A``.
      adv_clip: the advantage clip, > 0.

    Returns:
      ``r``, shaped like ``advantages``.
    """
    return 0.5 + 0.5 * jnp.clip(advantages / adv_clip, -1.0, 1.0)


def ema_decay(ema: EMA, step: jax.Array) -> jax.Array:
    """The old policy's EMA decay at update ``step``: ``start + (end − start) · min(step / ramp_steps, 1)``.

    Args:
      ema: the decay schedule.
      step: the number of updates before this one (an int32 scalar, 0-based).

    Returns:
      The float32 decay ``d`` (``ema.end`` whatever the step when ``ramp_steps == 0``).
    """
    if ema.ramp_steps == 0:
        return jnp.asarray(ema.end, jnp.float32)
    frac = jnp.minimum(step.astype(jnp.float32) / ema.ramp_steps, 1.0)
    return ema.start + (ema.end - ema.start) * frac


def nft_loss(
    v_theta: jax.Array, v_old: jax.Array, target: jax.Array, r: jax.Array, beta: float
) -> tuple[jax.Array, dict]:
    """The NFT objective ``mean_rows(r·mean(‖v⁺ − v‖²) + (1−r)·mean(‖v⁻ − v‖²))``.

    Here ``v± = v_old ± β·(v_θ − v_old)``; ``v_old`` and ``r`` are constants (stop-gradient); per row the
    squared errors of ``v±`` to the target are averaged over the latent dims.

    Args:
      v_theta: ``(B, ...)`` the current policy's velocities (differentiable).
      v_old: ``(B, ...)`` the old policy's velocities.
      target: ``(B, ...)`` the flow target ``ε − x0``.
      r: ``(B,)`` optimality weights in [0, 1].
      beta: the implicit policies' step β.

    Returns:
      ``(loss, metrics)``: the scalar loss and ``loss``, ``loss_pos`` / ``loss_neg`` (the mean errors of
      ``v⁺`` / ``v⁻``).
    """
    v_old = jax.lax.stop_gradient(v_old)
    delta = beta * (v_theta - v_old)
    axes = tuple(range(1, v_theta.ndim))
    pos = jnp.mean((v_old + delta - target) ** 2, axis=axes)
    neg = jnp.mean((v_old - delta - target) ** 2, axis=axes)
    r = jax.lax.stop_gradient(r)
    loss = jnp.mean(r * pos + (1.0 - r) * neg)
    return loss, {"loss": loss, "loss_pos": jnp.mean(pos), "loss_neg": jnp.mean(neg)}


class DiffusionNFT(DenoiserMethod):
    """DiffusionNFT on a text-to-image card: ``init(key)``, jitted ``render`` / ``rollout`` / ``update`` / ``step``.

    A batch is a ``jaxpipe.prompts.Prompts``; each prompt is sampled ``config.group.size`` times by
    the old policy and ``reward(artifacts, prompts)`` scores the samples. The card renders through
    its family's program (or ``program``), which must run exactly one denoise loop. Role ``"old"``:
    the old policy's denoiser(s) (``role_card``; ``weight_sync.sync`` publishes it).

    Args:
      card: a text-to-image card.
      reward: the reward.
      config: the settings.
      program: the program to render with (default: the family's).
    """

    def __init__(
        self,
        card: Card,
        reward: Reward,
        config: DiffusionNFTConfig = DiffusionNFTConfig(),
        *,
        program: Program | None = None,
    ):
        self._setup(card, reward, config, program)
        self.artifact = rollout.rendered_artifact(self.program)
        self.regression = self.loop.config.replace(guidance=1.0, stg=0.0)  # the plain velocity, as Finetune regresses
        self.roles = {"old": tuple(self.denoisers)}
        self._jit(card, reward, config, program)
        self.render = jax.jit(self._render)

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The old policy: a copy of the trained denoiser(s), followed by an EMA."""
        return {"old": params[GENERATOR]}

    def old_card(self, state: TrainState) -> Card:
        """The card with the old policy's denoiser weights (the one the rollouts sample)."""
        return self.role_card(state, "old")

    def _render(self, params: nnx.State, frozen: nnx.State, batch: Prompts, key: jax.Array):
        """The program under denoiser weights ``params`` on the batch repeated K times: ``(images, clean
        latents x0, cond, prompts (B rows), artifacts)``; row keys ``split(key, B)``."""
        card = self.rollout_card({GENERATOR: params}, frozen)
        settings = loop_settings(**{self.loop.id: self.sampling})
        run = rollout.render(card, self.program, settings, batch, key, group_size=self.config.group.size)
        final, _ = run.execution.captures[self.loop.id]
        return (
            run.execution.artifacts[self.artifact],
            final.x,
            final.cond,
            run.prompts,
            rollout.artifacts_of(run.execution, self.program),
        )

    def _rollout(self, state: TrainState, batch: Prompts, key: jax.Array) -> NFTRollout:
        images, x0, cond, rows, artifacts = self._render(state.copies["old"], state.frozen, batch, key)
        scored = rollout.score_rollout(self.reward, artifacts, rows, self.config.group)
        weights = optimality_weight(scored.advantages, self.config.group.adv_clip)
        return NFTRollout(images, x0, cond, scored.rewards, scored.parts, scored.advantages, weights)

    def reconstruct(self, state: TrainState, batch: Prompts, key: jax.Array) -> jax.Array:
        """The clean latents ``(B, *latent)`` the CURRENT weights render from the rollout's keys (C2: with
        ``old == params`` they equal the rollout's ``latents`` bit for bit)."""
        return self.render(state.params[GENERATOR], state.frozen, batch, key)[1]

    def loss(self, params: nnx.State, state: TrainState, ro: NFTRollout, key: jax.Array) -> tuple[jax.Array, dict]:
        """The NFT loss of ``params`` on a rollout's re-noised clean samples (pure; differentiable in ``params``)."""
        x0 = jax.lax.stop_gradient(ro.latents)
        k_sigma, k_noise = jax.random.split(key)
        sigma = self.config.noise.draw(k_sigma, x0.shape[0])
        noise = jax.random.normal(k_noise, x0.shape)
        x_sigma = samplers.noised(x0, noise, sigma)
        v_theta = denoise.velocity(self.models_of(state.frozen)(params), x_sigma, sigma, ro.cond, self.regression)
        v_old = denoise.velocity(
            self.models_of(state.frozen)(state.copies["old"]), x_sigma, sigma, ro.cond, self.regression
        )
        return nft_loss(v_theta, v_old, noise - x0, ro.weights, self.config.beta)

    def _update(self, state: TrainState, ro: NFTRollout, key: jax.Array) -> tuple[TrainState, dict]:
        """One guarded optimiser step, then the old policy's EMA (kept too when the step is skipped)."""
        out = update.step(self.loss, self.tx, state.params[GENERATOR], state.opt_state[GENERATOR], state, ro, key)
        d = ema_decay(self.config.ema, state.step)
        old = state.copies["old"]
        followed = jax.tree.map(lambda o, p: o + (1.0 - d).astype(o.dtype) * (p - o), old, out.params)
        old = update.guard(out.finite, followed, old)
        new = state._replace(
            params={GENERATOR: out.params},
            opt_state={GENERATOR: out.opt_state},
            copies={"old": old},
            step=state.step + 1,
        )
        return new, {
            **out.aux,
            "grad_norm": out.grad_norm,
            "ema_decay": d,
            "r_mean": jnp.mean(ro.weights),
            "skipped": update.skipped(out.finite),
        }

    def rollout_metrics(self, ro: NFTRollout) -> dict[str, jax.Array]:
        """The rollout's reward metrics (``rollout.reward_metrics``)."""
        return rollout.reward_metrics(ro.rewards, ro.parts)
