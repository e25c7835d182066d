"""The ``digit-scorer`` program: one ``score`` node (a reward model's single forward pass)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe.card import Card
from jaxpipe.digits.digit_scorer.card import COMPONENT
from jaxpipe.program import Bound, ComponentNode, Program
from jaxpipe.request import Request

__all__ = ["program"]


def _score(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    logits = card[COMPONENT](reads["image"] * 2.0 - 1.0)
    return {"scores": {k: jax.nn.softmax(v, axis=-1) for k, v in logits.items()}}


def _bind(card: Card, request: Request) -> Bound:
    expected = card.spec.config.image_shape
    if request.image is None:
        raise ValueError(f"{card.model_id!r} scores an image: the request needs image={expected} in [0, 1]")
    image = jnp.asarray(request.image, jnp.float32)
    if tuple(image.shape) != tuple(expected):
        raise ValueError(
            f"{card.model_id!r}: image must have shape {tuple(expected)} in [0, 1]; got {tuple(image.shape)}"
        )
    return Bound(slots={"image": image[None]}, settings=())


@functools.cache
def program() -> Program:
    """Reads ``image`` ``(H, W, C)`` in [0, 1], runs the scorer on ``2·image - 1`` and returns the
    artifact ``"scores"``: class probabilities per head (``{head: (K,)}``).

    Returns:
        The ``score`` program (one shared instance); binding a request without an image of the card's
        ``image_shape`` raises ValueError.
    """
    return Program(
        name="score",
        inputs=("image",),
        nodes=(ComponentNode("score", _score, reads=("image",), writes=("scores",), component=COMPONENT),),
        outputs=(("scores", "scores"),),
        bind=_bind,
    )
