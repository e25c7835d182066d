"""The ``classify`` program of a ``digit-classifier`` card: one image in, class probabilities out."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxpipe.card import Card
from jaxpipe.digits.digit_classifier.card import COMPONENT, check_images
from jaxpipe.program import Bound, ComponentNode, Program
from jaxpipe.request import Request

__all__ = ["program"]


def _classify(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    return {"probabilities": jax.nn.softmax(card[COMPONENT](reads["image"]), axis=-1)}


def _bind(card: Card, request: Request) -> Bound:
    expected = card.spec.config.image_shape
    if request.image is None:
        raise ValueError(f"{card.model_id!r} classifies an image: the request needs image={expected} in [0, 1]")
    image = check_images(np.asarray(request.image)[None], expected)
    return Bound(slots={"image": image}, settings=())


@functools.cache
def program() -> Program:
    """Reads ``image`` ``(H, W, 1)`` in [0, 1] and returns the artifact ``"probabilities"`` ``(10,)``.

    Returns:
        The ``classify`` program (one shared instance); binding a request without a valid image
        (``check_images``) raises ValueError.
    """
    return Program(
        name="classify",
        inputs=("image",),
        nodes=(ComponentNode("classify", _classify, reads=("image",), writes=("probabilities",), component=COMPONENT),),
        outputs=(("probabilities", "probabilities"),),
        bind=_bind,
    )
