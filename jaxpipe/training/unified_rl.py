"""``UnifiedRL``: one reward trains a refiner LM and the generator through their own loops (DESIGN §6, §10).

PromptRL shape. Per prompt a group of K samples: the first K − skip each get their own sampled
refinement from the LM (the card's ``refine`` AR loop, capture on), the last ``skip`` keep the
original prompt; every sample is rendered once by the card's denoise loop (SDE with capture when
the generator trains, ODE when it is frozen). One reward and one group advantage then drive

- the LM: token policy gradient ``-A · Σ_t log π(y_t | prompt, y_<t) / n`` on the refined samples
  (PPO-clipped per token) + ``lm_beta ·`` k3 KL to the frozen reference LM;
- the generator: FlowGRPO's clipped PPO on the captured steps + ``beta ·`` KL (``generator_loss``),

each with its own optimiser and learning rate. ``joint=False`` is prompt-only: the generator is
frozen (its weights stay bit-identical), rolled out with the ODE, and never differentiated.
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
from jaxpipe.cards import unified
from jaxpipe.loops import denoise
from jaxpipe.training import losses, rollout
from jaxpipe.training.finetune import guarded_update, split_trainable
from jaxpipe.training.flow_grpo import FlowGRPOConfig, RewardFn, check_batch, generator_loss

__all__ = ["UnifiedRLConfig", "UnifiedRLState", "UnifiedRollout", "UnifiedRL", "refine_rows", "reward_metrics", "reward_stats", "check_refine_batch", "finish_update"]


@dataclasses.dataclass(frozen=True)
class UnifiedRLConfig:
    """Settings of a UnifiedRL run (hashable: static under ``jit``).

    group_size K and ``skip`` (samples per group that keep the original prompt, 0 <= skip < K);
    ``joint``: train the generator too (False = prompt-only); generator settings as in
    ``FlowGRPOConfig`` (``num_steps``, ``noise_level``, ``sde_window``, ``clip_eps``, ``beta``,
    ``learning_rate``); LM settings ``lm_learning_rate``, ``lm_beta`` (k3 KL weight),
    ``lm_clip_eps`` (per-token ratio clip). Refinements are sampled at temperature 1 (on-policy).
    """

    group_size: int = 4
    skip: int = 1
    joint: bool = True
    num_steps: int = 8
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    clip_eps: float = 1e-3
    adv_clip: float = 5.0
    beta: float = 0.04
    learning_rate: float = 1e-4
    lm_learning_rate: float = 1e-3
    lm_beta: float = 0.01
    lm_clip_eps: float = 0.2
    grad_clip: float = 1.0

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"group_size (K) must be >= 2 for group-relative advantages (got {self.group_size})")
        if not 0 <= self.skip < self.group_size:
            raise ValueError(
                f"skip must be in 0..K-1 = 0..{self.group_size - 1}: at least one sample per group must be refined (got {self.skip})"
            )
        if not self.lm_learning_rate > 0 or self.lm_beta < 0 or not self.lm_clip_eps > 0:
            raise ValueError("lm_learning_rate and lm_clip_eps must be > 0 and lm_beta >= 0")
        self.generator  # validates the generator settings

    @property
    def generator(self) -> FlowGRPOConfig:
        """The generator's FlowGRPO settings (its rollout policy is ``generator.sampling``)."""
        return FlowGRPOConfig(
            group_size=self.group_size,
            num_steps=self.num_steps,
            noise_level=self.noise_level,
            sde_window=self.sde_window,
            clip_eps=self.clip_eps,
            adv_clip=self.adv_clip,
            beta=self.beta,
            learning_rate=self.learning_rate,
            grad_clip=self.grad_clip,
        )

    @property
    def sampling(self) -> denoise.DenoiseConfig:
        """The generator's rollout policy: SDE with capture when joint, the ODE when prompt-only (guidance 1)."""
        if self.joint:
            return self.generator.sampling
        return denoise.DenoiseConfig(num_steps=self.num_steps, sampler="ode", guidance=1.0)


class UnifiedRLState(NamedTuple):
    """LM and DiT params, their frozen references and optimiser states, the frozen rest, step.

    Prompt-only (``joint=False``): ``generator_reference`` and ``generator_opt`` are ``None``.
    """

    lm: nnx.State
    generator: nnx.State
    frozen: nnx.State
    lm_reference: nnx.State
    generator_reference: nnx.State | None
    lm_opt: Any
    generator_opt: Any
    step: jax.Array


class UnifiedRollout(NamedTuple):
    """One joint rollout (B = P·K rows): the captured refinements (mask restricted to refined rows),
    ``refined`` ``(B,)`` bool, the text ids rendered ``(B, L)``, the rendered batch, rewards, advantages."""

    refinement: rollout.Refinement
    refined: jax.Array
    text_ids: jax.Array
    generated: rollout.Generated
    rewards: jax.Array
    advantages: jax.Array


def refine_rows(group_size: int, skip: int, batch_rows: int) -> jax.Array:
    """``(B,)`` bool: rows that get a refinement (the first K − skip of every group)."""
    return (jnp.arange(batch_rows) % group_size) < group_size - skip


class UnifiedRL:
    """UnifiedRL on a ``unified`` card: ``init(key)``, jitted ``rollout``/``update``, ``step`` (one jit).

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}``: prompts of at most
    ``card.spec.config.max_prompt_words`` words and the labels the reward scores (a label the prompt
    does not name is a preference the LM can learn to ask for).
    """

    def __init__(self, card: Card, reward_fn: RewardFn, config: UnifiedRLConfig = UnifiedRLConfig()):
        for name in ("llm", "transformer", "text_encoder", "vae"):
            if name not in card.components:
                raise ValueError(f"UnifiedRL needs a card with {name!r} (a 'unified' card); {card.model_id!r} has {sorted(card.components)}")
        self.config = config
        self.spec = card.spec
        self.reward_fn = reward_fn
        self.eos = unified.eos_id(card)
        self.max_prompt_words = card.spec.config.max_prompt_words
        # on-policy token gradients need the untempered policy's own samples
        self.ar_config = card.spec.loop(unified.REFINE_LOOP).config.replace(temperature=1.0)
        trainable = ("llm", "transformer") if config.joint else ("llm",)
        self._graphdef, params, frozen, self._rest = split_trainable(card, trainable)
        self._lm = nnx.State({"llm": params["llm"]})
        self._generator = nnx.State({"transformer": (params if config.joint else frozen)["transformer"]})
        self._frozen = nnx.State({k: frozen[k] for k in frozen if k != "transformer"})
        self.lm_tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.lm_learning_rate))
        self.generator_tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

    # ------------------------------------------------------------------------------------ state
    def init(self, key: jax.Array | None = None) -> UnifiedRLState:
        """Start from the card's weights; the references are frozen copies of the trained models."""
        del key
        copy = lambda tree: jax.tree.map(jnp.array, tree)
        lm, generator, frozen = copy(self._lm), copy(self._generator), copy(self._frozen)
        joint = self.config.joint
        return UnifiedRLState(
            lm=lm,
            generator=generator,
            frozen=frozen,
            lm_reference=copy(self._lm),
            generator_reference=copy(self._generator) if joint else None,
            lm_opt=self.lm_tx.init(lm),
            generator_opt=self.generator_tx.init(generator) if joint else None,
            step=jnp.zeros((), jnp.int32),
        )

    def components(self, lm: nnx.State, generator: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**lm, **generator, **frozen}), self._rest)

    def card(self, state: UnifiedRLState) -> Card:
        """The card with the state's LM and generator weights."""
        return Card(self.components(state.lm, state.generator, state.frozen), self.spec)

    # ---------------------------------------------------------------------------------- rollout
    def _rollout(self, state: UnifiedRLState, batch: Mapping[str, Any], key: jax.Array) -> UnifiedRollout:
        cfg = self.config
        sg = jax.lax.stop_gradient
        card = Card(self.components(sg(state.lm), sg(state.generator), state.frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, cfg.group_size)
        rows = ids.shape[0]
        keys = jax.random.split(key, rows)
        lm_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
        gen_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
        refinement = rollout.refine(card["llm"], ids, lm_keys, self.ar_config)
        refined = refine_rows(cfg.group_size, cfg.skip, rows)
        mask = refinement.mask & refined[:, None]
        refinement = refinement._replace(mask=mask, log_prob=jnp.where(mask, refinement.log_prob, 0.0))
        text_ids = jnp.where(refined[:, None], unified.refined_ids(refinement.tokens, self.eos, ids.shape[1]), ids)
        generated = rollout.render(card, "transformer", text_ids, gen_keys, cfg.sampling, capture=cfg.joint)
        rewards, advantages = rollout.score(self.reward_fn, generated.images, labels, cfg.group_size, cfg.adv_clip)
        return UnifiedRollout(refinement, refined, text_ids, generated, rewards, advantages)

    # ----------------------------------------------------------------------------------- losses
    def lm_loss(self, lm: nnx.State, state: UnifiedRLState, ro: UnifiedRollout) -> tuple[jax.Array, dict]:
        """Token PG (PPO-clipped against the captured log-probs) + ``lm_beta`` · k3 KL to the reference LM."""
        cfg = self.config
        llm = self.components(lm, state.generator, state.frozen)["llm"]
        log_probs = rollout.token_log_probs(llm, ro.refinement)
        ref_log_probs = None
        if cfg.lm_beta > 0:
            reference = self.components(state.lm_reference, state.generator, state.frozen)["llm"]
            ref_log_probs = rollout.token_log_probs(reference, ro.refinement)
        loss, metrics = losses.token_loss(
            log_probs,
            ro.refinement.mask,
            ro.advantages,
            ref_log_probs=ref_log_probs,
            beta=cfg.lm_beta,
            old_log_probs=ro.refinement.log_prob,
            clip_eps=cfg.lm_clip_eps,
        )
        return loss, {f"lm_{k}": v for k, v in metrics.items()}

    def generator_loss(self, generator: nnx.State, state: UnifiedRLState, ro: UnifiedRollout) -> tuple[jax.Array, dict]:
        """FlowGRPO's objective on the generator's captured steps (joint mode only)."""
        model = self.components(state.lm, generator, state.frozen)["transformer"]
        reference = self.components(state.lm, state.generator_reference, state.frozen)["transformer"]
        loss, metrics = generator_loss(model, reference, ro.generated, ro.advantages, self.config.generator)
        return loss, {f"gen_{k}": v for k, v in metrics.items()}

    def _update(self, state: UnifiedRLState, ro: UnifiedRollout) -> tuple[UnifiedRLState, dict]:
        (lm_value, lm_metrics), lm_grads = jax.value_and_grad(self.lm_loss, has_aux=True)(state.lm, state, ro)
        updates, lm_opt = self.lm_tx.update(lm_grads, state.lm_opt, state.lm)
        new = state._replace(lm=optax.apply_updates(state.lm, updates), lm_opt=lm_opt, step=state.step + 1)
        finite = jnp.isfinite(lm_value) & jnp.isfinite(optax.tree.norm(lm_grads))
        metrics = {**lm_metrics, "lm_grad_norm": optax.tree.norm(lm_grads)}
        return finish_update(self, state, ro, new, finite, metrics)

    def step_fn(self, state: UnifiedRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[UnifiedRLState, dict]:
        """The pure, unjitted step (rollout + both updates), for custom ``jit``/sharding."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro)
        return state, {**metrics, **reward_metrics(ro)}

    def step(self, state: UnifiedRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[UnifiedRLState, dict]:
        """Rollout then both updates as ONE jitted function: ``(state, metrics)``. A non-finite loss or
        gradient leaves every weight unchanged (``metrics["skipped"] == 1``)."""
        self.check_batch(batch)
        return self._step(state, batch, key)

    def check_batch(self, batch: Mapping[str, Any]) -> None:
        """A clear error for a malformed batch or a prompt too long to refine (when the ids are concrete)."""
        check_refine_batch(batch, self.max_prompt_words)


def check_refine_batch(batch: Mapping[str, Any], max_words: int) -> None:
    """``check_batch`` plus: every prompt leaves the refiner(s) room (at most ``max_words`` words; checked
    when the ids are concrete)."""
    check_batch(batch)
    try:
        longest = int(jnp.max(jnp.sum(jnp.asarray(batch["ids"]) != 0, axis=1)))
    except jax.errors.ConcretizationTypeError:
        return
    if longest > max_words:
        raise ValueError(f"a prompt has {longest} words; the refiner(s) need room to add theirs, so prompts may have at most {max_words}")


def finish_update(method, state, ro, new, finite: jax.Array, metrics: dict):
    """The generator half of a joint update (FlowGRPO on ``state.generator`` when ``method.config.joint``),
    then the all-or-nothing finite guard: ``(new state, metrics)``. Shared by ``UnifiedRL`` and
    ``JointMultiExpertRL`` (both states have ``generator``/``generator_opt``; both methods ``generator_loss``)."""
    if method.config.joint:
        (value, gen_metrics), grads = jax.value_and_grad(method.generator_loss, has_aux=True)(state.generator, state, ro)
        updates, opt = method.generator_tx.update(grads, state.generator_opt, state.generator)
        new = new._replace(generator=optax.apply_updates(state.generator, updates), generator_opt=opt)
        finite = finite & jnp.isfinite(value) & jnp.isfinite(optax.tree.norm(grads))
        metrics = {**metrics, **gen_metrics, "gen_grad_norm": optax.tree.norm(grads)}
    new = guarded_update(finite, new, state._replace(step=state.step + 1))
    return new, {**metrics, "skipped": 1.0 - finite.astype(jnp.float32)}


def reward_metrics(ro: UnifiedRollout) -> dict[str, jax.Array]:
    """Reward statistics of a rollout (see ``reward_stats``)."""
    return reward_stats(ro.rewards, ro.refined, jnp.sum(ro.refinement.mask, axis=-1))


def reward_stats(rewards: jax.Array, refined: jax.Array, tokens: jax.Array) -> dict[str, jax.Array]:
    """Mean/std of ``rewards`` ``(B,)``, split into ``refined`` ``(B,)`` rows and original-prompt rows (a
    split with no rows reports 0), and the mean number of refinement ``tokens`` ``(B,)`` per refined row."""
    refined = refined.astype(jnp.float32)
    mean_over = lambda values, w: jnp.sum(values * w) / jnp.maximum(jnp.sum(w), 1.0)
    return {
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "reward_refined": mean_over(rewards, refined),
        "reward_original": mean_over(rewards, 1.0 - refined),
        "refined_tokens": mean_over(tokens.astype(jnp.float32), refined),
    }
