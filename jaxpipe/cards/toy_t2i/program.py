"""The ``flux-t2i`` program: encode text (cached) -> ``t2i_denoise`` -> decode."""

from __future__ import annotations

import functools

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.cards.toy_t2i.card import LOOP_ID, MODEL_ID
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program
from jaxpipe.request import Request

__all__ = ["program"]


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(
            f"{card.model_id!r} renders text to an image and takes no image (got image={request.image.shape})"
        )
    return generator.bind_text(card, request, LOOP_ID)


@functools.cache
def program() -> Program:
    """The ``flux-t2i`` program: encode text (cached) -> ``t2i_denoise`` -> decode.

    Request: ``prompt`` (required), ``seed``, ``num_steps``, ``guidance``. Artifacts: ``"image"``
    ``(H, W, C)`` in [0, 1], ``"latents"`` ``(1, h, w, C)`` and ``"text"`` (the prompt).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key"),
        nodes=(
            *generator.text_nodes(),
            LoopNode(LOOP_ID, generator.start_denoise(), reads=generator.DENOISE_READS, writes=("latents",)),
            ComponentNode("decode", generator.decode_image, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents")),
        bind=_bind,
    )
