"""Joint RL of refiner LMs and a generator from one reward: ``UnifiedRL`` (one refiner) and ``JointMultiExpertRL`` (N).

PromptRL's shape (``training.refine``). One rollout: per prompt a group of K samples; on the first
K − skip the refiner(s) continue the prompt (sampled at temperature 1, capture on), the last
``skip`` keep it as written; every sample is rendered once by the card's denoise loop (the SDE with
capture when the generator trains, the ODE when it is frozen). One reward and one group advantage
then drive

- each refiner: the token policy gradient on its continuations, PPO-clipped per token, plus
  ``refiner.beta ·`` the k3 KL to its frozen reference (``refine.refiner_update``);
- the generator: FlowGRPO's clipped PPO on the captured steps plus ``generator.beta ·`` KL
  (``grpo.generator_update``), unless ``joint=False`` (prompt-only: the generator is frozen,
  bit-identical, and never differentiated),

each part with its own optimiser. ``JointMultiExpertRL`` runs N refiners stored stacked on a
leading expert axis: their N updates are ONE mapped call of the single-refiner update over the
stacked params, references and optimiser states (no Python loop over experts anywhere in the
step), a ``jax.vmap`` or a ``jax.lax.map`` (``expert_map``). Credit: ``"shared"`` gives every
refiner the total reward's group advantage (UniRL's choice); ``"per_expert"`` gives refiner i the
group advantage of its own reward part (``expert_terms[i]``, by default the name of its slot).

``UnifiedRL`` is ``JointMultiExpertRL`` with one refiner, and exactly this differs: its card's
refiner is a plain LM (component ``llm``, no expert axis, no slot restriction), so its one update
is the single-refiner update itself, not mapped over an axis of one; its continuations are read
from the ``refine`` loop's capture rather than the composed slots; its metrics are that refiner's
(``lm_*``), not a mean over experts plus ``refiner_<i>_*``; and its credit is always shared.

``expert_map="auto"`` picks ``"map"`` on one CPU device and ``"vmap"`` on GPU/TPU (and on a
multi-device mesh, whose ``expert`` axis a vmap keeps split across devices), from
``benchmarks/joint_rl.py`` (RESULTS.md, section joint_rl, 2 shared CPU cores, refiner dim 64 × 2
layers): at 16 rows per expert and N = 8 the ``lax.map`` takes 90 ms against 137 ms for the vmap,
and ~10.8 vs ~17.5 ms per expert in the linear fits; at 4 rows the vmap is ahead, by less (N = 8:
26 vs 29 ms). On an accelerator the batched math is what fills the device, so ``"vmap"``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe._exports import deprecated
from jaxpipe.card import Card
from jaxpipe.cards import registry, toy_multi_expert, toy_unified
from jaxpipe.loops import ar, denoise
from jaxpipe.nn import MaskedLM
from jaxpipe.prompts import Prompts
from jaxpipe.rewards import Reward
from jaxpipe.training import ppo, rollout, update
from jaxpipe.training.denoiser import adapted
from jaxpipe.training.grpo import generator_update
from jaxpipe.training.methods.flow_grpo import FlowGRPOConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.parts import Parts
from jaxpipe.training.refine import (
    RefinerConfig,
    check_room,
    prefixed,
    refiner_update,
    render_rewrites,
    restrict,
    reward_stats,
)
from jaxpipe.training.trainer import RolloutMethod, TrainState

if TYPE_CHECKING:  # the command line's flag groups, for the builders below (no import at run time)
    from jaxpipe.training.methods.flags import JointFlags, LoRAFlags, PolicyFlags, RefinerFlags, RunSettings

__all__ = [
    "unified_from_flags",
    "joint_from_flags",
    "joint_trainer_from_flags",
    "CREDITS",
    "EXPERT_MAPS",
    "JointMultiExpertRLConfig",
    "UnifiedRLConfig",
    "JointRollout",
    "UnifiedRL",
    "JointMultiExpertRL",
    "map_experts",
    "resolve_expert_map",
    "REFINER",
    "GENERATOR",
]

CREDITS = ("shared", "per_expert")
"""The accepted values of ``JointMultiExpertRLConfig.credit``."""
EXPERT_MAPS = ("auto", "vmap", "map")
"""The accepted values of ``JointMultiExpertRLConfig.expert_map``."""
REFINER, GENERATOR = "refiner", "generator"
"""The trained parts (keys of ``TrainState.params``): the refiner(s) and, when joint, the generator."""


@dataclasses.dataclass(frozen=True)
class JointMultiExpertRLConfig:
    """Settings of joint refiner + generator RL (hashable: static under ``jit``).

    Attributes:
      generator: the generator's FlowGRPO settings: the group (K, adv clip), its SDE rollout, PPO clip,
        KL, updates per rollout (which both parts follow), its optimiser and ``lora`` (adapters on the
        generator, which then trains them alone; joint only).
      refiner: ``skip``, the token objective's clip and KL weight.
      refiner_optimizer: the refiners' optimiser (one Adam state per refiner).
      joint: train the generator too (``False``: prompt-only; the generator renders with the ODE).
      credit: ``"shared"`` | ``"per_expert"`` (``JointMultiExpertRL`` only).
      expert_terms: the reward part refiner i is credited with under ``"per_expert"`` (``None``: its slot's name).
      expert_map: how the N refiner updates map over the experts: ``"vmap"`` | ``"map"`` | ``"auto"``.

    Raises:
      ValueError: on construction, if ``refiner.skip`` leaves no rewrite in a group, ``credit`` /
        ``expert_map`` is unknown, or ``generator.lora`` is set on prompt-only RL.
    """

    generator: FlowGRPOConfig = FlowGRPOConfig(beta=0.04)
    refiner: RefinerConfig = RefinerConfig()
    refiner_optimizer: Optimizer = Optimizer(1e-3)
    joint: bool = True
    credit: str = "shared"
    expert_terms: tuple[str, ...] | None = None
    expert_map: str = "auto"

    def __post_init__(self):
        self.refiner.check_group(self.generator.group.size)
        validate.rule(self.credit in CREDITS, f"credit must be one of {CREDITS} (got {self.credit!r})")
        validate.rule(
            self.expert_map in EXPERT_MAPS, f"expert_map must be one of {EXPERT_MAPS} (got {self.expert_map!r})"
        )
        validate.rule(
            self.generator.lora is None or self.joint,
            "generator.lora trains adapters on the generator, which prompt-only RL (joint=False) keeps frozen",
        )

    def sampling_on(self, loop: denoise.DenoiseConfig) -> denoise.DenoiseConfig:
        """The generator's rollout policy on a card's denoise loop: the SDE when joint, the ODE when prompt-only.

        Args:
          loop: the card's denoise loop config.

        Returns:
          ``generator.sampling`` laid over ``loop`` (``Sampling.on``); prompt-only, with the ODE and no
          window.
        """
        sampling = self.generator.sampling
        if not self.joint:
            sampling = dataclasses.replace(sampling, sampler="ode", sde_window=None)
        return sampling.on(loop)


UnifiedRLConfig = JointMultiExpertRLConfig
"""``UnifiedRL``'s settings: a ``JointMultiExpertRLConfig`` (its ``credit`` stays ``"shared"``)."""

__getattr__ = deprecated(__name__, {"JointRLConfig": (__name__, "JointMultiExpertRLConfig")})


def resolve_expert_map(expert_map: str, backend: str | None = None, devices: int | None = None) -> str:
    """``"vmap"`` or ``"map"``: ``expert_map`` itself, or for ``"auto"`` the measured choice.

    ``"auto"`` is ``"map"`` on one CPU device and ``"vmap"`` on GPU/TPU or over several devices.

    Args:
      expert_map: one of ``EXPERT_MAPS``.
      backend: the JAX backend (default: ``jax.default_backend()``).
      devices: the device count (default: ``jax.device_count()``).

    Returns:
      ``"vmap"`` or ``"map"``.

    Raises:
      ValueError: if ``expert_map`` is not one of ``EXPERT_MAPS``.
    """
    if expert_map not in EXPERT_MAPS:
        raise ValueError(f"expert_map must be one of {EXPERT_MAPS} (got {expert_map!r})")
    if expert_map != "auto":
        return expert_map
    backend = jax.default_backend() if backend is None else backend
    devices = jax.device_count() if devices is None else devices
    return "map" if backend == "cpu" and devices == 1 else "vmap"


def map_experts(fn, expert_map: str, *stacked):
    """``fn`` applied to every slice of ``stacked`` along a leading expert axis, outputs stacked on that axis.

    Args:
      fn: a function of one expert's slices.
      expert_map: ``"vmap"`` (one ``jax.vmap``) or ``"map"`` (one ``jax.lax.map``).
      *stacked: pytrees with a leading expert axis N.

    Returns:
      ``fn``'s outputs, leading axis N.

    Raises:
      ValueError: for any other ``expert_map`` (resolve ``"auto"`` first: ``resolve_expert_map``).
    """
    if expert_map == "vmap":
        return jax.vmap(fn)(*stacked)
    if expert_map == "map":
        return jax.lax.map(lambda args: fn(*args), stacked)
    raise ValueError(f"expert_map must be 'vmap' or 'map' here (got {expert_map!r}; resolve 'auto' first)")


class JointRollout(NamedTuple):
    """One joint rollout (B = P·K rows).

    Attributes:
      refinement: the captured refinements (fields ``(B, ...)``, or ``(N, B, ...)`` for stacked
        refiners; masks restricted to refined rows).
      refined: ``(B,)`` bool, the rows that rewrote their prompt.
      text_ids: ``(B, L)`` the text ids the images were rendered from.
      generated: the rendered batch (with its captured trajectory when joint).
      rewards: ``(B,)`` rewards.
      parts: ``{name: (B,)}`` their parts.
      advantages: ``(B,)`` the generator's group advantages.
      refiner_advantages: the refiners' advantages, ``(B,)``, or ``(N, B)`` for stacked refiners.
    """

    refinement: ar.Continuation
    refined: jax.Array
    text_ids: jax.Array
    generated: rollout.Generated
    rewards: jax.Array
    parts: dict[str, jax.Array]
    advantages: jax.Array
    refiner_advantages: jax.Array


class _RefinerRL(RolloutMethod):
    """The joint step written once; ``UnifiedRL`` and ``JointMultiExpertRL`` say how their refiners are
    stored, read back and updated (``_refinement``, ``_refiner_update``)."""

    component: str
    refine_loop: str
    denoise_loop: str
    captured: tuple[str, ...]

    def __init__(self, card: Card, reward: Reward, config: JointMultiExpertRLConfig):
        self.config = config
        self.spec = card.spec
        self.reward = reward
        self.program = registry.default_program(card)
        self.max_prompt_words = card.spec.config.max_prompt_words
        # on-policy token gradients need the untempered policy's own samples
        self.ar_config = card.spec.loop(self.refine_loop).config.replace(temperature=1.0)
        self.sampling = config.sampling_on(card.spec.loop(self.denoise_loop).config)
        trained = (
            {REFINER: (self.component,), GENERATOR: ("transformer",)} if config.joint else {REFINER: (self.component,)}
        )
        self.parts = Parts(adapted(card, ("transformer",), config.generator.lora), trained)
        self.optimizers = {REFINER: config.refiner_optimizer.make()}
        if config.joint:
            self.optimizers[GENERATOR] = config.generator.optimizer.make()
        self._lm_graphdef = nnx.graphdef(card[self.component])
        self._jit(card, reward, config)

    @property
    def refiner_tx(self):
        """The refiners' optax optimiser (``config.refiner_optimizer``)."""
        return self.optimizers[REFINER]

    @property
    def generator_tx(self):
        """The generator's optax optimiser (``config.generator.optimizer``; ``None`` when prompt-only)."""
        return self.optimizers.get(GENERATOR)

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The frozen references of the KL terms: copies of the refiner(s) and (when joint) the generator."""
        return {f"{part}_reference": state for part, state in params.items()}

    def check_batch(self, batch: Prompts) -> None:
        """``Prompts`` whose prompts leave the refiner(s) room (checked when the ids are concrete), in
        minibatches that divide the rollout."""
        super().check_batch(batch)
        check_room(batch, self.max_prompt_words)
        self.config.generator.ppo.check_rows(len(batch) * self.config.generator.group.size)

    def _rollout(self, state: TrainState, batch: Prompts, key: jax.Array, reward_weights: Any = None) -> JointRollout:
        cfg = self.config
        group = cfg.generator.group
        run, refined = render_rewrites(
            self.rollout_card(state.params, state.frozen),
            self.program,
            batch,
            key,
            group=group,
            skip=cfg.refiner.skip,
            loops={self.refine_loop: self.ar_config, self.denoise_loop: self.sampling},
            capture=self.captured + ((self.denoise_loop,) if cfg.joint else ()),
        )
        execution = run.execution
        refinement, text_ids = self._refinement(execution, refined)
        images = execution.artifacts["image"]
        generated = (
            rollout.generated(execution, self.denoise_loop) if cfg.joint else rollout.Generated(images, None, None)
        )
        scored = rollout.score_rollout(
            self.reward_at(reward_weights), rollout.artifacts_of(execution, self.program), run.prompts, group
        )
        return JointRollout(
            refinement,
            refined,
            text_ids,
            generated,
            scored.rewards,
            scored.parts,
            scored.advantages,
            self._refiner_advantages(scored),
        )

    def _generator_of(self, state: TrainState):
        refiners = {REFINER: state.params[REFINER]}
        return lambda generator: self.parts.models({**refiners, GENERATOR: generator}, state.frozen, ("transformer",))

    def _update(self, state: TrainState, ro: JointRollout, key: jax.Array | None = None) -> tuple[TrainState, dict]:
        """Every update the rollout feeds (``generator.ppo``): per minibatch the refiner(s), then the generator
        when joint, on the same rows; each optimiser step guarded on its own."""
        cfg = self.config
        generator_of = self._generator_of(state)

        def one(carry, rows, k):
            params, opt_state = carry
            refiner, refiner_opt, metrics, finite = self._refiner_update(
                params[REFINER], state.copies[f"{REFINER}_reference"], opt_state[REFINER], ro, rows
            )
            params, opt_state = {**params, REFINER: refiner}, {**opt_state, REFINER: refiner_opt}
            if cfg.joint:
                out = generator_update(
                    self.generator_tx,
                    generator_of,
                    params[GENERATOR],
                    state.copies[f"{GENERATOR}_reference"],
                    opt_state[GENERATOR],
                    ro.generated,
                    ro.advantages,
                    rows,
                    k,
                    cfg.generator,
                    self.sampling,
                )
                params, opt_state = {**params, GENERATOR: out.params}, {**opt_state, GENERATOR: out.opt_state}
                finite = finite & out.finite
                metrics.update(prefixed("gen_", out.aux), gen_grad_norm=out.grad_norm)
            return (params, opt_state), metrics, finite

        (params, opt_state), metrics, finite = ppo.run(
            one, (state.params, state.opt_state), key, ro.advantages.shape[0], cfg.generator.ppo
        )
        new = state._replace(params=params, opt_state=opt_state, step=state.step + 1)
        return new, {**metrics, **self._advantage_metrics(ro), "skipped": update.skipped(finite)}

    def _advantage_metrics(self, ro: JointRollout) -> dict[str, jax.Array]:
        return {}


class UnifiedRL(_RefinerRL):
    """UnifiedRL on a card with one refiner LM (``toy_unified``, e.g. ``unified``): ``init(key)``, jitted
    ``rollout`` / ``update``, ``step`` (one jit).

    A batch is a ``jaxpipe.prompts.Prompts`` of prompts of at most ``card.spec.config.max_prompt_words``
    words; ``reward(artifacts, prompts)`` scores the rendered rows (a metadata label the prompt does not
    name is a preference the refiner can learn to ask for).

    Args:
      card: a ``unified`` card (components ``llm``, ``transformer``, ``text_encoder``, ``vae``).
      reward: the reward.
      config: the settings (``credit`` must be ``"shared"``).

    Raises:
      ValueError: if the card lacks a component or ``config.credit`` is not ``"shared"``.
    """

    component = "llm"
    refine_loop = toy_unified.REFINE_LOOP
    denoise_loop = toy_unified.DENOISE_LOOP
    captured = (toy_unified.REFINE_LOOP,)

    def __init__(self, card: Card, reward: Reward, config: JointMultiExpertRLConfig = JointMultiExpertRLConfig()):
        for name in ("llm", "transformer", "text_encoder", "vae"):
            if name not in card.components:
                raise ValueError(
                    f"UnifiedRL needs a card with {name!r} (a 'unified' card); {card.model_id!r} has {sorted(card.components)}"
                )
        if config.credit != "shared":
            raise ValueError(f"UnifiedRL has one refiner: its credit is 'shared' (got {config.credit!r})")
        super().__init__(card, reward, config)

    def _llm(self, params: nnx.State) -> ar.Decoder:
        return nnx.merge(self._lm_graphdef, params[self.component])

    def _refinement(self, execution, refined):
        return restrict(rollout.refinement(execution, self.refine_loop), refined), execution.slots["refined"]

    def _refiner_advantages(self, scored: rollout.Scored) -> jax.Array:
        return scored.advantages

    def _refiner_update(self, params, reference, opt_state, ro: JointRollout, rows):
        refinement, advantages = ro.refinement, ro.refiner_advantages
        if rows is not None:
            refinement, advantages = jax.tree.map(lambda a: a[rows], refinement), advantages[rows]
        out = refiner_update(
            self.refiner_tx, self._llm, params, reference, opt_state, refinement, advantages, self.config.refiner
        )
        return out.params, out.opt_state, {**prefixed("lm_", out.aux), "lm_grad_norm": out.grad_norm}, out.finite

    def rollout_metrics(self, ro: JointRollout) -> dict[str, jax.Array]:
        """The reward's statistics, refined vs original rows, and the mean rewrite length."""
        stats = reward_stats(ro.rewards, ro.refined, jnp.sum(ro.refinement.mask, axis=-1))
        return {**stats, **{f"reward_{term}": jnp.mean(part) for term, part in ro.parts.items()}}


class JointMultiExpertRL(_RefinerRL):
    """N-way joint RL on a card with N stacked refiners (``toy_multi_expert``, e.g. ``multi-expert``):
    ``init``, jitted ``rollout`` / ``update``, ``step`` (one jit).

    ``reward(artifacts, prompts)`` returns its parts ``{term: (B,)}`` (required for ``"per_expert"``
    credit, e.g. the digits world's ``scorer_reward``) or the total ``(B,)``. Batches as ``UnifiedRL``'s.

    Args:
      card: a ``multi-expert`` card (stacked ``refiners``).
      reward: the reward.
      config: the settings.

    Raises:
      ValueError: if the card has no stacked refiners, or ``"per_expert"`` credit has not one reward term
        per refiner.
    """

    component = toy_multi_expert.COMPONENT
    refine_loop = toy_multi_expert.REFINE_LOOP
    denoise_loop = toy_multi_expert.DENOISE_LOOP
    captured = ()
    stacked = (REFINER,)

    def __init__(self, card: Card, reward: Reward, config: JointMultiExpertRLConfig = JointMultiExpertRLConfig()):
        if toy_multi_expert.COMPONENT not in card.components:
            raise ValueError(
                f"JointMultiExpertRL needs a 'multi-expert' card (stacked 'refiners'); {card.model_id!r} has {sorted(card.components)}"
            )
        self.num_refiners = card.spec.config.num_refiners
        self.allowed = jnp.asarray(card.spec.config.allowed_tokens())
        self.expert_map = resolve_expert_map(config.expert_map)
        self.expert_terms = config.expert_terms or tuple(card.spec.config.slot(i) for i in range(self.num_refiners))
        if config.credit == "per_expert" and (len(self.expert_terms) != self.num_refiners or None in self.expert_terms):
            raise ValueError(
                f"per_expert credit needs one reward term per refiner ({self.num_refiners}); got {self.expert_terms} "
                "(pass expert_terms, or give the card slots)"
            )
        super().__init__(card, reward, config)

    def _expert(self, params: nnx.State, allowed: jax.Array):
        """Refiner params of ONE expert (no expert axis) as a slot-restricted LM."""
        return MaskedLM(nnx.merge(self._lm_graphdef, params[self.component]), allowed)

    def _refinement(self, execution, refined):
        refinements = restrict(toy_multi_expert.expert_major(execution.slots["refinements"]), refined[None, :])
        return refinements, execution.slots["composed"]

    def _refiner_advantages(self, scored: rollout.Scored) -> jax.Array:
        rows = scored.advantages.shape[0]
        if self.config.credit != "per_expert":
            return jnp.broadcast_to(scored.advantages, (self.num_refiners, rows))
        if not scored.parts:
            raise ValueError(
                "per_expert credit needs a reward that returns its parts {term: (B,)} (e.g. the digits scorer_reward)"
            )
        missing = [t for t in self.expert_terms if t not in scored.parts]
        if missing:
            raise ValueError(f"per_expert credit: the reward has no part(s) {missing} (parts: {sorted(scored.parts)})")
        group = self.config.generator.group
        return jnp.stack([rollout.advantages(scored.parts[t], group) for t in self.expert_terms])

    def expert_update(
        self, params, reference, opt_state, allowed, refinement: ar.Continuation, advantages
    ) -> update.Step:
        """ONE refiner's guarded step (no expert axis): ``refine.refiner_update`` on its slot-restricted LM.

        The update maps it over the experts (``expert_map``).

        Args:
          params: one refiner's parameters.
          reference: its frozen reference parameters.
          opt_state: its optimiser state.
          allowed: the token ids its slot may emit.
          refinement: its captured continuations (fields ``(B, ...)``).
          advantages: ``(B,)`` its advantages.

        Returns:
          The ``update.Step``.
        """
        lm_of = lambda p: self._expert(p, allowed)
        return refiner_update(
            self.refiner_tx, lm_of, params, reference, opt_state, refinement, advantages, self.config.refiner
        )

    def _refiner_update(self, params, reference, opt_state, ro: JointRollout, rows):
        refinements, advantages = ro.refinement, ro.refiner_advantages
        if rows is not None:  # the expert axis leads: rows are axis 1
            refinements, advantages = jax.tree.map(lambda a: a[:, rows], refinements), advantages[:, rows]
        out = map_experts(
            self.expert_update, self.expert_map, params, reference, opt_state, self.allowed, refinements, advantages
        )
        metrics = {f"lm_{k}": jnp.mean(v) for k, v in out.aux.items()}
        metrics["lm_grad_norm"] = jnp.mean(out.grad_norm)
        metrics.update({f"{toy_multi_expert.EXPERT_PREFIX}{i}_loss": out.loss[i] for i in range(self.num_refiners)})
        return out.params, out.opt_state, metrics, jnp.all(out.finite)

    def _advantage_metrics(self, ro: JointRollout) -> dict[str, jax.Array]:
        return {
            f"{toy_multi_expert.EXPERT_PREFIX}{i}_advantage_std": jnp.std(ro.refiner_advantages[i])
            for i in range(self.num_refiners)
        }

    def rollout_metrics(self, ro: JointRollout) -> dict[str, jax.Array]:
        """``UnifiedRL``'s reward statistics (tokens summed over refiners) plus the mean of every reward part."""
        tokens = jnp.sum(ro.refinement.mask, axis=(0, 2))
        parts = {f"reward_{term}": jnp.mean(part) for term, part in ro.parts.items()}
        return {**reward_stats(ro.rewards, ro.refined, tokens), **parts}


def unified_from_flags(
    run: RunSettings, policy: PolicyFlags, refiner: RefinerFlags, lora: LoRAFlags
) -> UnifiedRLConfig:
    """``jaxpipe train unified``'s config from its flags.

    Args:
      run: the run's settings.
      policy: the generator's policy-gradient flags.
      refiner: the refiner's flags.
      lora: the generator's adapters' flags.

    Returns:
      The ``UnifiedRLConfig``.
    """
    return refiner.joint(policy, run, lora.config())


def joint_from_flags(
    run: RunSettings, policy: PolicyFlags, refiner: RefinerFlags, own: JointFlags
) -> JointMultiExpertRLConfig:
    """``jaxpipe train joint``'s config from its flags.

    Args:
      run: the run's settings.
      policy: the generator's policy-gradient flags.
      refiner: the refiners' flags.
      own: the credit and the expert map (and the refiners' count, which the trainer reads).

    Returns:
      The ``JointMultiExpertRLConfig``.
    """
    return refiner.joint(policy, run, credit=own.credit, expert_map=own.expert_map)


def joint_trainer_from_flags(
    card: Card,
    reward: Reward,
    config: JointMultiExpertRLConfig,
    policy: PolicyFlags,
    refiner: RefinerFlags,
    own: JointFlags,
    *,
    load: Any = None,
) -> JointMultiExpertRL:
    """``jaxpipe train joint``'s trainer on the user's card: ``--refiners`` copies of its refiner LM, every
    one free to say every word (no slots).

    Args:
      card: the user's card with a refiner LM.
      reward: the user's reward.
      config: the method's config.
      policy: the generator's flags (unused here).
      refiner: the refiners' flags (unused here).
      own: the command's own flags (``refiners``).
      load: the command's card loader (unused).

    Returns:
      The ``JointMultiExpertRL`` trainer.
    """
    del policy, refiner, load
    return JointMultiExpertRL(toy_multi_expert.from_unified(card, own.refiners, model_id=card.model_id), reward, config)
