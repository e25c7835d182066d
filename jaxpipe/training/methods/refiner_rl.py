"""The base of the joint refiner + generator RL methods (``joint_rl``): their config, the expert map, the
joint rollout, and ``_RefinerRL``, the shared rollout and update that ``UnifiedRL`` (one refiner) and
``JointMultiExpertRL`` (N stacked) specialise. ``joint_rl`` re-exports every public name here; its module
docstring describes the method.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.loops import ar, denoise
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
    render_rewrites,
)
from jaxpipe.training.trainer import RolloutMethod, TrainState

__all__ = [
    "CREDITS",
    "EXPERT_MAPS",
    "JointMultiExpertRLConfig",
    "UnifiedRLConfig",
    "JointRollout",
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
