"""The ``wan22-moe`` program: encode text (cached) -> ``t2v_denoise`` (two σ-routed experts) -> decode every frame."""

from __future__ import annotations

import functools

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.cards.wan22_moe.card import LOOP_ID, MODEL_ID
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program
from jaxpipe.request import Request


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(
            f"{card.model_id!r} renders text to a video and takes no image (got image={request.image.shape}); "
            "animate a first frame with 'wan-i2v'"
        )
    return generator.bind_text(card, request, LOOP_ID)


@functools.cache
def program() -> Program:
    """The ``wan22-moe`` program: encode text (cached) -> ``t2v_denoise`` -> decode.

    Request: ``prompt`` (required), ``seed``, ``num_steps``, ``guidance``. Artifacts: ``"video"``
    ``(T, H, W, C)`` in [0, 1], ``"latents"`` ``(T, h, w, C)`` and ``"text"`` (the prompt).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key"),
        nodes=(
            *generator.text_nodes(),
            LoopNode(LOOP_ID, generator.start_denoise(), reads=generator.DENOISE_READS, writes=("latents",)),
            ComponentNode("decode", generator.decode_video, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=_bind,
    )
