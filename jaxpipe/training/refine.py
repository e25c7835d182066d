"""The refiner half of joint RL: which samples rewrite their prompt, and the token objective that trains the rewriter.

PromptRL's shape: per prompt a group of K samples; the first K − ``skip`` each get their own
sampled rewrite (a refiner LM's continuation, a MoT's thought), the last ``skip`` keep the prompt
as written; every sample is rendered once and one reward gives one group advantage ``A``. The
rewriter learns by the length-normalised token policy gradient on its rewrites, PPO-clipped per
token against the captured log-probs, plus ``β ·`` the k3 KL to its frozen reference
(``losses.token_loss``):

    L_b = Σ_t m_bt · max(-A_b·ρ_bt, -A_b·clip(ρ_bt, 1-ε, 1+ε)) / n_b  +  β · KL_k3(π_θ ‖ π_ref)

``UnifiedRL`` and ``JointMultiExpertRL`` train refiner LMs with ``refiner_update``; ``SharedMoTRL``
adds ``token_objective`` of the thoughts to its generator loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.loops import ar
from jaxpipe.program import Program, settings
from jaxpipe.prompts import Prompts
from jaxpipe.training import losses, rollout, update

__all__ = [
    "RefinerConfig",
    "refine_rows",
    "render_rewrites",
    "restrict",
    "token_objective",
    "refiner_update",
    "reward_stats",
    "check_room",
    "prefixed",
]


@dataclasses.dataclass(frozen=True)
class RefinerConfig:
    """The rewriting half of a joint method (hashable: static under ``jit``).

    Rewrites are sampled at temperature 1 (on-policy).

    Attributes:
      skip: samples per group that keep the original prompt (``0 <= skip < K``: at least one rewrites).
      clip_eps: the per-token PPO ratio clip, > 0.
      beta: the k3-KL weight to the frozen reference rewriter, >= 0.

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    skip: int = 1
    clip_eps: float = 0.2
    beta: float = 0.01

    def __post_init__(self):
        validate.rule(
            not (isinstance(self.skip, bool) or not isinstance(self.skip, int) or self.skip < 0),
            f"skip must be an int >= 0 (got {self.skip!r})",
        )
        validate.rule(
            math.isfinite(self.clip_eps) and self.clip_eps > 0 and math.isfinite(self.beta) and self.beta >= 0,
            f"the refiner's clip_eps must be > 0 and beta >= 0 (got {self.clip_eps}, {self.beta})",
        )

    def check_group(self, group_size: int) -> None:
        """A clear error unless ``skip`` leaves at least one rewritten sample in a group of ``group_size``.

        Args:
          group_size: the samples per prompt K.

        Raises:
          ValueError: if ``skip >= group_size``.
        """
        if not self.skip < group_size:
            raise ValueError(
                f"skip must be in 0..K-1 = 0..{group_size - 1}: at least one sample per group must rewrite its prompt "
                f"(got {self.skip})"
            )


def refine_rows(group_size: int, skip: int, batch_rows: int) -> jax.Array:
    """The rows that get a rewrite: the first K − skip of every group of K consecutive rows.

    Args:
      group_size: the samples per prompt K.
      skip: the samples per group that keep the prompt.
      batch_rows: the rollout's rows ``B = P·K``.

    Returns:
      ``(B,)`` bool.
    """
    return (jnp.arange(batch_rows) % group_size) < group_size - skip


def render_rewrites(
    card: Card,
    program: Program,
    prompts: Prompts,
    key: jax.Array,
    *,
    group: rollout.Group,
    skip: int,
    loops: Mapping[str, Any],
    capture: tuple[str, ...],
) -> tuple[rollout.Render, jax.Array]:
    """Render ``program`` on ``card``, K samples per prompt, the first K − ``skip`` of each group rewriting it.

    Args:
      card: the card (at the rollout's weights).
      program: a rewriting program (its ``refine`` or ``think`` input).
      prompts: the batch's P prompts.
      key: the rollout's key (row keys ``split(key, B)``).
      group: the group (its ``size`` K).
      skip: samples per group that keep the prompt.
      loops: loop id -> its settings for this rollout.
      capture: the loops to capture.

    Returns:
      ``(render, rewrite rows (B,) bool)``.
    """
    rows = refine_rows(group.size, skip, len(prompts) * group.size)
    run = rollout.render(
        card, program, settings(**loops), prompts, key, group_size=group.size, capture=capture, rewrite=rows
    )
    return run, rows


def restrict(refinement: ar.Continuation, refined: jax.Array) -> ar.Continuation:
    """``refinement`` with its mask (and log-probs) kept only on ``refined`` rows.

    Args:
      refinement: captured continuations (fields ``(B, T)``, or ``(N, B, T)`` for stacked refiners).
      refined: bool rows to keep, broadcasting against the leading axes of ``mask`` without its last
        (``(B,)``, or ``(1, B)`` for stacked refiners).

    Returns:
      The ``Continuation`` with ``mask`` false and ``log_prob`` 0 on the other rows.
    """
    mask = refinement.mask & refined[..., None]
    return refinement._replace(mask=mask, log_prob=jnp.where(mask, refinement.log_prob, 0.0))


def token_objective(
    lm: ar.Decoder,
    reference: ar.Decoder | None,
    refinement: ar.Continuation,
    advantages: jax.Array,
    config: RefinerConfig,
) -> tuple[jax.Array, dict]:
    """The token objective of a rewriter: ``losses.token_loss`` of its captured ``refinement``.

    The token policy gradient under ``lm``, PPO-clipped against the captured log-probs, plus
    ``config.beta`` · the k3 KL to ``reference`` (recomputed only when ``beta > 0``).

    Args:
      lm: the rewriter under the current weights.
      reference: the frozen reference rewriter (unused, may be ``None``, when ``beta == 0``).
      refinement: the captured continuations (fields ``(B, T)``).
      advantages: ``(B,)`` advantages.
      config: the clip and the KL weight.

    Returns:
      ``(loss, metrics)`` of ``losses.token_loss``.
    """
    log_probs = rollout.token_log_probs(lm, refinement)
    ref_log_probs = rollout.token_log_probs(reference, refinement) if config.beta > 0 else None
    return losses.token_loss(
        log_probs,
        refinement.mask,
        advantages,
        ref_log_probs=ref_log_probs,
        beta=config.beta,
        old_log_probs=refinement.log_prob,
        clip_eps=config.clip_eps,
    )


def refiner_update(
    tx: optax.GradientTransformation,
    lm_of: Callable[[nnx.State], ar.Decoder],
    params: nnx.State,
    reference: nnx.State,
    opt_state: Any,
    refinement: ar.Continuation,
    advantages: jax.Array,
    config: RefinerConfig,
) -> update.Step:
    """ONE refiner's guarded optimiser step on its captured refinements (``token_objective``).

    Pure, and free of any expert axis, so ``JointMultiExpertRL`` maps it over N stacked refiners.

    Args:
      tx: the refiner's optimiser.
      lm_of: ``params -> the refiner LM``.
      params: the refiner's parameters.
      reference: its frozen reference parameters.
      opt_state: the optimiser state.
      refinement: the captured continuations.
      advantages: ``(B,)`` advantages.
      config: the refiner settings.

    Returns:
      The ``update.Step``.
    """

    def loss(p):
        return token_objective(lm_of(p), lm_of(reference), refinement, advantages, config)

    return update.step(loss, tx, params, opt_state)


def prefixed(prefix: str, metrics: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """``metrics`` with every name prefixed (``"lm_"``, ``"gen_"``).

    Args:
      prefix: the prefix.
      metrics: name -> value.

    Returns:
      A new dict.
    """
    return {f"{prefix}{k}": v for k, v in metrics.items()}


def reward_stats(rewards: jax.Array, refined: jax.Array, tokens: jax.Array) -> dict[str, jax.Array]:
    """A joint rollout's reward statistics, refined rows against original-prompt rows.

    Args:
      rewards: ``(B,)`` rewards.
      refined: ``(B,)`` bool, the rows that rewrote their prompt.
      tokens: ``(B,)`` rewrite tokens per row.

    Returns:
      ``reward_mean`` and ``reward_std`` over all rows, ``reward_refined`` and ``reward_original`` (the
      means over each split; 0 for a split with no rows) and ``refined_tokens`` (the mean tokens per
      refined row), scalars.
    """
    refined = refined.astype(jnp.float32)
    mean_over = lambda values, w: jnp.sum(values * w) / jnp.maximum(jnp.sum(w), 1.0)
    return {
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        "reward_refined": mean_over(rewards, refined),
        "reward_original": mean_over(rewards, 1.0 - refined),
        "refined_tokens": mean_over(tokens.astype(jnp.float32), refined),
    }


def check_room(prompts: Prompts, max_words: int) -> None:
    """A clear error when a prompt leaves the rewriter no room (checked when the ids are concrete).

    Args:
      prompts: the batch.
      max_words: the most words (non-pad ids) a prompt may have.

    Raises:
      ValueError: if a prompt has more than ``max_words`` words.
    """
    try:
        longest = int(jnp.max(jnp.sum(jnp.asarray(prompts.ids) != 0, axis=1)))
    except jax.errors.ConcretizationTypeError:
        return
    if longest > max_words:
        raise ValueError(
            f"a prompt has {longest} words; the refiner(s) need room to add theirs, so prompts may have at most {max_words}"
        )
