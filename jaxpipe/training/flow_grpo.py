"""``FlowGRPO``: group-relative policy optimisation of a text-to-image card's DiT (DESIGN §6, §10).

One ``step``: each of P prompts is rendered K times with the card's own denoise loop under
SDE sampling with capture on (the rollout); the images are scored by a reward function; group
advantages ``A = clip((r - mean_group) / (std_group + 1e-4), ±adv_clip)`` weight a clipped PPO
loss on every captured step's log-prob, plus ``β · mean((mean_now - mean_ref)²) / (2σ_eff²)``
to a frozen reference DiT. Gradients flow through the DiT with ``jax.grad``; the text encoder
and autoencoder stay frozen. ``rollout`` and ``update`` are separate jitted functions so the
C2 identity (recomputed log-probs == captured, ratio == 1) can be checked between them;
``step`` is both fused into one jitted function. The rollout is the card's own denoise loop
(``training.rollout``); ``generator_loss`` is the objective ``UnifiedRL`` reuses.
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
from jaxpipe.cards import digit_scorer
from jaxpipe.loops import denoise
from jaxpipe.training import losses, rollout
from jaxpipe.training.finetune import guarded_update, split_trainable

__all__ = [
    "FlowGRPOConfig",
    "FlowGRPOState",
    "Rollout",
    "FlowGRPO",
    "generator_loss",
    "scorer_reward",
    "scorer_reward_parts",
    "REWARD_TERMS",
    "transformer_name",
]

REWARD_TERMS = ("digit", "stroke", "position", "brightness")
"""Reward terms a ``digit-scorer`` reward can sum: the scorer's probability of the prompted label."""

RewardFn = rollout.RewardFn


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
    """One group rollout (B = P·K rows, row ``p·K + k`` is sample k of prompt p): the rendered
    batch with its captured SDE steps, rewards ``(B,)`` and group advantages ``(B,)``."""

    generated: rollout.Generated
    rewards: jax.Array
    advantages: jax.Array


def scorer_reward_parts(scorer: Card, terms: tuple[str, ...] = ("digit",)):
    """Like ``scorer_reward`` but returns the parts: ``reward(images, labels) -> {term: (B,)}``, the
    ``digit-scorer``'s probability of each term's label (0 where the label is -1). Per-term parts give
    per-expert credit in N-way RL."""
    unknown = [t for t in terms if t not in REWARD_TERMS]
    if unknown or not terms:
        raise ValueError(f"unknown reward term(s) {unknown or list(terms)}; choose from {REWARD_TERMS}")

    def reward(images: jax.Array, labels: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        missing = [t for t in terms if t not in labels]
        if missing:
            raise ValueError(f"the batch has no labels for reward term(s) {missing} (labels: {sorted(labels)})")
        probs = digit_scorer.score(scorer, images * 2.0 - 1.0)
        parts = {}
        for term in terms:
            label = jnp.asarray(labels[term])
            picked = jnp.take_along_axis(probs[term], jnp.maximum(label, 0)[:, None], axis=1)[:, 0]
            parts[term] = jnp.where(label >= 0, picked, 0.0)
        return parts

    return reward


def scorer_reward(scorer: Card, terms: tuple[str, ...] = ("digit",)) -> RewardFn:
    """A reward that sums the ``digit-scorer``'s probability of each prompted label over ``terms``.

    A label of -1 means "not prompted" and contributes nothing. A label the prompt does not name
    (e.g. ``stroke = thick`` for the prompt ``"seven"``) is a *preference*: the reward then
    prefers images with that attribute, which is what a prompt refiner learns to ask for.
    """
    parts = scorer_reward_parts(scorer, terms)

    def reward(images: jax.Array, labels: Mapping[str, jax.Array]) -> jax.Array:
        return sum(parts(images, labels).values())

    return reward


def transformer_name(card: Card) -> str:
    """The component the card's (first) denoise loop binds."""
    loops = [loop for loop in card.spec.loops if loop.kind == "denoise"]
    if not loops:
        raise ValueError(f"card {card.model_id!r} has no denoise loop to train")
    return loops[0].binds[0]


def generator_loss(
    model, reference, generated: rollout.Generated, advantages: jax.Array, config: FlowGRPOConfig
) -> tuple[jax.Array, dict]:
    """Clipped PPO on every captured SDE step of ``generated`` under ``model`` plus
    ``β · mean((mean_now - mean_ref)²) / (2σ_eff²)`` to ``reference``: ``(scalar, metrics)``.
    Differentiable in ``model``; ``advantages`` ``(B,)``."""
    log_prob, mean = rollout.generator_stats(model, generated, config.sampling)
    if config.beta > 0:
        _, mean_ref = rollout.generator_stats(reference, generated, config.sampling)
        mean_ref = jax.lax.stop_gradient(mean_ref)
    else:
        mean_ref = jax.lax.stop_gradient(mean)
    traj = generated.trajectory
    return losses.flow_grpo_loss(
        log_prob, traj.log_prob, advantages, mean, mean_ref, traj.std, clip_eps=config.clip_eps, beta=config.beta
    )


def check_batch(batch: Mapping[str, Any], terms: tuple[str, ...] | None = None) -> None:
    """A clear error for a malformed RL batch ``{"ids": (P, L) int, "labels": {term: (P,) int}}``."""
    if not isinstance(batch, Mapping) or "ids" not in batch:
        raise ValueError('an RL batch is {"ids": (P, L) int32, "labels": {term: (P,) int32}}')
    ids = batch["ids"]
    if getattr(ids, "ndim", None) != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"batch['ids'] must be a (P, L) integer array (got {getattr(ids, 'dtype', type(ids))}{getattr(ids, 'shape', '')})")
    labels = batch.get("labels", {})
    for name, value in labels.items():
        if jnp.shape(value) != (ids.shape[0],):
            raise ValueError(f"batch['labels'][{name!r}] must have shape ({ids.shape[0]},) (got {jnp.shape(value)})")
    missing = [t for t in (terms or ()) if t not in labels]
    if missing:
        raise ValueError(f"the batch has no labels for reward term(s) {missing} (labels: {sorted(labels)})")


class FlowGRPO:
    """FlowGRPO on a text-to-image card: ``init(key)``, jitted ``rollout``/``update`` and ``step``.

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}``; each prompt is sampled
    ``group_size`` times. ``reward_fn`` scores images, e.g. ``scorer_reward(scorer_card)``.
    """

    def __init__(self, card: Card, reward_fn: RewardFn, config: FlowGRPOConfig = FlowGRPOConfig()):
        self.config = config
        self.spec = card.spec
        self.reward_fn = reward_fn
        self.transformer = transformer_name(card)
        self._graphdef, self._params, self._frozen, self._rest = split_trainable(card, (self.transformer,))
        self.tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

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
        card = Card(self.components(jax.lax.stop_gradient(state.params), state.frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, cfg.group_size)
        keys = jax.random.split(key, ids.shape[0])
        generated = rollout.render(card, self.transformer, ids, keys, cfg.sampling, capture=True)
        rewards, advantages = rollout.score(self.reward_fn, generated.images, labels, cfg.group_size, cfg.adv_clip)
        return Rollout(generated, rewards, advantages)

    def step_stats(self, params: nnx.State, frozen: nnx.State, ro: Rollout) -> tuple[jax.Array, jax.Array]:
        """Per captured step ``(S, B)`` log-probs and ``(S, B, ...)`` SDE means of the rollout's samples
        under ``params`` (teacher-forced, vmapped over time; the trainer's own batching)."""
        model = self.components(params, frozen)[self.transformer]
        return rollout.generator_stats(model, ro.generated, self.config.sampling)

    def loss(self, params, state: FlowGRPOState, ro: Rollout) -> tuple[jax.Array, dict]:
        """Clipped PPO on every captured step + β·KL to the reference (scalar, metrics)."""
        model = self.components(params, state.frozen)[self.transformer]
        reference = self.components(state.reference, state.frozen)[self.transformer]
        return generator_loss(model, reference, ro.generated, ro.advantages, self.config)

    def _update(self, state: FlowGRPOState, ro: Rollout) -> tuple[FlowGRPOState, dict]:
        (loss, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(state.params, state, ro)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        new = state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state, step=state.step + 1)
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "grad_norm": optax.tree.norm(grads), "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> tuple[FlowGRPOState, dict]:
        """The pure, unjitted step (rollout + update), for custom ``jit``/sharding."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro)
        return state, {**metrics, "reward_mean": jnp.mean(ro.rewards), "reward_std": jnp.std(ro.rewards)}

    def step(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> tuple[FlowGRPOState, dict]:
        """Rollout then one update as ONE jitted function: ``(state, metrics)`` with the rollout's reward
        statistics. A non-finite loss or gradient leaves the weights unchanged (``metrics["skipped"] == 1``)."""
        check_batch(batch)
        return self._step(state, batch, key)
