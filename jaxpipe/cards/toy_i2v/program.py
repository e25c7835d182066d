"""The ``wan-i2v`` program: encode text (cached) and the first frame -> ``i2v_denoise`` -> decode."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.cards.toy_i2v.card import LOOP_ID, MODEL_ID
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program
from jaxpipe.request import Request

__all__ = ["program"]


def _encode_image(card: Card, reads) -> dict[str, jax.Array]:
    """``image`` ``(B, H, W, C)`` in [0, 1] -> ``first_frame`` latent ``(B, h, w, C)``."""
    return {"first_frame": card["vae"].encode(reads["image"] * 2.0 - 1.0)}


def _bind(card: Card, request: Request) -> Bound:
    bound = generator.bind_text(card, request, LOOP_ID)
    expected = card.spec.config.image_shape
    if request.image is None:
        raise ValueError(f"{card.model_id!r} animates a first frame: the request needs image={expected} in [0, 1]")
    if tuple(request.image.shape) != expected:
        raise ValueError(
            f"{card.model_id!r}: image must have shape {expected} in [0, 1]; got {tuple(request.image.shape)}"
        )
    if isinstance(request.image, jax.Array):
        image = request.image.astype(jnp.float32)[None]
    else:
        image = np.asarray(request.image, np.float32)[None]
    return dataclasses.replace(bound, slots={**bound.slots, "image": image})


@functools.cache
def program() -> Program:
    """The ``wan-i2v`` program: encode text (cached) and the first frame -> ``i2v_denoise`` -> decode.

    Request: ``prompt`` and ``image`` ``(H, W, C)`` in [0, 1] (both required), ``seed``,
    ``num_steps``, ``guidance``. Artifacts: ``"video"`` ``(T, H, W, C)`` in [0, 1], ``"latents"``
    ``(T, h, w, C)`` and ``"text"`` (the prompt).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key", "image"),
        nodes=(
            *generator.text_nodes(),
            ComponentNode("encode_image", _encode_image, reads=("image",), writes=("first_frame",), component="vae"),
            LoopNode(
                LOOP_ID,
                generator.start_denoise(),
                reads=generator.DENOISE_READS + ("first_frame",),
                writes=("latents",),
            ),
            ComponentNode("decode", generator.decode_video, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=_bind,
    )
