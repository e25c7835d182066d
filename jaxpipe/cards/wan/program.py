"""The ``wan`` program: UMT5 encodings of the prompt and the negative prompt (cached) -> ``t2v_denoise`` -> decode."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.cards.wan.card import LOOP_ID
from jaxpipe.loops import denoise
from jaxpipe.nn.wan import WanCond
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["program", "encode_text", "encode_null", "start", "decode", "tokenize"]


def _encode(card: Card, ids: jax.Array) -> jax.Array:
    # WanPipeline keeps each prompt's own tokens and zeroes the padding rows (the transformer sees no mask)
    mask = ids != 0
    hidden = card["text_encoder"](ids, mask.astype(np.int32))
    return hidden * mask[..., None]


def encode_text(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The prompt's UMT5 encoding, padding rows zero (as WanPipeline feeds it: the transformer sees no mask).

    Args:
      card: a ``wan`` card.
      reads: ``{"ids": (B, L)}``.

    Returns:
      ``{"context": (B, L, d_model)}`` (4096 for UMT5-XXL).
    """
    return {"context": _encode(card, reads["ids"])}


def encode_null(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The negative prompt's UMT5 encoding: CFG's other branch.

    Args:
      card: a ``wan`` card.
      reads: ``{"null_ids": (B, L)}``.

    Returns:
      ``{"uncond_context": (B, L, d_model)}``, padding rows zero.
    """
    return {"uncond_context": _encode(card, reads["null_ids"])}


def start(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: denoise.DenoiseConfig) -> denoise.DenoiseState:
    """Starts the denoise loop: noise of the loop's latent shape, the prompt (and, under CFG, the negative
    prompt) as ``WanCond``.

    Args:
      card: a ``wan`` card.
      loop: the ``t2v_denoise`` loop.
      reads: ``key`` ``(B,)``, ``context`` and ``uncond_context`` ``(B, L, D)``.
      config: the loop's settings.

    Returns:
      The loop's first ``DenoiseState``.
    """
    cond = WanCond(reads["context"], None, None)
    uncond = WanCond(reads["uncond_context"], None, None) if config.guide.needs_uncond else None
    return denoise.init(reads["key"], loop.latent_shape, cond, config, uncond)


def decode(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Decodes the latents with the Wan autoencoder.

    Args:
      card: a ``wan`` card.
      reads: ``{"latents": (B, f, h, w, C)}``.

    Returns:
      ``{"video": (B, F, H, W, 3)}`` in [0, 1], ``F = 1 + 4·(f - 1)``.
    """
    return {"video": generator.to_unit(card["vae"].decode_latents(reads["latents"]))}


def tokenize(card: Card, prompts: list[str]) -> np.ndarray:
    """Token ids of ``prompts`` with the card's UMT5 tokenizer.

    Args:
      card: a ``wan`` card.
      prompts: B prompt strings.

    Returns:
      ``(B, max_sequence_length)`` int32 ids.

    Raises:
      ValueError: if the card has no tokenizer.
    """
    tokenizer = card.spec.tokenizer
    if tokenizer is None:
        raise ValueError(f"{card.model_id!r} has no tokenizer: pass token ids directly")
    ids, _ = tokenizer.load()(list(prompts), card.spec.config.max_sequence_length)
    return np.asarray(ids, np.int32)


def _bind(card: Card, request: Request) -> Bound:
    if request.prompt is None:
        raise ValueError(f"{card.model_id!r} renders a text prompt: the request needs prompt=...")
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text to video and takes no image")
    config = generator.loop_config(card, LOOP_ID, request)
    negative = request.inputs.get("negative_prompt", card.spec.config.negative_prompt)
    ids = tokenize(card, [request.prompt, negative])
    slots = {"ids": ids[:1], "null_ids": ids[1:], "key": generator.request_keys([request.seed])}
    return Bound(slots=slots, settings=settings(**{LOOP_ID: config}), artifacts={"text": request.prompt})


@functools.cache
def program() -> Program:
    """The ``wan`` program: encode the prompt and the negative prompt (cached) -> ``t2v_denoise`` -> decode.

    Request: ``prompt``, ``seed``, ``num_steps``, ``guidance``, ``inputs={"negative_prompt": ...}``.
    Artifacts: ``"video"`` ``(F, H, W, 3)`` in [0, 1], ``"latents"`` ``(f, h, w, 16)`` and ``"text"``.
    """
    return Program(
        name="wan",
        inputs=("ids", "null_ids", "key"),
        nodes=(
            ComponentNode("encode_text", encode_text, ("ids",), ("context",), component="text_encoder", cached=True),
            ComponentNode("encode_null", encode_null, ("null_ids",), ("uncond_context",), component="text_encoder", cached=True),
            LoopNode(LOOP_ID, start, reads=("key", "context", "uncond_context"), writes=("latents",)),
            ComponentNode("decode", decode, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=_bind,
    )
