"""Rollouts: the card's own loops run with capture on, plus the recomputations a trainer needs.

Nothing here samples by itself: ``render`` is the card's denoise loop (``loops.denoise.run``)
and ``refine`` the card's AR loop (``loops.ar.run``), the same code the engine serves with, so
C2 holds by construction — recomputing a captured step under the rollout weights
(``generator_stats`` / ``token_log_probs``) reproduces its log-prob (ratio == 1).

Group layout: P prompts, K samples each, B = P·K rows; row ``p·K + k`` is sample ``k`` of
prompt ``p``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxpipe.card import Card
from jaxpipe.cards import common
from jaxpipe.loops import ar, denoise
from jaxpipe.nn import RefinerLM
from jaxpipe.training import losses

__all__ = [
    "Generated",
    "Refinement",
    "RewardFn",
    "render",
    "refine",
    "generator_stats",
    "token_log_probs",
    "repeat_groups",
    "score",
]

RewardFn = Callable[[jax.Array, Mapping[str, jax.Array]], jax.Array]
"""``reward(images (B, H, W, C) in [0, 1], labels {term: (B,) int}) -> (B,)`` rewards."""


class Generated(NamedTuple):
    """A rendered batch: ``images`` ``(B, H, W, C)`` in [0, 1], the text conditioning it used, and the
    captured SDE steps (``Transition`` fields ``(S, B, ...)``; ``None`` for an uncaptured rollout)."""

    images: jax.Array
    cond: denoise.Conditioning
    trajectory: denoise.Transition | None


class Refinement(NamedTuple):
    """A captured AR rollout, every field ``(B, ...)``.

    tokens ``(B, T)``: prompt then generated tokens; prompt_length / length ``(B,)``;
    mask ``(B, T)`` bool: the generated slots (EOS included); log_prob ``(B, T)``: the captured
    ``log π(y_t | prompt, y_<t)`` at each generated slot, 0 elsewhere.
    """

    tokens: jax.Array
    prompt_length: jax.Array
    length: jax.Array
    mask: jax.Array
    log_prob: jax.Array


def render(
    card: Card, transformer: str, ids: jax.Array, keys: jax.Array, sampling: denoise.DenoiseConfig, *, capture: bool
) -> Generated:
    """Encode ``ids`` ``(B, L)``, run the card's denoise loop on ``card[transformer]`` (per-request
    ``keys`` ``(B,)``), decode. ``sampling.guidance`` must be 1 (the recompute is then faithful)."""
    if sampling.guidance != 1.0:
        raise ValueError(f"RL rollouts sample at guidance 1 so the log-prob recompute is faithful (got {sampling.guidance})")
    cond = common.encode_prompts(card, ids)
    start = denoise.init(keys, card.spec.config.latent_shape, cond, sampling)
    final, trajectory = denoise.run(card[transformer], start, sampling, capture=capture)
    images = common.to_unit(card["vae"].decode(final.x[:, 0]))
    return Generated(images, cond, trajectory)


def refine(llm: RefinerLM, ids: jax.Array, keys: jax.Array, config: ar.ARConfig) -> Refinement:
    """Continue prompts ``ids`` ``(B, L)`` with the card's AR loop, capturing every token's log-prob."""
    start = ar.init(llm, ids, keys, config)
    final, records = ar.run(llm, start, config, capture=True)
    width = final.tokens.shape[1]
    mask = ar.generated_mask(final.prompt_length, final.length, width)
    return Refinement(final.tokens, final.prompt_length, final.length, mask, ar.scatter_steps(records.log_prob, records, width))


def generator_stats(model, generated: Generated, sampling: denoise.DenoiseConfig) -> tuple[jax.Array, jax.Array]:
    """``(S, B)`` log-probs and ``(S, B, ...)`` SDE means of the captured steps under ``model``."""
    if generated.trajectory is None:
        raise ValueError("this rollout captured no SDE steps (render(..., capture=True) with an SDE sampler)")
    return denoise.trajectory_stats(model, generated.trajectory, generated.cond, sampling)


def token_log_probs(llm: RefinerLM, refinement: Refinement) -> jax.Array:
    """``(B, T)`` recomputed ``log π(y_t | prompt, y_<t)`` of the generated tokens under ``llm``."""
    return ar.sequence_log_probs(llm, refinement.tokens, refinement.prompt_length, refinement.mask)


def repeat_groups(batch: Mapping[str, Any], group_size: int) -> tuple[jax.Array, dict[str, jax.Array]]:
    """A batch of P prompts ``{"ids": (P, L), "labels": {term: (P,)}}`` repeated to ``B = P·K`` rows."""
    ids = jnp.asarray(batch["ids"])
    chex.assert_rank(ids, 2)
    labels = {name: jnp.repeat(jnp.asarray(v), group_size, axis=0) for name, v in batch.get("labels", {}).items()}
    for name, v in labels.items():
        if v.shape != (ids.shape[0] * group_size,):
            raise ValueError(f"labels[{name!r}] must be ({ids.shape[0]},), one per prompt (got {v.shape[0] // group_size} rows)")
    return jnp.repeat(ids, group_size, axis=0), labels


def score(
    reward_fn: RewardFn, images: jax.Array, labels: Mapping[str, jax.Array], group_size: int, adv_clip: float
) -> tuple[jax.Array, jax.Array]:
    """``(rewards (B,), group advantages (B,))`` of a grouped batch of images."""
    rewards = jnp.asarray(reward_fn(images, labels), jnp.float32)
    chex.assert_shape(rewards, (images.shape[0],))
    advantages = losses.group_advantages(rewards.reshape(-1, group_size), adv_clip=adv_clip).reshape(-1)
    return rewards, advantages
