"""The digits world's rewards: the ``digit-scorer``'s probability of each prompted label.

``scorer_reward(scorer, terms)`` returns one part per term (per-expert credit in N-way RL); the
reward is their sum. A label of -1 means "not prompted" and contributes nothing; a label the
prompt does not name (``stroke = thick`` for the prompt ``"seven"``) is a *preference*.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.digits import digit_scorer
from jaxpipe.prompts import Prompts
from jaxpipe.rewards import Reward

__all__ = ["REWARD_TERMS", "ScorerReward", "scorer_reward", "label_probabilities"]

REWARD_TERMS = ("digit", "stroke", "position", "brightness")
"""Reward terms a ``digit-scorer`` reward can sum: the scorer's probability of the prompted label."""


def scorer_reward(scorer: Card, terms: tuple[str, ...] = ("digit",)) -> Reward:
    """The ``digit-scorer``'s reward: ``reward(artifacts, prompts) -> {term: (B,)}``, per term the scorer's
    probability of the label the prompt's metadata gives (``prompts.metadata[term]``; 0 where it is -1),
    the total being their sum (``jaxpipe.rewards.score``).

    A label the prompt does not name (``stroke = thick`` for the prompt ``"seven"``) is a *preference*:
    the reward then prefers images with that attribute, which is what a prompt refiner learns to ask
    for. Per-term parts give per-expert credit in N-way RL. Videos (``artifacts["video"]``,
    ``(B, T, H, W, C)``) are scored frame by frame, each term averaged over the frames; images are
    ``artifacts["image"]`` ``(B, H, W, C)`` in [0, 1].

    Args:
        scorer: a ``digit-scorer`` card.
        terms: the reward terms, from ``REWARD_TERMS``.

    Returns:
        The reward (a ``ScorerReward``: pure, it runs under ``jax.jit``, its weights passed as arguments by the
        trainers); it raises ValueError when the prompts' metadata lacks a term's labels.

    Raises:
        ValueError: if ``terms`` is empty or names a term outside ``REWARD_TERMS``.
    """
    unknown = [t for t in terms if t not in REWARD_TERMS]
    if unknown or not terms:
        raise ValueError(f"unknown reward term(s) {unknown or list(terms)}; choose from {REWARD_TERMS}")
    return ScorerReward(scorer, tuple(terms))


class ScorerReward:
    """``scorer_reward``'s reward: the scorer card's label probabilities, its weights held as a pytree
    (``weights`` / ``bind``, so the trainers pass them to their jitted step: ``jaxpipe.rewards.weighted``)."""

    def __init__(self, scorer: Card, terms: tuple[str, ...]):
        self.terms = terms
        self.spec = scorer.spec
        split = {name: nnx.split(module) for name, module in scorer.components.items()}
        self._graphs = {name: graph for name, (graph, _) in split.items()}
        self._weights = {name: state for name, (_, state) in split.items()}
        self.__name__ = self.__qualname__ = f"scorer_reward({', '.join(terms)})"

    def __repr__(self) -> str:
        return self.__name__

    @property
    def scorer(self) -> Card:
        """The scorer card at this reward's weights."""
        return Card({name: nnx.merge(self._graphs[name], w) for name, w in self._weights.items()}, self.spec)

    @property
    def weights(self) -> dict[str, nnx.State]:
        """The scorer's weights, by component."""
        return self._weights

    def bind(self, weights: dict[str, nnx.State]) -> ScorerReward:
        """This reward computing with ``weights`` (tracers inside a jitted step) in place of its own."""
        bound = copy.copy(self)
        bound._weights = weights
        return bound

    def __call__(self, artifacts: Mapping[str, jax.Array], prompts: Prompts) -> dict[str, jax.Array]:
        """``{term: (B,)}``: ``label_probabilities`` of ``artifacts["image"]`` (or ``["video"]``)."""
        images = artifacts["video"] if "video" in artifacts else artifacts["image"]
        return label_probabilities(self.scorer, images, prompts.metadata, self.terms)


def label_probabilities(
    scorer: Card, images: jax.Array, labels: Mapping[str, jax.Array], terms: tuple[str, ...]
) -> dict[str, jax.Array]:
    """``{term: (B,)}``: the ``digit-scorer``'s probability of each term's label ``labels[term]`` ``(B,)`` for
    ``images`` ``(B, H, W, C)`` in [0, 1] (videos ``(B, T, H, W, C)``: averaged over the frames); 0 where the
    label is -1.

    Args:
        scorer: a ``digit-scorer`` card.
        images: images ``(B, H, W, C)`` or videos ``(B, T, H, W, C)`` in ``[0, 1]``.
        labels: ``{term: (B,) int}`` labels (-1: not rewarded); may hold more keys than ``terms``.
        terms: the reward terms to score.

    Returns:
        ``{term: (B,) float32}`` probabilities in ``[0, 1]``.

    Raises:
        ValueError: if ``labels`` lacks one of ``terms``.
    """
    missing = [t for t in terms if t not in labels]
    if missing:
        raise ValueError(f"the prompts carry no labels for reward term(s) {missing} (metadata: {sorted(labels)})")
    frames = images.shape[1] if images.ndim == 5 else 1
    flat = images.reshape((-1, *images.shape[-3:]))
    probs = {
        k: jnp.mean(p.reshape(-1, frames, p.shape[-1]), axis=1)
        for k, p in digit_scorer.score(scorer, flat * 2.0 - 1.0).items()
    }
    parts = {}
    for term in terms:
        label = jnp.asarray(labels[term])
        picked = jnp.take_along_axis(probs[term], jnp.maximum(label, 0)[:, None], axis=1)[:, 0]
        parts[term] = jnp.where(label >= 0, picked, 0.0)
    return parts
