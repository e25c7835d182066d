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

The rollout is the card's own program run with capture (``training.rollout``); the two updates
are the module-level pure ``lm_update`` (which ``JointMultiExpertRL`` ``vmap``s over its N
refiners) and ``flow_grpo.generator_update``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import registry, toy_unified
from jaxpipe.loops import ar, denoise
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import losses, ppo, rollout
from jaxpipe.training.finetune import guarded_update, split_trainable
from jaxpipe.training.flow_grpo import UPDATE_KEY, FlowGRPOConfig, RewardFn, check_batch, generator_minibatch_update

__all__ = [
    "UnifiedRLConfig", "UnifiedRLState", "UnifiedRollout", "UnifiedRL", "lm_update", "refine_rows", "reward_metrics",
    "reward_stats", "check_refine_batch",
]


@dataclasses.dataclass(frozen=True)
class UnifiedRLConfig:
    """Settings of a UnifiedRL run (hashable: static under ``jit``).

    group_size K and ``skip`` (samples per group that keep the original prompt, 0 <= skip < K);
    ``joint``: train the generator too (False = prompt-only); generator settings as in
    ``FlowGRPOConfig`` (``num_steps``, ``noise_level``, ``sde_window``, ``clip_eps``, ``beta``,
    ``learning_rate``, ``kl``; ``minibatches``, ``inner_epochs`` and ``timestep_fraction``: several
    updates per rollout, see ``training.ppo``, for both models); LM settings ``lm_learning_rate``, ``lm_beta`` (k3 KL weight),
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
    kl: str = "exact"
    minibatches: int = 1
    inner_epochs: int = 1
    timestep_fraction: float = 1.0

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
            kl=self.kl,
            minibatches=self.minibatches,
            inner_epochs=self.inner_epochs,
            timestep_fraction=self.timestep_fraction,
        )

    @property
    def schedule(self) -> ppo.Schedule:
        """How many updates each rollout feeds, both models alike (``training.ppo``)."""
        return self.generator.schedule

    @property
    def sampling(self) -> denoise.DenoiseConfig:
        """The generator's rollout policy on a default loop (see ``sampling_on``)."""
        return self.sampling_on(denoise.DenoiseConfig())

    def sampling_on(self, loop: denoise.DenoiseConfig) -> denoise.DenoiseConfig:
        """The generator's rollout policy on a card's denoise loop: SDE with capture when joint, the
        ODE when prompt-only; guidance 1 either way."""
        if self.joint:
            return self.generator.sampling_on(loop)
        return loop.replace(num_steps=self.num_steps, sampler="ode", sde_window=None, guidance=1.0)


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

    refinement: ar.Continuation
    refined: jax.Array
    text_ids: jax.Array
    generated: rollout.Generated
    rewards: jax.Array
    advantages: jax.Array


def refine_rows(group_size: int, skip: int, batch_rows: int) -> jax.Array:
    """``(B,)`` bool: rows that get a refinement (the first K − skip of every group)."""
    return (jnp.arange(batch_rows) % group_size) < group_size - skip


def lm_update(
    tx: optax.GradientTransformation,
    lm_of: Callable[[nnx.State], ar.Decoder],
    params: nnx.State,
    reference: nnx.State,
    opt_state: Any,
    refinement: ar.Continuation,
    advantages: jax.Array,
    config: UnifiedRLConfig,
) -> tuple[nnx.State, Any, jax.Array, dict, jax.Array]:
    """ONE refiner's optimiser step on its captured refinements: ``(params, opt_state, loss, metrics,
    grad norm)``. Token PG (PPO-clipped against the captured log-probs) + ``lm_beta`` · k3 KL to
    ``reference``; ``lm_of(params)`` builds the decoder. Pure, and free of any expert axis, so
    ``JointMultiExpertRL`` ``vmap``s it over N stacked refiners."""

    def loss(p):
        log_probs = rollout.token_log_probs(lm_of(p), refinement)
        ref_log_probs = rollout.token_log_probs(lm_of(reference), refinement) if config.lm_beta > 0 else None
        return losses.token_loss(
            log_probs,
            refinement.mask,
            advantages,
            ref_log_probs=ref_log_probs,
            beta=config.lm_beta,
            old_log_probs=refinement.log_prob,
            clip_eps=config.lm_clip_eps,
        )

    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value, metrics, optax.tree.norm(grads)


def prefixed(prefix: str, metrics: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {f"{prefix}{k}": v for k, v in metrics.items()}


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
        self.program = registry.default_program(card)
        self.max_prompt_words = card.spec.config.max_prompt_words
        # on-policy token gradients need the untempered policy's own samples
        self.ar_config = card.spec.loop(toy_unified.REFINE_LOOP).config.replace(temperature=1.0)
        self.sampling = config.sampling_on(card.spec.loop(toy_unified.DENOISE_LOOP).config)
        trainable = ("llm", "transformer") if config.joint else ("llm",)
        self._graphdef, params, frozen, self._rest = split_trainable(card, trainable)
        self._lm_graphdef = nnx.graphdef(card["llm"])
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

    def _llm(self, params: nnx.State) -> ar.Decoder:
        return nnx.merge(self._lm_graphdef, params["llm"])

    def _generator_of(self, lm: nnx.State, frozen: nnx.State) -> Callable[[nnx.State], tuple]:
        return lambda generator: (self.components(lm, generator, frozen)["transformer"],)

    # ---------------------------------------------------------------------------------- rollout
    def _rollout(self, state: UnifiedRLState, batch: Mapping[str, Any], key: jax.Array) -> UnifiedRollout:
        cfg = self.config
        sg = jax.lax.stop_gradient
        card = Card(self.components(sg(state.lm), sg(state.generator), state.frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, cfg.group_size)
        rows = ids.shape[0]
        refined = refine_rows(cfg.group_size, cfg.skip, rows)
        slots = rollout.text_slots(self.program, ids, jax.random.split(key, rows), refined)
        settings = loop_settings(**{toy_unified.REFINE_LOOP: self.ar_config, toy_unified.DENOISE_LOOP: self.sampling})
        captured = (toy_unified.REFINE_LOOP, toy_unified.DENOISE_LOOP) if cfg.joint else (toy_unified.REFINE_LOOP,)
        run = rollout.run(card, self.program, settings, slots, capture=captured)
        refinement = restrict(rollout.refinement(run, toy_unified.REFINE_LOOP), refined)
        images = run.artifacts["image"]
        generated = rollout.generated(run, toy_unified.DENOISE_LOOP) if cfg.joint else rollout.Generated(images, None, None)
        rewards, advantages = rollout.score(self.reward_fn, images, labels, cfg.group_size, cfg.adv_clip)
        return UnifiedRollout(refinement, refined, run.slots["refined"], generated, rewards, advantages)

    # ----------------------------------------------------------------------------------- update
    def _update(self, state: UnifiedRLState, ro: UnifiedRollout, key: jax.Array | None = None) -> tuple[UnifiedRLState, dict]:
        """Every update the rollout feeds (``config.schedule``; each updates the LM, then the generator
        when joint, on the same minibatch rows), then the all-or-nothing finite guard."""
        cfg = self.config
        generator_of = self._generator_of(state.lm, state.frozen)

        def one(carry, rows, k):
            lm, lm_opt, generator, generator_opt = carry
            refinement, advantages = ro.refinement, ro.advantages
            if rows is not None:
                refinement, advantages = jax.tree.map(lambda a: a[rows], refinement), advantages[rows]
            lm, lm_opt, lm_value, lm_metrics, lm_grad_norm = lm_update(
                self.lm_tx, self._llm, lm, state.lm_reference, lm_opt, refinement, advantages, cfg
            )
            finite = jnp.isfinite(lm_value) & jnp.isfinite(lm_grad_norm)
            metrics = {**prefixed("lm_", lm_metrics), "lm_grad_norm": lm_grad_norm}
            if cfg.joint:
                generator, generator_opt, value, gen_metrics, grad_norm = generator_minibatch_update(
                    self.generator_tx, generator_of, generator, state.generator_reference, generator_opt, ro.generated,
                    ro.advantages, rows, k, cfg.generator, self.sampling,
                )
                finite = finite & jnp.isfinite(value) & jnp.isfinite(grad_norm)
                metrics.update(prefixed("gen_", gen_metrics), gen_grad_norm=grad_norm)
            return (lm, lm_opt, generator, generator_opt), metrics, finite

        carry = (state.lm, state.lm_opt, state.generator, state.generator_opt)
        (lm, lm_opt, generator, generator_opt), metrics, finite = ppo.run(one, carry, key, ro.advantages.shape[0], cfg.schedule)
        new = state._replace(lm=lm, lm_opt=lm_opt, generator=generator, generator_opt=generator_opt, step=state.step + 1)
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: UnifiedRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[UnifiedRLState, dict]:
        """The pure, unjitted step (rollout + both updates), for custom ``jit``/sharding."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))
        return state, {**metrics, **reward_metrics(ro)}

    def step(self, state: UnifiedRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[UnifiedRLState, dict]:
        """Rollout then its updates as ONE jitted function: ``(state, metrics)``. A non-finite loss or
        gradient leaves every weight unchanged (``metrics["skipped"] == 1``)."""
        self.check_batch(batch)
        return self._step(state, batch, key)

    def check_batch(self, batch: Mapping[str, Any]) -> None:
        """A clear error for a malformed batch, a prompt too long to refine (when the ids are concrete) or
        minibatches that do not divide the rollout."""
        check_refine_batch(batch, self.max_prompt_words)
        self.config.schedule.check_rows(batch["ids"].shape[0] * self.config.group_size)


def restrict(refinement: ar.Continuation, refined: jax.Array) -> ar.Continuation:
    """``refinement`` with its mask (and log-probs) kept only on ``refined`` rows (``refined`` broadcasts
    against the leading axes of ``mask`` without its last)."""
    mask = refinement.mask & refined[..., None]
    return refinement._replace(mask=mask, log_prob=jnp.where(mask, refinement.log_prob, 0.0))


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
