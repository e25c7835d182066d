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

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe._exports import deprecated
from jaxpipe.card import Card
from jaxpipe.cards import toy_multi_expert, toy_unified
from jaxpipe.loops import ar
from jaxpipe.nn import MaskedLM
from jaxpipe.rewards import Reward
from jaxpipe.training import rollout, update
from jaxpipe.training.methods.refiner_rl import (
    CREDITS,
    EXPERT_MAPS,
    GENERATOR,
    REFINER,
    JointMultiExpertRLConfig,
    JointRollout,
    UnifiedRLConfig,
    _RefinerRL,
    map_experts,
    resolve_expert_map,
)
from jaxpipe.training.refine import (
    prefixed,
    refiner_update,
    restrict,
    reward_stats,
)

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

__getattr__ = deprecated(__name__, {"JointRLConfig": (__name__, "JointMultiExpertRLConfig")})


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
