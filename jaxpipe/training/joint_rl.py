"""``JointMultiExpertRL``: N refiner LMs and the generator from one reward (DESIGN §6, §10).

The ``UnifiedRL`` step with N refiners. One rollout: per prompt a group of K samples; on the first
K − skip every refiner continues the prompt (its own slot, its own key), the words are composed
into one prompt, rendered once; one reward with per-term parts. Then

- the N refiner updates are ONE mapped call of the single-expert update over the stacked refiner
  params, their frozen references and their stacked optimiser states (no Python loop over experts
  anywhere in the step): a ``jax.vmap`` or a ``jax.lax.map`` (``JointRLConfig.expert_map``, below);
- the generator gets FlowGRPO's update from the total reward (``joint_generator=False`` freezes it).

Credit: ``"shared"`` gives every refiner the total reward's group advantage (faithful to UniRL);
``"per_expert"`` gives refiner i the group advantage of its own reward term (``expert_terms[i]``,
by default the attribute its slot owns). With N = 1, no slots and ``"shared"`` credit this is
``UnifiedRL`` step for step (same keys, same math): both run the card's program with capture and
share the module-level pure updates (``unified_rl.lm_update``, mapped over the experts here;
``flow_grpo.generator_update``).

The expert map is a policy (``expert_map``): ``"vmap"`` batches the N experts' math (one bigger
matmul per layer); ``"map"`` is a ``lax.map`` (a scan inside the same jit: the experts one after
another, no batching, no per-call cost); both compute the same update (equal within float
reordering, ~1e-7). ``"auto"`` picks ``"map"`` on one CPU device and ``"vmap"`` on GPU/TPU (and on
a multi-device mesh, whose ``expert`` axis a vmap keeps split across devices), from
``benchmarks/joint_rl.py`` (RESULTS.md, section joint_rl, 2 shared CPU cores, refiner dim 64 × 2
layers): at 16 rows per expert (4 prompts × 4) and N = 8 the ``lax.map`` takes 90 ms against 137 ms
for the vmap (16 and 2 experts: 176 vs 280 ms, 25 vs 32 ms), and ~10.8 vs ~17.5 ms per expert in
the linear fits; at 4 rows (1 × 4) the vmap is ahead, but by less (N = 8: 26 vs 29 ms), so ``"map"``
loses little where it loses and wins ~1.5× where the work per expert grows. On an accelerator the
batched math is what fills the device, so ``"vmap"`` (not measured here: no GPU on this machine).
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
from jaxpipe.loops import ar
from jaxpipe.cards import toy_multi_expert, registry
from jaxpipe.nn import MaskedLM
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import losses, ppo, rollout
from jaxpipe.training.finetune import guarded_update, split_trainable
from jaxpipe.training.flow_grpo import UPDATE_KEY, generator_minibatch_update
from jaxpipe.training.unified_rl import (
    UnifiedRLConfig,
    check_refine_batch,
    lm_update,
    prefixed,
    refine_rows,
    restrict,
    reward_stats,
)

__all__ = ["JointRLConfig", "JointRLState", "JointRollout", "JointMultiExpertRL", "CREDITS", "EXPERT_MAPS", "map_experts",
           "resolve_expert_map"]

CREDITS = ("shared", "per_expert")
EXPERT_MAPS = ("auto", "vmap", "map")


@dataclasses.dataclass(frozen=True)
class JointRLConfig(UnifiedRLConfig):
    """``UnifiedRLConfig`` plus ``credit`` (``"shared"`` | ``"per_expert"``) and ``expert_terms``
    (the reward term refiner i is credited with under ``"per_expert"``; ``None``: its slot's
    attribute). ``joint`` switches the generator's training on (False: prompt-only); the
    generator always learns from the total reward. ``expert_map``: how the N refiner updates are
    mapped over the expert axis, ``"vmap"`` | ``"map"`` (``lax.map``) | ``"auto"`` (``"map"`` on one CPU
    device, ``"vmap"`` on GPU/TPU or a multi-device mesh; the module docstring has the measurements)."""

    credit: str = "shared"
    expert_terms: tuple[str, ...] | None = None
    expert_map: str = "auto"

    def __post_init__(self):
        if self.credit not in CREDITS:
            raise ValueError(f"credit must be one of {CREDITS} (got {self.credit!r})")
        if self.expert_map not in EXPERT_MAPS:
            raise ValueError(f"expert_map must be one of {EXPERT_MAPS} (got {self.expert_map!r})")
        super().__post_init__()


def resolve_expert_map(expert_map: str, backend: str | None = None, devices: int | None = None) -> str:
    """``"vmap"`` or ``"map"``: ``expert_map`` itself, or for ``"auto"`` the measured choice: ``"map"`` on
    one CPU device, ``"vmap"`` on GPU/TPU or over several devices (a mesh may split the expert axis,
    which a vmap keeps parallel and a ``lax.map`` would walk through). ``backend`` / ``devices``:
    JAX's default backend and its device count unless given."""
    if expert_map not in EXPERT_MAPS:
        raise ValueError(f"expert_map must be one of {EXPERT_MAPS} (got {expert_map!r})")
    if expert_map != "auto":
        return expert_map
    backend = jax.default_backend() if backend is None else backend
    devices = jax.device_count() if devices is None else devices
    return "map" if backend == "cpu" and devices == 1 else "vmap"


def map_experts(fn, expert_map: str, *stacked):
    """``fn`` applied to every slice of ``stacked`` (pytrees with a leading expert axis N), outputs stacked
    on that axis: one ``jax.vmap`` (``"vmap"``) or one ``jax.lax.map`` (``"map"``)."""
    if expert_map == "vmap":
        return jax.vmap(fn)(*stacked)
    if expert_map == "map":
        return jax.lax.map(lambda args: fn(*args), stacked)
    raise ValueError(f"expert_map must be 'vmap' or 'map' here (got {expert_map!r}; resolve 'auto' first)")


class JointRLState(NamedTuple):
    """Stacked refiner params/references/optimiser states (leading axis N), the generator's, the frozen
    rest, step. ``joint_generator=False``: ``generator_reference`` and ``generator_opt`` are ``None``."""

    refiners: nnx.State
    generator: nnx.State
    frozen: nnx.State
    refiner_reference: nnx.State
    generator_reference: nnx.State | None
    refiner_opt: Any
    generator_opt: Any
    step: jax.Array


class JointRollout(NamedTuple):
    """One N-way rollout (B = P·K rows): stacked refinements (fields ``(N, B, ...)``, masks restricted to
    refined rows), ``refined`` ``(B,)``, composed text ids ``(B, L)``, the rendered batch, reward parts
    ``{term: (B,)}``, total rewards ``(B,)``, generator advantages ``(B,)``, refiner advantages ``(N, B)``."""

    refinements: ar.Continuation
    refined: jax.Array
    text_ids: jax.Array
    generated: rollout.Generated
    parts: dict[str, jax.Array]
    rewards: jax.Array
    advantages: jax.Array
    expert_advantages: jax.Array


class JointMultiExpertRL:
    """N-way joint RL on a ``multi-expert`` card: ``init``, jitted ``rollout``/``update``, ``step`` (one jit).

    ``reward_fn(images, labels)`` returns the reward parts ``{term: (B,)}`` (e.g.
    ``scorer_reward_parts``) — required for ``"per_expert"`` credit — or the total ``(B,)``.
    Batches as in ``UnifiedRL``.
    """

    def __init__(self, card: Card, reward_fn, config: JointRLConfig = JointRLConfig()):
        if toy_multi_expert.COMPONENT not in card.components:
            raise ValueError(f"JointMultiExpertRL needs a 'multi-expert' card (stacked 'refiners'); {card.model_id!r} has {sorted(card.components)}")
        self.config = config
        self.spec = card.spec
        self.reward_fn = reward_fn
        self.program = registry.default_program(card)
        self.num_refiners = card.spec.config.num_refiners
        self.max_prompt_words = card.spec.config.max_prompt_words
        self.ar_config = card.spec.loop(toy_multi_expert.REFINE_LOOP).config.replace(temperature=1.0)
        self.sampling = config.sampling_on(card.spec.loop(toy_multi_expert.DENOISE_LOOP).config)
        self.allowed = jnp.asarray(card.spec.config.allowed_tokens())
        self.expert_map = resolve_expert_map(config.expert_map)
        self.expert_terms = config.expert_terms or tuple(card.spec.config.slot(i) for i in range(self.num_refiners))
        if config.credit == "per_expert":
            if len(self.expert_terms) != self.num_refiners or None in self.expert_terms:
                raise ValueError(
                    f"per_expert credit needs one reward term per refiner ({self.num_refiners}); got {self.expert_terms} "
                    "(pass expert_terms, or give the card slots)"
                )
        lm = card[toy_multi_expert.COMPONENT]
        self._lm_graphdef = nnx.graphdef(lm)
        trainable = (toy_multi_expert.COMPONENT, "transformer") if config.joint else (toy_multi_expert.COMPONENT,)
        self._graphdef, params, frozen, self._rest = split_trainable(card, trainable)
        self._refiners = nnx.State({toy_multi_expert.COMPONENT: params[toy_multi_expert.COMPONENT]})
        self._generator = nnx.State({"transformer": (params if config.joint else frozen)["transformer"]})
        self._frozen = nnx.State({k: frozen[k] for k in frozen if k != "transformer"})
        self.refiner_tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.lm_learning_rate))
        self.generator_tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

    # ------------------------------------------------------------------------------------ state
    def init(self, key: jax.Array | None = None) -> JointRLState:
        """Start from the card's weights; references are frozen copies; refiner optimiser states are
        stacked (``vmap`` of ``init``)."""
        del key
        copy = lambda tree: jax.tree.map(jnp.array, tree)
        refiners, generator = copy(self._refiners), copy(self._generator)
        joint = self.config.joint
        return JointRLState(
            refiners=refiners,
            generator=generator,
            frozen=copy(self._frozen),
            refiner_reference=copy(self._refiners),
            generator_reference=copy(self._generator) if joint else None,
            refiner_opt=jax.vmap(self.refiner_tx.init)(refiners),
            generator_opt=self.generator_tx.init(generator) if joint else None,
            step=jnp.zeros((), jnp.int32),
        )

    def components(self, refiners: nnx.State, generator: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**refiners, **generator, **frozen}), self._rest)

    def card(self, state: JointRLState) -> Card:
        """The card with the state's refiner and generator weights."""
        return Card(self.components(state.refiners, state.generator, state.frozen), self.spec)

    def _expert(self, params: nnx.State, allowed: jax.Array):
        """Refiner params of ONE expert (no expert axis) as a slot-restricted LM."""
        return MaskedLM(nnx.merge(self._lm_graphdef, params[toy_multi_expert.COMPONENT]), allowed)

    def _generator_of(self, refiners: nnx.State, frozen: nnx.State):
        return lambda generator: (self.components(refiners, generator, frozen)["transformer"],)

    # ---------------------------------------------------------------------------------- rollout
    def _rollout(self, state: JointRLState, batch: Mapping[str, Any], key: jax.Array) -> JointRollout:
        cfg = self.config
        sg = jax.lax.stop_gradient
        card = Card(self.components(sg(state.refiners), sg(state.generator), state.frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, cfg.group_size)
        rows = ids.shape[0]
        refined = refine_rows(cfg.group_size, cfg.skip, rows)
        slots = rollout.text_slots(self.program, ids, jax.random.split(key, rows), refined)
        settings = loop_settings(**{toy_multi_expert.REFINE_LOOP: self.ar_config, toy_multi_expert.DENOISE_LOOP: self.sampling})
        captured = (toy_multi_expert.DENOISE_LOOP,) if cfg.joint else ()
        run = rollout.run(card, self.program, settings, slots, capture=captured)
        refinements = restrict(toy_multi_expert.expert_major(run.slots["refinements"]), refined[None, :])
        images = run.artifacts["image"]
        generated = rollout.generated(run, toy_multi_expert.DENOISE_LOOP) if cfg.joint else rollout.Generated(images, None, None)
        parts = self.reward_fn(images, labels)
        if isinstance(parts, Mapping):
            rewards = sum(jnp.asarray(p, jnp.float32) for p in parts.values())
        else:
            if cfg.credit == "per_expert":
                raise ValueError("per_expert credit needs a reward_fn that returns its parts {term: (B,)} (e.g. scorer_reward_parts)")
            rewards, parts = jnp.asarray(parts, jnp.float32), {}
        group = lambda r: losses.group_advantages(r.reshape(-1, cfg.group_size), adv_clip=cfg.adv_clip).reshape(-1)
        advantages = group(rewards)
        if cfg.credit == "per_expert":
            missing = [t for t in self.expert_terms if t not in parts]
            if missing:
                raise ValueError(f"per_expert credit: the reward has no part(s) {missing} (parts: {sorted(parts)})")
            expert_advantages = jnp.stack([group(jnp.asarray(parts[t], jnp.float32)) for t in self.expert_terms])
        else:
            expert_advantages = jnp.broadcast_to(advantages, (self.num_refiners, rows))
        return JointRollout(refinements, refined, run.slots["composed"], generated, dict(parts), rewards, advantages, expert_advantages)

    # ----------------------------------------------------------------------------------- update
    def expert_update(self, params, reference, opt_state, allowed, refinement: ar.Continuation, advantages):
        """ONE refiner's step (no expert axis): ``unified_rl.lm_update`` on its slot-restricted LM,
        ``(params, opt_state, loss, metrics, grad norm)``; the update maps it over the experts (``expert_map``)."""
        lm_of = lambda p: self._expert(p, allowed)
        return lm_update(self.refiner_tx, lm_of, params, reference, opt_state, refinement, advantages, self.config)

    def _update(self, state: JointRLState, ro: JointRollout, key: jax.Array | None = None) -> tuple[JointRLState, dict]:
        """Every update the rollout feeds (``config.schedule``): per minibatch, the N refiner updates as
        ONE mapped call (``expert_map``) on the same rows, then the generator when joint; then the
        all-or-nothing guard."""
        cfg = self.config
        generator_of = self._generator_of(state.refiners, state.frozen)

        def one(carry, rows, k):
            refiners, refiner_opt, generator, generator_opt = carry
            refinements, expert_advantages = ro.refinements, ro.expert_advantages
            if rows is not None:  # the expert axis leads: rows are axis 1
                refinements = jax.tree.map(lambda a: a[:, rows], refinements)
                expert_advantages = expert_advantages[:, rows]
            refiners, refiner_opt, values, lm_metrics, grad_norms = map_experts(
                self.expert_update, self.expert_map,
                refiners, state.refiner_reference, refiner_opt, self.allowed, refinements, expert_advantages,
            )
            finite = jnp.all(jnp.isfinite(values)) & jnp.all(jnp.isfinite(grad_norms))
            metrics = {f"lm_{k}": jnp.mean(v) for k, v in lm_metrics.items()}
            metrics["lm_grad_norm"] = jnp.mean(grad_norms)
            metrics.update({f"{toy_multi_expert.EXPERT_PREFIX}{i}_loss": values[i] for i in range(self.num_refiners)})
            if cfg.joint:
                generator, generator_opt, value, gen_metrics, grad_norm = generator_minibatch_update(
                    self.generator_tx, generator_of, generator, state.generator_reference, generator_opt, ro.generated,
                    ro.advantages, rows, k, cfg.generator, self.sampling,
                )
                finite = finite & jnp.isfinite(value) & jnp.isfinite(grad_norm)
                metrics.update(prefixed("gen_", gen_metrics), gen_grad_norm=grad_norm)
            return (refiners, refiner_opt, generator, generator_opt), metrics, finite

        carry = (state.refiners, state.refiner_opt, state.generator, state.generator_opt)
        (refiners, refiner_opt, generator, generator_opt), metrics, finite = ppo.run(
            one, carry, key, ro.advantages.shape[0], cfg.schedule
        )
        new = state._replace(refiners=refiners, refiner_opt=refiner_opt, generator=generator, generator_opt=generator_opt,
                             step=state.step + 1)
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        for i in range(self.num_refiners):
            metrics[f"{toy_multi_expert.EXPERT_PREFIX}{i}_advantage_std"] = jnp.std(ro.expert_advantages[i])
        return new, {**metrics, "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: JointRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[JointRLState, dict]:
        """The pure, unjitted step (rollout + every update) for custom ``jit``/sharding (``distributed.sharded_step``)."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))
        return state, {**metrics, **reward_metrics(ro)}

    def step(self, state: JointRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[JointRLState, dict]:
        """Rollout then every update as ONE jitted function: ``(state, metrics)``; a non-finite loss or
        gradient anywhere leaves every weight unchanged (``metrics["skipped"] == 1``)."""
        check_refine_batch(batch, self.max_prompt_words)
        self.config.schedule.check_rows(batch["ids"].shape[0] * self.config.group_size)
        return self._step(state, batch, key)


def reward_metrics(ro: JointRollout) -> dict[str, jax.Array]:
    """``UnifiedRL``'s reward statistics (tokens summed over refiners) plus the mean of every reward part."""
    tokens = jnp.sum(ro.refinements.mask, axis=(0, 2))
    parts = {f"reward_{term}": jnp.mean(part) for term, part in ro.parts.items()}
    return {**reward_stats(ro.rewards, ro.refined, tokens), **parts}
