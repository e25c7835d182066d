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

The official code's form (``weighting="adaptive"``, ``nft_adaptive_loss``) measures the two errors in
x0 space, ``x̂0± = x_σ − σ·v±``, each divided by its own detached mean absolute error, scaled by
``adv_clip / β``, plus ``kl_beta · mean((v_θ − v_ref)²)`` to the reference (the weights before
training: for LoRA, the base with its adapters at B = 0); ``schedule_levels = k`` trains each sample
at ``k`` distinct noise levels of the rollout's own sampling schedule (the official code: 9 of 10),
averaging their losses into one update.

Trained components: the denoiser(s) the program's denoise loop binds (σ covers (0, 1), so every
expert of a routed loop is reached). The conditioning is the rollout's, so the text encoder stays
frozen. Networks run in the card's own dtype (no bfloat16 master-weight mode here).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import samplers, validate
from jaxpipe.card import Card
from jaxpipe.loops import denoise
from jaxpipe.nn.lora import LoRAConfig
from jaxpipe.program import Program
from jaxpipe.program import settings as loop_settings
from jaxpipe.prompts import Prompts
from jaxpipe.rewards import Reward
from jaxpipe.training import rollout, update
from jaxpipe.training.denoiser import GENERATOR, DenoiserMethod
from jaxpipe.training.ema import EMA, EvalEMA
from jaxpipe.training.noise import NoiseLevels
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling
from jaxpipe.training.trainer import TrainState

if TYPE_CHECKING:  # the command line's flag groups, for the builders below (no import at run time)
    from jaxpipe.training.methods.flags import LoRAFlags, NFTFlags, RunSettings

__all__ = [
    "config_from_flags",
    "DiffusionNFTConfig",
    "NFTRollout",
    "DiffusionNFT",
    "WEIGHTINGS",
    "nft_loss",
    "nft_adaptive_loss",
    "velocity_kl",
    "optimality_weight",
    "ema_decay",
]

WEIGHTINGS = ("none", "adaptive")
"""The accepted values of ``DiffusionNFTConfig.weighting``: the plain velocity-space loss (``nft_loss``) or
the official code's adaptively weighted x0-space loss (``nft_adaptive_loss``)."""


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
      weighting: ``"none"`` (``nft_loss``) or ``"adaptive"`` (the official code's, ``nft_adaptive_loss``).
      kl_beta: the weight of ``mean((v_θ − v_ref)²)`` to the reference (the weights before training),
        >= 0 (the official code: 1e-4); a reference copy is kept only when > 0.
      schedule_levels: 0 — one noise level per sample from ``noise``; ``k >= 1`` — ``k`` distinct levels
        of the rollout's sampling schedule per sample (drawn per sample), their losses averaged.
      eval_ema: keep an evaluation average of the trained weights (``training.eval_ema``; ``None``: none).

    Raises:
      ValueError: on construction, if K < 2, ``beta`` is not in (0, 1] or a new field is out of range.
    """

    group: Group = Group(adv_clip=2.0)
    sampling: Sampling = Sampling()
    beta: float = 1.0
    ema: EMA = EMA()
    noise: NoiseLevels = NoiseLevels()
    optimizer: Optimizer = Optimizer(1e-4)
    lora: LoRAConfig | None = None
    weighting: str = "none"
    kl_beta: float = 0.0
    schedule_levels: int = 0
    eval_ema: EvalEMA | None = None

    def __post_init__(self):
        self.group.check_relative()
        validate.rule(
            math.isfinite(self.beta) and 0.0 < self.beta <= 1.0,
            f"beta must be in (0, 1] (got {self.beta}): it sets v± = v_old ± β·(v_θ − v_old)",
        )
        validate.rule(self.weighting in WEIGHTINGS, f"weighting must be one of {WEIGHTINGS} (got {self.weighting!r})")
        validate.non_negative(self, "kl_beta")
        validate.counts(self, "schedule_levels", minimum=0)
        steps = self.sampling.num_steps
        validate.rule(
            steps is None or self.schedule_levels <= steps,
            f"schedule_levels={self.schedule_levels} exceeds the sampling schedule's {steps} levels",
        )


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


def velocity_kl(v_theta: jax.Array, v_ref: jax.Array) -> jax.Array:
    """The official NFT code's KL to the reference, ``mean_rows(mean((v_θ − v_ref)²))``.

    Args:
      v_theta: ``(B, ...)`` the current policy's velocities (differentiable).
      v_ref: ``(B, ...)`` the reference's velocities (stop-gradient).

    Returns:
      The float32 scalar.
    """
    axes = tuple(range(1, v_theta.ndim))
    return jnp.mean(jnp.mean((v_theta - jax.lax.stop_gradient(v_ref)) ** 2, axis=axes))


def nft_adaptive_loss(
    v_theta: jax.Array,
    v_old: jax.Array,
    x_sigma: jax.Array,
    x0: jax.Array,
    sigma: jax.Array,
    r: jax.Array,
    *,
    beta: float,
    adv_clip: float,
    v_ref: jax.Array | None = None,
    kl_beta: float = 0.0,
) -> tuple[jax.Array, dict]:
    """The official DiffusionNFT objective: adaptively weighted x0-space errors plus a KL to the reference.

    With ``v± = v_old ± β·(v_θ − v_old)`` and ``x̂0± = x_σ − σ·v±``, per row
    ``e± = mean((x̂0± − x0)²) / max(mean|x̂0± − x0|, 1e-5)`` (the divisor stop-gradient), and

        L = mean_rows(adv_clip · (r·e⁺ + (1−r)·e⁻) / β) + kl_beta · mean_rows(mean((v_θ − v_ref)²))

    Args:
      v_theta: ``(B, ...)`` the current policy's velocities (differentiable).
      v_old: ``(B, ...)`` the old policy's (stop-gradient).
      x_sigma: ``(B, ...)`` the re-noised samples ``(1−σ)·x0 + σ·ε``.
      x0: ``(B, ...)`` the clean samples.
      sigma: ``(B,)`` their noise levels.
      r: ``(B,)`` optimality weights in [0, 1].
      beta: the implicit policies' step β.
      adv_clip: the advantage clip the weights were normalised by (the loss's scale).
      v_ref: ``(B, ...)`` the reference's velocities (stop-gradient; needed when ``kl_beta > 0``).
      kl_beta: the KL weight.

    Returns:
      ``(loss, metrics)``: ``loss``, ``policy_loss``, ``kl``, ``loss_pos`` / ``loss_neg`` (the mean weighted
      errors ``e±``).

    Raises:
      ValueError: if ``kl_beta > 0`` without ``v_ref``.
    """
    sg = jax.lax.stop_gradient
    v_old, r, x0 = sg(v_old), sg(r), sg(x0)
    axes = tuple(range(1, v_theta.ndim))
    s = sigma.reshape(sigma.shape + (1,) * (v_theta.ndim - 1))
    delta = beta * (v_theta - v_old)

    def weighted(v):
        err = x_sigma - s * v - x0
        scale = sg(jnp.maximum(jnp.mean(jnp.abs(err), axis=axes, keepdims=True), 1e-5))
        return jnp.mean(err**2 / scale, axis=axes)

    pos, neg = weighted(v_old + delta), weighted(v_old - delta)
    policy = jnp.mean(adv_clip * (r * pos + (1.0 - r) * neg) / beta)
    if kl_beta > 0:
        if v_ref is None:
            raise ValueError("nft_adaptive_loss with kl_beta > 0 needs v_ref")
        kl = velocity_kl(v_theta, v_ref)
    else:
        kl = jnp.zeros((), jnp.float32)
    loss = policy + kl_beta * kl
    return loss, {"loss": loss, "policy_loss": policy, "kl": kl, "loss_pos": jnp.mean(pos), "loss_neg": jnp.mean(neg)}


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
        self.roles = {**self.roles, "old": tuple(self.denoisers)}
        self._jit(card, reward, config, program)
        self.render = jax.jit(self._render)

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The old policy: a copy of the trained denoiser(s), followed by an EMA; with ``kl_beta > 0`` also
        the reference, the weights before training (for LoRA: the adapters at B = 0, i.e. the base)."""
        if self.config.kl_beta > 0:
            return {"old": params[GENERATOR], "reference": params[GENERATOR]}
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

    def _rollout(self, state: TrainState, batch: Prompts, key: jax.Array, reward_weights: Any = None) -> NFTRollout:
        images, x0, cond, rows, artifacts = self._render(state.copies["old"], state.frozen, batch, key)
        scored = rollout.score_rollout(self.reward_at(reward_weights), artifacts, rows, self.config.group)
        weights = optimality_weight(scored.advantages, self.config.group.adv_clip)
        return NFTRollout(images, x0, cond, scored.rewards, scored.parts, scored.advantages, weights)

    def reconstruct(self, state: TrainState, batch: Prompts, key: jax.Array) -> jax.Array:
        """The clean latents ``(B, *latent)`` the CURRENT weights render from the rollout's keys (C2: with
        ``old == params`` they equal the rollout's ``latents`` bit for bit)."""
        return self.render(state.params[GENERATOR], state.frozen, batch, key)[1]

    def loss(self, params: nnx.State, state: TrainState, ro: NFTRollout, key: jax.Array) -> tuple[jax.Array, dict]:
        """The NFT loss of ``params`` on a rollout's re-noised clean samples (pure; differentiable in ``params``).

        One noise level per sample from ``config.noise``, or (``schedule_levels = k``) ``k`` levels of the
        sampling schedule per sample, each re-noised with its own ε, their losses averaged (one level at a
        time: ``lax.map`` with each level rematerialised, so a gradient holds one level's activations).
        """
        x0 = jax.lax.stop_gradient(ro.latents)
        k_sigma, k_noise = jax.random.split(key)
        rows = x0.shape[0]
        if self.config.schedule_levels == 0:
            return self._objective(params, state, ro, x0, self.config.noise.draw(k_sigma, rows), k_noise)
        levels = denoise.schedule(self.sampling)[:-1]  # σ_0 .. σ_{N-1}: the levels the sampler visits
        picks = jax.vmap(lambda k: jax.random.permutation(k, levels.shape[0])[: self.config.schedule_levels])(
            jax.random.split(k_sigma, rows)
        )
        sigmas = levels[picks.T]  # (k, B): each sample's own k distinct levels
        keys = jax.random.split(k_noise, self.config.schedule_levels)
        one = jax.checkpoint(lambda a: self._objective(params, state, ro, x0, a[0], a[1]))
        losses, metrics = jax.lax.map(one, (sigmas, keys))
        return jnp.mean(losses), jax.tree.map(jnp.mean, metrics)

    def _objective(self, params, state: TrainState, ro: NFTRollout, x0, sigma, k_noise) -> tuple[jax.Array, dict]:
        """The configured NFT objective at one noise level per row ``sigma (B,)``, fresh ε from ``k_noise``."""
        noise = jax.random.normal(k_noise, x0.shape)
        x_sigma = samplers.noised(x0, noise, sigma)
        models_of = self.models_of(state.frozen)
        v_theta = denoise.velocity(models_of(params), x_sigma, sigma, ro.cond, self.regression)
        v_old = denoise.velocity(models_of(state.copies["old"]), x_sigma, sigma, ro.cond, self.regression)
        v_ref = None
        if self.config.kl_beta > 0:
            v_ref = denoise.velocity(models_of(state.copies["reference"]), x_sigma, sigma, ro.cond, self.regression)
        cfg = self.config
        if cfg.weighting == "adaptive":
            return nft_adaptive_loss(
                v_theta,
                v_old,
                x_sigma,
                x0,
                sigma,
                ro.weights,
                beta=cfg.beta,
                adv_clip=cfg.group.adv_clip,
                v_ref=v_ref,
                kl_beta=cfg.kl_beta,
            )
        loss, metrics = nft_loss(v_theta, v_old, noise - x0, ro.weights, cfg.beta)
        if v_ref is None:
            return loss, metrics
        kl = velocity_kl(v_theta, v_ref)
        total = loss + cfg.kl_beta * kl
        return total, {**metrics, "loss": total, "kl": kl}

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
            copies={**state.copies, "old": old},
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


def config_from_flags(run: RunSettings, lora: LoRAFlags, own: NFTFlags) -> DiffusionNFTConfig:
    """``jaxpipe train nft``'s config from its flags.

    Args:
      run: the run's settings (group size, learning rate).
      lora: the adapters' flags.
      own: the NFT flags (steps, β, advantage clip, the old policy's EMA, sampler, guidance, re-noising).

    Returns:
      The ``DiffusionNFTConfig``.
    """
    return DiffusionNFTConfig(
        group=run.group(adv_clip=own.adv_clip),
        sampling=Sampling(num_steps=own.num_steps, sampler=own.sampler, guidance=own.guidance),
        beta=own.beta,
        ema=EMA(own.ema_start, own.ema_end, own.ema_ramp),
        noise=NoiseLevels(own.sigma_sampling),
        optimizer=run.optimizer(DiffusionNFTConfig().optimizer),
        lora=lora.config(),
    )
