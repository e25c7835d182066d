"""Scoring a rendered rollout: its reward, the reward's parts, and their group-relative advantages.

Group layout as in :mod:`jaxpipe.training.rollout`: P prompts, K samples each, B = P·K rows; row
``p·K + k`` is sample ``k`` of prompt ``p``. ``rollout`` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

from jaxpipe import rewards
from jaxpipe.program import Execution, Program
from jaxpipe.prompts import Prompts
from jaxpipe.training import losses

if TYPE_CHECKING:
    from jaxpipe.training.rollout import Group

__all__ = ["Scored", "artifacts_of", "score_rollout", "reward_metrics", "advantages"]


class Scored(NamedTuple):
    """A rendered batch's rewards and their group advantages.

    Attributes:
      rewards: ``(B,)`` float32 (the sum of ``parts`` when the reward names them).
      parts: ``{name: (B,)}`` the reward's parts (empty when it has none).
      advantages: ``(B,)`` group advantages.
    """

    rewards: jax.Array
    parts: dict[str, jax.Array]
    advantages: jax.Array


def artifacts_of(execution: Execution, program: Program) -> dict[str, jax.Array]:
    """The rendered artifacts a reward scores: the program's outputs (``"image"`` or ``"video"``, ``"latents"``).

    Args:
      execution: the program's execution.
      program: the program.

    Returns:
      ``{output name: array}`` for the outputs the execution holds.
    """
    return {name: execution.artifacts[name] for name, _ in program.outputs if name in execution.artifacts}


def score_rollout(reward: rewards.Reward, artifacts: Mapping[str, jax.Array], prompts: Prompts, group: Group) -> Scored:
    """Score a rendered batch and compute its group advantages (``group.size`` rows per prompt).

    Args:
      reward: the reward (a JAX function or a ``@host`` one; ``jaxpipe.rewards``).
      artifacts: the rendered artifacts (``artifacts_of``).
      prompts: the rows' prompts.
      group: the group (its size and advantage clip).

    Returns:
      The ``Scored`` batch.
    """
    total, parts = rewards.score(reward, artifacts, prompts)
    return Scored(total, parts, advantages(total, group))


def reward_metrics(rewards: jax.Array, parts: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """A rollout's reward metrics.

    Args:
      rewards: ``(B,)`` rewards.
      parts: ``{name: (B,)}`` reward parts.

    Returns:
      ``reward_mean`` and ``reward_std`` over the rewards and ``reward_<part>``, each part's mean, scalars.
    """
    return {
        "reward_mean": jnp.mean(rewards),
        "reward_std": jnp.std(rewards),
        **{f"reward_{name}": jnp.mean(part) for name, part in parts.items()},
    }


def advantages(values: jax.Array, group: Group) -> jax.Array:
    """Group-relative advantages of ``values`` in groups of ``group.size`` consecutive rows.

    Args:
      values: ``(B,)`` rewards (or one reward part), ``B`` a multiple of ``group.size``.
      group: the group (its size and advantage clip).

    Returns:
      ``(B,)`` float32 advantages (``losses.group_advantages``).

    Raises:
      ValueError: if ``group.size < 2``.
    """
    grouped = values.reshape(-1, group.size)
    return losses.group_advantages(grouped, adv_clip=group.adv_clip, global_std=group.global_std).reshape(-1)
