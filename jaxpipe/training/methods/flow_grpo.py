"""``FlowGRPO``: group-relative policy optimisation of a text-to-image (or -video) card's denoiser.

One ``step``: each of P prompts is rendered K times by the card's own program under SDE sampling
with capture on (``rollout.render``); the reward scores the rendered artifacts against the prompts
(``jaxpipe.rewards``), group advantages weight FlowGRPO's clipped PPO loss on every captured step
plus ``β ·`` a KL to a frozen reference denoiser (``training.grpo``). Gradients flow through the
denoiser(s) the program's denoise loop binds; the rest of the card stays frozen. A loop binding
several experts routed by noise level (``wan22-moe``) trains only the experts the SDE window
routes to (``trained_experts``, read off the static schedule, window and router by
``rollout.window_experts``): the others stay out of the optimiser state and the reference, so a
publish moves only the trained expert's version.

``rollout`` and ``update`` are separate jitted functions so the C2 identity (recomputed log-probs
== captured, ratio == 1) can be checked between them; ``step`` is both fused into one jitted
function. A rollout may feed several updates (``config.ppo``: minibatches × inner epochs, each on a
timestep fraction; ``training.ppo``); the default, 1 × 1 on every step, is one update at the
rollout weights.

Precision (``FlowGRPOConfig.dtype``): ``"bfloat16"`` runs the card's networks in bfloat16
(``precision.with_dtype``) while the sampler, log-probs, losses and advantages stay float32, as
FlowGRPO does; the trainable params are float32 master weights (Adam too), cast down in each
forward, and the log-prob recompute runs the same bfloat16 network, so C2 still holds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.nn.lora import LoRAConfig
from jaxpipe.precision import check_dtype, with_dtype
from jaxpipe.program import Program
from jaxpipe.program import settings as loop_settings
from jaxpipe.prompts import Prompts
from jaxpipe.rewards import Reward
from jaxpipe.training import ppo, rollout, update
from jaxpipe.training.denoiser import GENERATOR, DenoiserMethod
from jaxpipe.training.ema import EvalEMA
from jaxpipe.training.grpo import KL_CONVENTIONS, generator_update
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling
from jaxpipe.training.trainer import TrainState

if TYPE_CHECKING:  # the command line's flag groups, for the builders below (no import at run time)
    from jaxpipe.training.methods.flags import LoRAFlags, PolicyFlags, RunSettings

__all__ = ["config_from_flags", "FlowGRPO", "FlowGRPOConfig", "Rollout", "GENERATOR"]


@dataclasses.dataclass(frozen=True)
class FlowGRPOConfig:
    """Settings of FlowGRPO on a generator (hashable: static under ``jit``).

    Attributes:
      group: K samples per prompt and the advantage clip (K >= 2).
      sampling: the rollout's denoise policy: the SDE (``sampler="sde"``), its steps, noise level, window
        and guidance. At guidance ``w != 1`` the policy is the CFG-combined velocity, both branches
        recomputed through the trained weights (the official FlowGRPO's ``train.cfg``); at 1 it is the
        plain velocity (FlowGRPO-Fast's no-CFG setting).
      clip_eps: the PPO ratio clip ε, > 0.
      beta: the KL weight β to the frozen reference denoiser, >= 0.
      kl: the KL convention, ``"exact"`` or ``"flowgrpo"`` (module docstring).
      ppo: updates per rollout (minibatches × inner epochs on a timestep fraction; ``training.ppo``).
      optimizer: the generator's optimiser (clipped Adam, lr 1e-4 by default).
      dtype: the networks' compute dtype (``"float32"`` | ``"bfloat16"``; ``None``: the card's own);
        the trainable params and Adam stay float32 either way (``jaxpipe.precision``).
      lora: train LoRA adapters on the trained denoiser(s) instead of all their weights (``None``: full
        training); the adapters are added at the trainer's construction (``jaxpipe.nn.lora``).
      detach_uncond: under CFG, no gradient through the unconditional branch (the official code's
        ``noise_pred_uncond.detach()``); the log-probs and ratios are unchanged.
      eval_ema: keep an evaluation average of the trained weights (``training.eval_ema``; ``None``: none).
      filter_zero_advantages: average the loss (policy and KL) over the rows whose advantage is not 0
        only, as the official code drops them from the batch (a group whose rewards are all equal
        teaches nothing; without the filter its rows still pull toward the reference and dilute the mean).

    Raises:
      ValueError: on construction, if K < 2, ``sampling`` is not the SDE, or a field is out of range.
    """

    group: Group = Group()
    sampling: Sampling = Sampling(sampler="sde")
    clip_eps: float = 1e-3
    beta: float = 0.004
    kl: str = "exact"
    ppo: ppo.Schedule = ppo.Schedule()
    optimizer: Optimizer = Optimizer(1e-4)
    dtype: str | None = None
    lora: LoRAConfig | None = None
    detach_uncond: bool = False
    filter_zero_advantages: bool = False
    eval_ema: EvalEMA | None = None

    def __post_init__(self):
        self.group.check_relative()
        validate.rule(
            self.sampling.sampler == "sde",
            "FlowGRPO rolls out with the SDE (its steps need log-probs): "
            f"sampling needs sampler='sde' (got {self.sampling.sampler!r})",
        )
        validate.rule(math.isfinite(self.clip_eps) and self.clip_eps > 0, f"clip_eps must be > 0 (got {self.clip_eps})")
        validate.rule(
            math.isfinite(self.beta) and self.beta >= 0, f"beta (the KL weight) must be >= 0 (got {self.beta})"
        )
        validate.rule(self.kl in KL_CONVENTIONS, f"kl must be one of {KL_CONVENTIONS} (got {self.kl!r})")
        if self.dtype is not None:
            check_dtype(self.dtype, "dtype")


class Rollout(NamedTuple):
    """One group rollout (B = P·K rows, row ``p·K + k`` is sample k of prompt p).

    Attributes:
      generated: the rendered batch with its captured SDE steps.
      rewards: ``(B,)`` rewards.
      parts: ``{name: (B,)}`` their parts.
      advantages: ``(B,)`` group advantages.
    """

    generated: rollout.Generated
    rewards: jax.Array
    parts: dict[str, jax.Array]
    advantages: jax.Array


class FlowGRPO(DenoiserMethod):
    """FlowGRPO on a text-to-image card: ``init(key)``, jitted ``rollout`` / ``update`` and ``step``.

    A batch is a ``jaxpipe.prompts.Prompts`` of P prompts; each is sampled ``config.group.size``
    times. ``reward(artifacts, prompts) -> (B,)`` (or its parts) scores the rendered rows
    (``jaxpipe.rewards``: a JAX function or a ``@host`` one). The card renders through its family's
    program (or ``program``), which must run one denoise loop.

    Args:
      card: a text-to-image (or -video) card.
      reward: the reward.
      config: the settings.
      program: the program to render with (default: the family's).
    """

    def __init__(
        self, card: Card, reward: Reward, config: FlowGRPOConfig = FlowGRPOConfig(), *, program: Program | None = None
    ):
        made_from = (card, reward, config, program)
        if config.dtype is not None:
            card = with_dtype(card, config.dtype)
        self._setup(card, reward, config, program)
        self._jit(*made_from)

    def trained_denoisers(self) -> tuple[str, ...]:
        """The bound denoisers some step of the SDE window routes to (all of them for a one-expert loop)."""
        return rollout.window_experts(self.loop, self.sampling)

    @property
    def trained_experts(self) -> tuple[str, ...]:
        """The bound denoisers this method trains: those some step of the SDE window routes to (all of
        ``denoisers`` for a one-expert loop). The others are frozen: not in ``params``, the reference
        or the optimiser state."""
        return self.parts.trained[GENERATOR]

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The frozen reference of the KL term: a copy of the trained denoiser(s)."""
        return {"reference": params[GENERATOR]}

    def check_batch(self, batch: Prompts) -> None:
        super().check_batch(batch)
        self.config.ppo.check_rows(len(batch) * self.config.group.size)

    def _rollout(self, state: TrainState, batch: Prompts, key: jax.Array, reward_weights: Any = None) -> Rollout:
        card = self.rollout_card(state.params, state.frozen)
        settings = loop_settings(**{self.loop.id: self.sampling})
        run = rollout.render(
            card, self.program, settings, batch, key, group_size=self.config.group.size, capture=(self.loop.id,)
        )
        generated = rollout.generated(run.execution, self.loop.id, rollout.rendered_artifact(self.program))
        scored = rollout.score_rollout(
            self.reward_at(reward_weights),
            rollout.artifacts_of(run.execution, self.program),
            run.prompts,
            self.config.group,
        )
        return Rollout(generated, scored.rewards, scored.parts, scored.advantages)

    def step_stats(self, params: nnx.State, frozen: nnx.State, ro: Rollout) -> tuple[jax.Array, jax.Array]:
        """The log-probs and SDE means of the rollout's captured steps under the generator ``params``.

        Teacher-forced, with the trainer's own batching (``rollout.generator_stats``).

        Args:
          params: the generator's parameters.
          frozen: the frozen parameters.
          ro: the rollout.

        Returns:
          ``(log_probs (S, B), means (S, B, ...))``.
        """
        return rollout.generator_stats(
            self.models_of(frozen)(params), ro.generated, self.sampling, detach_uncond=self.config.detach_uncond
        )

    def _update(self, state: TrainState, ro: Rollout, key: jax.Array | None = None) -> tuple[TrainState, dict]:
        """Every update the rollout feeds (``config.ppo``; ``key`` orders the minibatches), each guarded."""
        models_of = self.models_of(state.frozen)

        def one(carry, rows, k):
            params, opt_state = carry
            out = generator_update(
                self.tx,
                models_of,
                params,
                state.copies["reference"],
                opt_state,
                ro.generated,
                ro.advantages,
                rows,
                k,
                self.config,
                self.sampling,
            )
            return (out.params, out.opt_state), {**out.aux, "grad_norm": out.grad_norm}, out.finite

        (params, opt_state), metrics, finite = ppo.run(
            one, (state.params[GENERATOR], state.opt_state[GENERATOR]), key, ro.advantages.shape[0], self.config.ppo
        )
        new = state._replace(params={GENERATOR: params}, opt_state={GENERATOR: opt_state}, step=state.step + 1)
        return new, {**metrics, "skipped": update.skipped(finite)}

    def rollout_metrics(self, ro: Rollout) -> dict[str, jax.Array]:
        return rollout.reward_metrics(ro.rewards, ro.parts)


def config_from_flags(run: RunSettings, policy: PolicyFlags, lora: LoRAFlags) -> FlowGRPOConfig:
    """``jaxpipe train flow-grpo``'s config: the policy-gradient flags, with LoRA adapters when asked.

    Args:
      run: the run's settings (group size, learning rate, prompts per step).
      policy: the SDE rollout, PPO and KL flags.
      lora: the adapters' flags.

    Returns:
      The ``FlowGRPOConfig``.
    """
    return policy.generator(run, lora.config())
