"""The ``flux`` program: CLIP (pooled) and T5 (sequence) text encodings, cached -> ``t2i_denoise`` -> decode.

The one ``ids`` input row holds the CLIP ids then the T5 ids (``Tokenizers``), so RL rollouts feed a
FLUX card exactly like any text-prompted card.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.cards.flux.card import LOOP_ID
from jaxpipe.loops import denoise
from jaxpipe.nn.flux import FluxCond
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["program", "split_ids", "encode_pooled", "encode_sequence", "start", "decode"]


def split_ids(card: Card, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Splits the one ``ids`` row into its CLIP and T5 parts.

    Args:
      card: a ``flux`` card.
      ids: ``(B, clip_length + t5_length)`` int ids.

    Returns:
      ``(clip_ids, t5_ids)``: ``(B, clip_length)`` and ``(B, t5_length)``.

    Raises:
      ValueError: if ``ids`` is not ``clip_length + max_sequence_length`` wide.
    """
    n = card.spec.config.clip_length
    expected = n + card.spec.config.max_sequence_length
    if ids.shape[-1] != expected:
        raise ValueError(
            f"{card.model_id!r}: ids must be (B, {expected}) — {n} CLIP then {expected - n} T5 ids (got {ids.shape})"
        )
    return ids[:, :n], ids[:, n:]


def encode_pooled(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """CLIP's pooled embedding of the prompt (FluxPipeline ignores CLIP's sequence).

    Args:
      card: a ``flux`` card.
      reads: ``{"ids": (B, clip_length + t5_length)}``.

    Returns:
      ``{"pooled": (B, hidden_size)}`` (768 for CLIP-L).
    """
    clip_ids, _ = split_ids(card, reads["ids"])
    _, pooled = card["text_encoder"](clip_ids)
    return {"pooled": pooled}


def encode_sequence(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """T5's sequence embedding of the prompt, unmasked as FluxPipeline runs it.

    Args:
      card: a ``flux`` card.
      reads: ``{"ids": (B, clip_length + t5_length)}``.

    Returns:
      ``{"context": (B, max_sequence_length, d_model)}`` (4096 for T5-XXL).
    """
    _, t5_ids = split_ids(card, reads["ids"])
    return {"context": card["text_encoder_2"](t5_ids)}


def start(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config) -> denoise.DenoiseState:
    """Starts the denoise loop: noise of the loop's latent shape, conditioned on a ``FluxCond``.

    Args:
      card: a ``flux`` card.
      loop: the ``t2i_denoise`` loop.
      reads: ``key`` ``(B,)``, ``context`` ``(B, S, D)`` and ``pooled`` ``(B, P)``.
      config: the loop's ``Sampling`` (its ``embedded_guidance``, 1.0 when ``None``, is every row's scale).

    Returns:
      The loop's first ``DenoiseState``.
    """
    b = reads["context"].shape[0]
    scale = 1.0 if config.embedded_guidance is None else config.embedded_guidance
    cond = FluxCond(reads["context"], reads["pooled"], jnp.full((b,), scale, jnp.float32))
    return denoise.init(reads["key"], loop.latent_shape, cond, config)


def decode(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Decodes the latents as the pipeline does (un-normalise, then the autoencoder's decoder).

    Args:
      card: a ``flux`` card.
      reads: ``{"latents": (B, h, w, C)}``.

    Returns:
      ``{"image": (B, H, W, 3)}`` in [0, 1].
    """
    return {"image": generator.to_unit(card["vae"].decode_latents(reads["latents"]))}


def _bind(card: Card, request: Request) -> Bound:
    if request.prompt is None:
        raise ValueError(f"{card.model_id!r} renders a text prompt: the request needs prompt=...")
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text to an image and takes no image")
    config = card.spec.loop(LOOP_ID).config
    changes = {}
    if request.num_steps is not None:
        changes["num_steps"] = request.num_steps
    if request.guidance is not None:
        if config.embedded_guidance is None:
            raise ValueError(f"{card.model_id!r} has no guidance embedding (FLUX.1-schnell): leave guidance unset")
        changes["embedded_guidance"] = float(request.guidance)
    config = dataclasses.replace(config, **changes) if changes else config
    ids = card.spec.tokenizer.encode([request.prompt])
    slots = {"ids": np.asarray(ids, np.int32), "key": generator.request_keys([request.seed])}
    return Bound(slots=slots, settings=settings(**{LOOP_ID: config}), artifacts={"text": request.prompt})


@functools.cache
def program() -> Program:
    """The ``flux`` program: encode (CLIP pooled, T5 sequence; cached) -> ``t2i_denoise`` -> decode.

    Request: ``prompt``, ``seed``, ``num_steps``, ``guidance`` (FLUX.1-dev's embedded scale).
    Artifacts: ``"image"`` ``(H, W, 3)`` in [0, 1], ``"latents"`` ``(h, w, 16)`` and ``"text"``.
    """
    return Program(
        name="flux",
        inputs=("ids", "key"),
        nodes=(
            ComponentNode("encode_pooled", encode_pooled, ("ids",), ("pooled",), component="text_encoder", cached=True),
            ComponentNode(
                "encode_sequence", encode_sequence, ("ids",), ("context",), component="text_encoder_2", cached=True
            ),
            LoopNode(LOOP_ID, start, reads=("key", "context", "pooled"), writes=("latents",)),
            ComponentNode("decode", decode, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents")),
        bind=_bind,
    )
