"""The ``digit-scorer`` card: the digits world's reward model, served as a card.

One component, ``"scorer"`` (a ``DigitScorer`` CNN), bound by one loop, ``score``. ``score``
returns class probabilities per head, ``predict`` the most likely labels; both take images
``(B, 16, 16, 1)`` in ``[-1, 1]`` (the generators' decoded output, rescaled) and are pure.

The bundled weights (``jaxpipe/digits/assets/digit-scorer``) are trained on the **held-out** digits only,
so scoring the generators' training digits measures generalisation; reproduce them with::

    python -m jaxpipe.digits.pretrain.scorer --out jaxpipe/digits/assets/digit-scorer
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.digits.digit_scorer.network import HEADS, DigitScorer, ScorerConfig

MODEL_ID = "digit-scorer"
"""The bundled card's id."""
LOOP_ID = "score"
"""The card's one loop."""
COMPONENT = "scorer"
"""The card's one component, a ``DigitScorer``."""

__all__ = ["COMPONENT", "Config", "HEADS", "LOOP_ID", "MODEL_ID", "build", "logits", "predict", "score"]


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``digit-scorer`` card.

    Attributes:
        scorer: the network's sizes.
    """

    scorer: ScorerConfig = ScorerConfig()

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """Per-image input shape ``(S, S, C)``."""
        return (self.scorer.image_size, self.scorer.image_size, self.scorer.image_channels)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``digit-scorer`` card with a freshly initialised scorer (deterministic in ``seed``).

    Args:
        config: the card's sizes.
        seed: the initialisation seed.
        model_id: the card's id.

    Returns:
        The card: one component, ``COMPONENT``, bound by one loop, ``LOOP_ID``.
    """
    spec = CardSpec(
        model_id=model_id,
        family="digit_scorer",
        loops=(LoopSpec(LOOP_ID, "score", (COMPONENT,)),),
        recipe=(LOOP_ID,),
        parity=("C0", "C1", "C4"),
        capabilities=("score",),
        config=config,
    )
    return Card({COMPONENT: DigitScorer(config.scorer, rngs=nnx.Rngs(seed))}, spec)


def logits(card: Card, images: jax.Array) -> dict[str, jax.Array]:
    """The scorer's logits ``{head: (B, K)}`` for images ``(B, 16, 16, 1)`` in ``[-1, 1]``.

    Pure and jittable.

    Args:
        card: a ``digit-scorer`` card.
        images: ``(B, 16, 16, 1)`` float in ``[-1, 1]``, background -1 (map ``[0, 1]`` images with ``2 * x - 1``).

    Returns:
        ``{head: (B, K)}`` for each head of ``HEADS`` (``K`` its number of classes).
    """
    return card[COMPONENT](images)


def score(card: Card, images: jax.Array) -> dict[str, jax.Array]:
    """Class probabilities per head: ``{"digit": (B, 10), "stroke": (B, 2), "position": (B, 3), "brightness": (B, 2)}``.

    Pure and jittable (``jax.jit(score)(card, images)``); each row sums to 1. Label ``k`` of a head
    is index ``k`` of its word tuple (``DIGIT_WORDS``, ``STROKES``, ``POSITIONS``, ``BRIGHTNESS``).

    Args:
        card: a ``digit-scorer`` card.
        images: ``(B, 16, 16, 1)`` float in ``[-1, 1]``, background -1 (map ``[0, 1]`` images with ``2 * x - 1``).

    Returns:
        ``{head: (B, K)}`` probabilities for each head of ``HEADS``.
    """
    return {name: jax.nn.softmax(value, axis=-1) for name, value in logits(card, images).items()}


def predict(card: Card, images: jax.Array) -> dict[str, jax.Array]:
    """The most likely label per head: ``{head: (B,) int32}``.

    Pure and jittable.

    Args:
        card: a ``digit-scorer`` card.
        images: ``(B, 16, 16, 1)`` float in ``[-1, 1]``, background -1 (map ``[0, 1]`` images with ``2 * x - 1``).

    Returns:
        ``{head: (B,) int32}`` for each head of ``HEADS``.
    """
    return {name: jnp.argmax(value, axis=-1).astype(jnp.int32) for name, value in logits(card, images).items()}
