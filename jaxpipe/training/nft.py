"""``DiffusionNFT``: likelihood-free RL of a text-to-image card's denoiser on the forward process (DESIGN §10).

One ``step``: each of P prompts is rendered K times by the card's own program under the OLD
policy ``θ_old`` (any sampler; the ODE by default: no log-probs are needed, only the clean
latents ``x0`` and the conditioning the loop used). Rewards give group advantages
``A = clip((r − mean_g) / (std_g + 1e-4), ±adv_clip)`` (``losses.group_advantages``), mapped to an
optimality weight ``r = 0.5 + 0.5 · A / adv_clip ∈ [0, 1]`` (0.5: an average sample).

The update is flow-matching regression on re-noised clean samples, ``σ`` per row (``sigma_sampling``),
``ε ~ N(0, I)``, ``x_σ = (1−σ)·x0 + σ·ε``, target ``v = ε − x0``, of the implicit positive and
negative policies

    v⁺ = v_old + β·(v_θ − v_old) = (1−β)·v_old + β·v_θ
    v⁻ = v_old − β·(v_θ − v_old) = (1+β)·v_old − β·v_θ
    L  = mean_rows( r·mean(‖v⁺ − v‖²) + (1−r)·mean(‖v⁻ − v‖²) )

with ``v_old`` the old policy's velocity (stop-gradient) under the same conditioning. Written as
offsets from ``v_old``, ``θ == θ_old`` gives ``v⁺ == v⁻ == v_old`` exactly, so at ``r = 0.5`` (a
constant reward) the gradient is exactly 0 and the weights stay bit-identical.

After each update the old policy follows the trained one by an EMA,
``θ_old ← θ_old + (1−d)·(θ − θ_old)`` (= ``d·θ_old + (1−d)·θ``, written so equal weights stay
bit-identical), with the decay ramping linearly over the update count ``n`` (before this update):
``d(n) = ema_start + (ema_end − ema_start) · min(n / ema_ramp_steps, 1)`` (``ema_ramp_steps = 0``:
``ema_end`` from the start). ``d = 0`` is on-policy (the old policy is the current one each step).

Trained components: the denoiser(s) the program's denoise loop binds (σ covers (0, 1), so every
expert of a routed loop is reached). The conditioning is the rollout's, so the text encoder stays
frozen. Networks run in the card's own dtype (no bfloat16 master-weight mode here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.loops import denoise
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import rollout
from jaxpipe.training.finetune import guarded_update, split_trainable
from jaxpipe.training.flow_grpo import check_batch, master_weights

__all__ = [
    "DiffusionNFTConfig",
    "NFTState",
    "NFTRollout",
    "DiffusionNFT",
    "nft_loss",
    "optimality_weight",
    "ema_decay",
]

UPDATE_KEY = 1_000_003
"""``fold_in(step key, UPDATE_KEY)`` draws a step's (σ, ε) (the rollout uses the step key itself)."""

SIGMA_SAMPLINGS = ("uniform", "logit_normal")


@dataclasses.dataclass(frozen=True)
class DiffusionNFTConfig:
    """Settings of a DiffusionNFT run (hashable: static under ``jit``).

    beta: the implicit policies' step ``β ∈ (0, 1]``; adv_clip: advantage clip, also the scale of
    ``r = 0.5 + 0.5·A/adv_clip``; ema_start / ema_end / ema_ramp_steps: the old policy's EMA decay
    schedule (module docstring); sampler / num_steps / noise_level / guidance: the rollout's denoise
    policy; sigma_sampling: ``"uniform"`` on ``[sigma_min, sigma_max]`` or ``"logit_normal"``
    (``sigmoid(N(0, 1))`` clipped to that range).
    """

    beta: float = 1.0
    group_size: int = 4
    learning_rate: float = 1e-4
    grad_clip: float = 1.0
    adv_clip: float = 2.0
    ema_start: float = 0.0
    ema_end: float = 0.5
    ema_ramp_steps: int = 100
    sampler: str = "ode"
    num_steps: int = 8
    noise_level: float = 0.7
    guidance: float = 1.0
    sigma_sampling: str = "uniform"
    sigma_min: float = 0.02
    sigma_max: float = 0.98

    def __post_init__(self):
        if not 0.0 < self.beta <= 1.0:
            raise ValueError(f"beta must be in (0, 1] (got {self.beta}): it sets v± = v_old ± β·(v_θ − v_old)")
        if self.group_size < 2:
            raise ValueError(f"group_size (K) must be >= 2 for group-relative advantages (got {self.group_size})")
        if not self.learning_rate > 0 or not self.grad_clip > 0 or not self.adv_clip > 0:
            raise ValueError("learning_rate, grad_clip and adv_clip must be > 0")
        if not (0.0 <= self.ema_start <= 1.0 and 0.0 <= self.ema_end <= 1.0) or self.ema_ramp_steps < 0:
            raise ValueError(
                f"ema_start and ema_end must be in [0, 1] and ema_ramp_steps >= 0 (got {self.ema_start}, {self.ema_end}, "
                f"{self.ema_ramp_steps})"
            )
        if self.sigma_sampling not in SIGMA_SAMPLINGS:
            raise ValueError(f"sigma_sampling must be one of {SIGMA_SAMPLINGS} (got {self.sigma_sampling!r})")
        if not 0.0 <= self.sigma_min < self.sigma_max <= 1.0:
            raise ValueError(f"need 0 <= sigma_min < sigma_max <= 1 (got {self.sigma_min}, {self.sigma_max})")
        self.sampling  # validates sampler, num_steps, noise_level, guidance

    @property
    def sampling(self) -> denoise.DenoiseConfig:
        """The rollout's denoise policy on a default loop (see ``sampling_on``)."""
        return self.sampling_on(denoise.DenoiseConfig())

    def sampling_on(self, loop: denoise.DenoiseConfig) -> denoise.DenoiseConfig:
        """The rollout's policy on a card's loop config: its shift and router, this run's sampler and steps."""
        return loop.replace(
            num_steps=self.num_steps, sampler=self.sampler, noise_level=self.noise_level, sde_window=None,
            guidance=self.guidance,
        )


class NFTState(NamedTuple):
    """Trainable params (the loop's denoisers), the old policy's copy of them, the frozen rest of the
    card, optimiser state, step (updates so far)."""

    params: nnx.State
    old: nnx.State
    frozen: nnx.State
    opt_state: Any
    step: jax.Array


class NFTRollout(NamedTuple):
    """One group rollout from the old policy (B = P·K rows, row ``p·K + k`` is sample k of prompt p):
    images, clean latents ``x0`` ``(B, *latent)``, the loop's conditioning, rewards, advantages and
    optimality weights ``r`` (all ``(B,)``)."""

    images: jax.Array
    latents: jax.Array
    cond: Any
    rewards: jax.Array
    advantages: jax.Array
    weights: jax.Array


def optimality_weight(advantages: jax.Array, adv_clip: float) -> jax.Array:
    """``r = 0.5 + 0.5 · clip(A / adv_clip, −1, 1)`` in [0, 1], same shape as ``advantages``."""
    return 0.5 + 0.5 * jnp.clip(advantages / adv_clip, -1.0, 1.0)


def ema_decay(config: DiffusionNFTConfig, step: jax.Array) -> jax.Array:
    """The old policy's EMA decay after update ``step`` (0-based): linear ramp from ``ema_start`` to ``ema_end``."""
    if config.ema_ramp_steps == 0:
        return jnp.asarray(config.ema_end, jnp.float32)
    frac = jnp.minimum(step.astype(jnp.float32) / config.ema_ramp_steps, 1.0)
    return config.ema_start + (config.ema_end - config.ema_start) * frac


def nft_loss(v_theta: jax.Array, v_old: jax.Array, target: jax.Array, r: jax.Array, beta: float) -> tuple[jax.Array, dict]:
    """The NFT objective on velocities ``(B, ...)`` with weights ``r`` ``(B,)``: ``(scalar, metrics)``.

    ``v_old`` is treated as a constant (stop-gradient); per row the squared errors of
    ``v± = v_old ± β·(v_θ − v_old)`` to ``target`` are averaged over the latent dims."""
    v_old = jax.lax.stop_gradient(v_old)
    delta = beta * (v_theta - v_old)
    axes = tuple(range(1, v_theta.ndim))
    pos = jnp.mean((v_old + delta - target) ** 2, axis=axes)
    neg = jnp.mean((v_old - delta - target) ** 2, axis=axes)
    r = jax.lax.stop_gradient(r)
    loss = jnp.mean(r * pos + (1.0 - r) * neg)
    return loss, {"loss": loss, "loss_pos": jnp.mean(pos), "loss_neg": jnp.mean(neg)}


class DiffusionNFT:
    """DiffusionNFT on a text-to-image card: ``init(key)``, jitted ``render`` / ``rollout`` / ``update`` / ``step``.

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}``; each prompt is sampled
    ``group_size`` times by the old policy. ``reward_fn`` scores images in [0, 1]. The card renders
    through its family's program (or ``program``), which must run exactly one denoise loop.
    """

    def __init__(self, card: Card, reward_fn: rollout.RewardFn, config: DiffusionNFTConfig = DiffusionNFTConfig(), *,
                 program=None):
        self.config = config
        self.spec = card.spec
        self.reward_fn = reward_fn
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        self.loop = rollout.denoise_loop(card, self.program)
        self.artifact = rollout.rendered_artifact(self.program)
        self.denoisers = self.loop.binds
        self.sampling = config.sampling_on(self.loop.config)
        self.regression = self.loop.config.replace(guidance=1.0, stg=0.0)  # the plain velocity, as Finetune regresses
        self._graphdef, params, self._frozen, self._rest = split_trainable(card, tuple(self.denoisers))
        self._params = master_weights(params)
        self.tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.render = jax.jit(self._render)
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

    @property
    def transformer(self) -> str:
        """The (first) denoiser component that trains."""
        return self.denoisers[0]

    def init(self, key: jax.Array | None = None) -> NFTState:
        """Start from the card's weights; the old policy is a copy of the trained denoiser(s)."""
        del key
        params, old, frozen = jax.tree.map(jnp.array, (self._params, self._params, self._frozen))
        return NFTState(params, old, frozen, self.tx.init(params), jnp.zeros((), jnp.int32))

    def components(self, params: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def card(self, state: NFTState) -> Card:
        """The card with the current (trained) denoiser weights."""
        return Card(self.components(state.params, state.frozen), self.spec)

    def old_card(self, state: NFTState) -> Card:
        """The card with the old policy's denoiser weights (the one the rollouts sample)."""
        return Card(self.components(state.old, state.frozen), self.spec)

    @property
    def roles(self) -> dict[str, tuple[str, ...]]:
        """The weight copies this trainer keeps besides the trained card (``weight_sync.track``):
        ``"old"``, the old policy's denoiser(s)."""
        return {"old": tuple(self.denoisers)}

    def role_card(self, state: NFTState, role: str) -> Card:
        """The card with ``role``'s weights (``"old"``: ``old_card``)."""
        if role != "old":
            raise KeyError(f"DiffusionNFT keeps the role 'old' only (got {role!r})")
        return self.old_card(state)

    def _models(self, params: nnx.State, frozen: nnx.State) -> tuple:
        comps = self.components(params, frozen)
        return tuple(comps[name] for name in self.denoisers)

    def _render(self, params: nnx.State, frozen: nnx.State, batch: Mapping[str, Any], key: jax.Array):
        """The program under denoiser weights ``params`` on the batch repeated ``group_size`` times:
        ``(images, clean latents x0, cond, labels)``; row keys ``split(key, B)``."""
        card = Card(self.components(jax.lax.stop_gradient(params), frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, self.config.group_size)
        keys = jax.random.split(key, ids.shape[0])
        settings = loop_settings(**{self.loop.id: self.sampling})
        run = rollout.run(card, self.program, settings, rollout.text_slots(self.program, ids, keys), capture=())
        final, _ = run.captures[self.loop.id]
        return run.artifacts[self.artifact], final.x, final.cond, labels

    def _rollout(self, state: NFTState, batch: Mapping[str, Any], key: jax.Array) -> NFTRollout:
        cfg = self.config
        images, x0, cond, labels = self._render(state.old, state.frozen, batch, key)
        rewards, advantages = rollout.score(self.reward_fn, images, labels, cfg.group_size, cfg.adv_clip)
        return NFTRollout(images, x0, cond, rewards, advantages, optimality_weight(advantages, cfg.adv_clip))

    def reconstruct(self, state: NFTState, batch: Mapping[str, Any], key: jax.Array) -> jax.Array:
        """The clean latents ``(B, *latent)`` the CURRENT weights render from the rollout's keys (C2: with
        ``old == params`` they equal the rollout's ``latents`` bit for bit)."""
        return self.render(state.params, state.frozen, batch, key)[1]

    def _sigmas(self, key: jax.Array, b: int) -> jax.Array:
        cfg = self.config
        if cfg.sigma_sampling == "uniform":
            return jax.random.uniform(key, (b,), minval=cfg.sigma_min, maxval=cfg.sigma_max)
        return jnp.clip(jax.nn.sigmoid(jax.random.normal(key, (b,))), cfg.sigma_min, cfg.sigma_max)

    def loss(self, params: nnx.State, state: NFTState, ro: NFTRollout, key: jax.Array) -> tuple[jax.Array, dict]:
        """The NFT loss of ``params`` on a rollout's re-noised clean samples (pure; differentiable in ``params``)."""
        x0 = jax.lax.stop_gradient(ro.latents)
        b = x0.shape[0]
        k_sigma, k_noise = jax.random.split(key)
        sigma = self._sigmas(k_sigma, b)
        noise = jax.random.normal(k_noise, x0.shape)
        s = sigma.reshape((b,) + (1,) * (x0.ndim - 1))
        x_sigma = (1.0 - s) * x0 + s * noise
        v_theta = denoise.velocity(self._models(params, state.frozen), x_sigma, sigma, ro.cond, self.regression)
        v_old = denoise.velocity(self._models(state.old, state.frozen), x_sigma, sigma, ro.cond, self.regression)
        return nft_loss(v_theta, v_old, noise - x0, ro.weights, self.config.beta)

    def _update(self, state: NFTState, ro: NFTRollout, key: jax.Array) -> tuple[NFTState, dict]:
        """One optimiser step, then the old policy's EMA; a non-finite loss or gradient leaves the
        whole state but ``step`` unchanged: ``(state, metrics)``."""
        (loss, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(state.params, state, ro, key)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        d = ema_decay(self.config, state.step)
        old = jax.tree.map(lambda o, p: o + (1.0 - d).astype(o.dtype) * (p - o), state.old, params)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = state._replace(params=params, old=old, opt_state=opt_state, step=state.step + 1)
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "grad_norm": grad_norm, "ema_decay": d, "r_mean": jnp.mean(ro.weights),
                     "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: NFTState, batch: Mapping[str, Any], key: jax.Array) -> tuple[NFTState, dict]:
        """The pure, unjitted step (rollout from the old policy + update), for custom ``jit``/sharding."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))
        return state, {**metrics, "reward_mean": jnp.mean(ro.rewards), "reward_std": jnp.std(ro.rewards)}

    def step(self, state: NFTState, batch: Mapping[str, Any], key: jax.Array) -> tuple[NFTState, dict]:
        """Rollout then update as ONE jitted function: ``(state, metrics)`` with the rollout's reward statistics."""
        check_batch(batch)
        return self._step(state, batch, key)
