"""The ``flux-t2i`` program: encode text (cached) -> ``t2i_denoise`` -> decode."""

from __future__ import annotations

import functools

import jax

from jaxpipe.card import Card
from jaxpipe.cards import common
from jaxpipe.cards.flux_t2i import LOOP_ID, MODEL_ID
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, bind_text, start_denoise, text_nodes
from jaxpipe.request import Request


def _decode(card: Card, reads) -> dict[str, jax.Array]:
    """``latents`` ``(B, 1, h, w, C)`` -> ``image`` ``(B, H, W, C)`` in [0, 1]."""
    return {"image": common.to_unit(card["vae"].decode(reads["latents"][:, 0]))}


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text to an image and takes no image (got image={request.image.shape})")
    return bind_text(card, request, LOOP_ID)


@functools.cache
def program() -> Program:
    """The ``flux-t2i`` program: encode text (cached) -> ``t2i_denoise`` -> decode.

    Request: ``prompt`` (required), ``seed``, ``num_steps``, ``guidance``. Artifacts: ``"image"``
    ``(H, W, C)`` in [0, 1], ``"latents"`` ``(1, h, w, C)`` and ``"text"`` (the prompt).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "seed"),
        nodes=(
            *text_nodes(),
            LoopNode(
                LOOP_ID,
                start_denoise,
                reads=("seed", "context", "context_mask", "uncond_context", "uncond_mask"),
                writes=("latents",),
            ),
            ComponentNode("decode", _decode, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents")),
        bind=_bind,
    )
