"""``FlowGRPO``: group-relative policy optimisation of a text-to-image card's DiT (DESIGN §6, §10).

One ``step``: each of P prompts is rendered K times with the card's own denoise loop under
SDE sampling with capture on (the rollout); the images are scored by a reward function; group
advantages ``A = clip((r - mean_group) / (std_group + 1e-4), ±adv_clip)`` weight a clipped PPO
loss on every captured step's log-prob, plus ``β · mean((mean_now - mean_ref)²) / (2σ_eff²)``
to a frozen reference DiT. Gradients flow through the DiT with ``jax.grad``; the text encoder
and autoencoder stay frozen. ``rollout`` and ``update`` are separate jitted functions so the
C2 identity (recomputed log-probs == captured, ratio == 1) can be checked between them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe import samplers
from jaxpipe.card import Card
from jaxpipe.cards import common, digit_scorer
from jaxpipe.loops import denoise
from jaxpipe.training import losses
from jaxpipe.training.finetune import guarded_update

__all__ = ["FlowGRPOConfig", "FlowGRPOState", "Rollout", "FlowGRPO", "scorer_reward", "REWARD_TERMS"]

REWARD_TERMS = ("digit", "stroke", "position", "brightness")
"""Reward terms a ``digit-scorer`` reward can sum: the scorer's probability of the prompted label."""

RewardFn = Callable[[jax.Array, Mapping[str, jax.Array]], jax.Array]
"""``reward(images (B, H, W, C) in [0, 1], labels {term: (B,) int}) -> (B,)`` rewards."""


@dataclasses.dataclass(frozen=True)
class FlowGRPOConfig:
    """Settings of a FlowGRPO run (hashable: it is static under ``jit``)."""

    group_size: int = 4
    num_steps: int = 8
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    clip_eps: float = 1e-3
    adv_clip: float = 5.0
    beta: float = 0.004
    learning_rate: float = 1e-4
    grad_clip: float = 1.0

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"group_size (K) must be >= 2 for group-relative advantages (got {self.group_size})")
        if not self.clip_eps > 0 or not self.adv_clip > 0:
            raise ValueError("clip_eps and adv_clip must be > 0")
        if self.beta < 0 or not self.learning_rate > 0:
            raise ValueError("beta must be >= 0 and learning_rate > 0")
        self.sampling  # validates num_steps, noise_level and sde_window

    @property
    def sampling(self) -> denoise.DenoiseConfig:
        """The rollout's denoise policy: SDE (in the window), guidance 1 so the recompute is faithful."""
        return denoise.DenoiseConfig(
            num_steps=self.num_steps, sampler="sde", noise_level=self.noise_level, sde_window=self.sde_window, guidance=1.0
        )


class FlowGRPOState(NamedTuple):
    """Trainable DiT params, the frozen rest of the card, the frozen reference DiT, optimiser state, step."""

    params: nnx.State
    frozen: nnx.State
    reference: nnx.State
    opt_state: Any
    step: jax.Array


class Rollout(NamedTuple):
    """One group rollout: the captured trajectory ``(S, B, ...)``, its conditioning, images, rewards ``(B,)``
    and advantages ``(B,)`` (B = P·K, sample ``p·K + k`` is the k-th sample of prompt p)."""

    trajectory: denoise.Transition
    cond: denoise.Conditioning
    images: jax.Array
    rewards: jax.Array
    advantages: jax.Array


def scorer_reward(scorer: Card, terms: tuple[str, ...] = ("digit",)) -> RewardFn:
    """A reward that sums the ``digit-scorer``'s probability of each prompted label over ``terms``.

    A label of -1 means "not prompted" and contributes nothing.
    """
    unknown = [t for t in terms if t not in REWARD_TERMS]
    if unknown or not terms:
        raise ValueError(f"unknown reward term(s) {unknown or list(terms)}; choose from {REWARD_TERMS}")

    def reward(images: jax.Array, labels: Mapping[str, jax.Array]) -> jax.Array:
        probs = digit_scorer.score(scorer, images * 2.0 - 1.0)
        total = jnp.zeros(images.shape[0], jnp.float32)
        for term in terms:
            label = jnp.asarray(labels[term])
            picked = jnp.take_along_axis(probs[term], jnp.maximum(label, 0)[:, None], axis=1)[:, 0]
            total = total + jnp.where(label >= 0, picked, 0.0)
        return total

    return reward


def _transformer_name(card: Card) -> str:
    loops = [loop for loop in card.spec.loops if loop.kind == "denoise"]
    if not loops:
        raise ValueError(f"card {card.model_id!r} has no denoise loop to train")
    return loops[0].binds[0]


class FlowGRPO:
    """FlowGRPO on a text-to-image card: ``init(key)``, jitted ``rollout``/``update`` and ``step``.

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}``; each prompt is sampled
    ``group_size`` times. ``reward_fn`` defaults to nothing: pass ``scorer_reward(scorer_card)``.
    """

    def __init__(self, card: Card, reward_fn: RewardFn, config: FlowGRPOConfig = FlowGRPOConfig()):
        self.config = config
        self.spec = card.spec
        self.reward_fn = reward_fn
        self.transformer = _transformer_name(card)
        graphdef, params, rest = nnx.split(card.components, nnx.Param, ...)
        self._graphdef, self._rest = graphdef, rest
        self._params = nnx.State({k: params[k] for k in params if k == self.transformer})
        self._frozen = nnx.State({k: params[k] for k in params if k != self.transformer})
        self.tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)

    def init(self, key: jax.Array | None = None) -> FlowGRPOState:
        """Start from the card's weights; the reference is a frozen copy of the DiT."""
        del key
        params, frozen = jax.tree.map(jnp.array, (self._params, self._frozen))
        reference = jax.tree.map(jnp.array, self._params)
        return FlowGRPOState(params, frozen, reference, self.tx.init(params), jnp.zeros((), jnp.int32))

    def components(self, params: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def card(self, state: FlowGRPOState) -> Card:
        """The card with the state's DiT weights."""
        return Card(self.components(state.params, state.frozen), self.spec)

    def _rollout(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> Rollout:
        cfg = self.config
        comps = self.components(jax.lax.stop_gradient(state.params), state.frozen)
        card = Card(comps, self.spec)
        k = cfg.group_size
        ids = jnp.repeat(batch["ids"], k, axis=0)
        labels = {name: jnp.repeat(jnp.asarray(v), k, axis=0) for name, v in batch["labels"].items()}
        keys = jax.random.split(key, ids.shape[0])
        cond = common.encode_prompts(card, ids)
        start = denoise.init(keys, self.spec.config.latent_shape, cond, cfg.sampling)
        final, trajectory = denoise.run(comps[self.transformer], start, cfg.sampling, capture=True)
        images = common.to_unit(comps["vae"].decode(final.x[:, 0]))
        rewards = self.reward_fn(images, labels)
        advantages = losses.group_advantages(rewards.reshape(-1, k), adv_clip=cfg.adv_clip).reshape(-1)
        return Rollout(trajectory, cond, images, rewards, advantages)

    def step_stats(self, params: nnx.State, frozen: nnx.State, rollout: Rollout) -> tuple[jax.Array, jax.Array]:
        """Per captured step ``(S, B)`` log-probs and ``(S, B, ...)`` SDE means of the rollout's samples
        under ``params`` (teacher-forced, vmapped over time; the trainer's own batching)."""
        cfg = self.config
        model = self.components(params, frozen)[self.transformer]

        def one(t: denoise.Transition):
            v = denoise.velocity(model, t.x, t.sigma, rollout.cond, 1.0)
            coef = samplers.sde_coefficients(
                t.sigma.reshape((-1,) + (1,) * (t.x.ndim - 1)),
                t.sigma_next.reshape((-1,) + (1,) * (t.x.ndim - 1)),
                cfg.noise_level,
            )
            mean = coef.a * t.x + coef.b * v
            return samplers.sde_log_prob(t.x, v, t.sigma, t.sigma_next, t.sample, noise_level=cfg.noise_level), mean

        return jax.vmap(one)(rollout.trajectory)

    def loss(self, params, state: FlowGRPOState, rollout: Rollout) -> tuple[jax.Array, dict]:
        """Clipped PPO on every captured step + β·KL to the reference (scalar, metrics)."""
        log_prob, mean = self.step_stats(params, state.frozen, rollout)
        _, mean_ref = self.step_stats(state.reference, state.frozen, rollout)
        traj = rollout.trajectory
        return losses.flow_grpo_loss(
            log_prob,
            traj.log_prob,
            rollout.advantages,
            mean,
            jax.lax.stop_gradient(mean_ref),
            traj.std,
            clip_eps=self.config.clip_eps,
            beta=self.config.beta,
        )

    def _update(self, state: FlowGRPOState, rollout: Rollout) -> tuple[FlowGRPOState, dict]:
        (loss, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(state.params, state, rollout)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        new = state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state, step=state.step + 1)
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "grad_norm": optax.tree.norm(grads), "skipped": 1.0 - finite.astype(jnp.float32)}

    def step(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> tuple[FlowGRPOState, dict]:
        """Rollout then one update: ``(state, metrics)`` with the reward statistics of the rollout."""
        rollout = self.rollout(state, batch, key)
        state, metrics = self.update(state, rollout)
        return state, {**metrics, "reward_mean": jnp.mean(rollout.rewards), "reward_std": jnp.std(rollout.rewards)}
