"""The ``unified`` program: refine the prompt (``ar_decode``) -> encode the refined prompt -> denoise -> decode.

Keys: request ``seed`` gives ``key = jax.random.key(seed)``; the LM draws with ``fold_in(key, 0)``
and the denoiser with ``fold_in(key, 1)``, exactly as ``jaxpipe.cards.unified.generate_from_ids``,
so the engine's output equals ``unified.generate`` for the same seed.

The refined prompt is only known after the ``refine`` loop, so its text encoding runs inside the
program after that loop; the engine's feature cache resolves only the empty prompt (``encode_null``)
up front.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import common
from jaxpipe.cards.unified import DENOISE_LOOP, MODEL_ID, REFINE_LOOP, eos_id, refined_ids
from jaxpipe.loops import ar, denoise
from jaxpipe.program import (
    Bound,
    ComponentNode,
    LoopNode,
    Program,
    bind_text,
    encode_null,
    encode_text,
    settings,
)
from jaxpipe.request import Request

__all__ = ["program", "refined_text"]


def _request_keys(seed: jax.Array, stream: int) -> jax.Array:
    return jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), stream))(seed)


def _start_refine(card: Card, reads: Mapping[str, Any], config: ar.ARConfig) -> ar.ARState:
    """Start the LM on the prompt ``ids`` ``(B, L)`` with keys ``fold_in(key(seed), 0)``."""
    return ar.init(card["llm"], reads["ids"], _request_keys(reads["seed"], 0), config)


def _lm_tokens(state: ar.ARState) -> jax.Array:
    return state.tokens


def _refined(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The LM buffer ``(B, T)`` -> the refined prompt ids ``(B, L)`` (``<eos>`` -> ``<pad>``)."""
    width = card["text_encoder"].cfg.max_len
    return {"refined": refined_ids(reads["lm_tokens"], eos_id(card), width)}


def _encode_refined(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    return encode_text(card, {"ids": reads["refined"]})


def _start_denoise(card: Card, reads: Mapping[str, Any], config: denoise.DenoiseConfig) -> denoise.DenoiseState:
    """Start the denoise loop on the refined prompt's encoding (the unconditional half only when
    ``config.guidance != 1``) with keys ``fold_in(key(seed), 1)``."""
    guided = config.guidance != 1.0
    cond = denoise.Conditioning(
        context=reads["context"],
        context_mask=reads["context_mask"],
        uncond_context=reads["uncond_context"] if guided else None,
        uncond_mask=reads["uncond_mask"] if guided else None,
    )
    return denoise.init(_request_keys(reads["seed"], 1), card.spec.config.latent_shape, cond, config)


def _decode(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """``latents`` ``(B, 1, h, w, C)`` -> ``image`` ``(B, H, W, C)`` in [0, 1]."""
    return {"image": common.to_unit(card["vae"].decode(reads["latents"][:, 0]))}


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text to an image and takes no image (got image={request.image.shape})")
    bound = bind_text(card, request, DENOISE_LOOP)
    words = int(np.count_nonzero(bound.slots["ids"]))
    limit = card.spec.config.max_prompt_words
    if words == 0:
        raise ValueError(f"{card.model_id!r}: the prompt needs at least one word (e.g. 'seven')")
    if words > limit:
        raise ValueError(
            f"{card.model_id!r}: prompt {request.prompt!r} has {words} words; the refiner needs room to add words, "
            f"so prompts may have at most max_prompt_words = {limit}"
        )
    refine = card.spec.loop(REFINE_LOOP).config
    temperature = request.inputs.get("temperature")
    if temperature is not None:
        refine = refine.replace(temperature=temperature)
    loops = {**dict(bound.settings), REFINE_LOOP: refine}
    return dataclasses.replace(bound, settings=settings(**loops))


@functools.cache
def program() -> Program:
    """The ``unified`` program: refine (ar) -> encode refined prompt -> denoise -> decode.

    Request: ``prompt`` (required, at most ``config.max_prompt_words`` words), ``seed``,
    ``num_steps``, ``guidance``; ``inputs={"temperature": t}`` overrides the refiner's (0 =
    greedy). Artifacts: ``"image"`` ``(H, W, C)`` in [0, 1], ``"latents"`` ``(1, h, w, C)``,
    ``"refined"`` (the refined prompt's ids ``(L,)``, ``<pad>``-padded; ``refined_text`` reads
    them) and ``"text"`` (the prompt as given).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "seed"),
        nodes=(
            ComponentNode(
                "encode_null", encode_null, ("null_ids",), ("uncond_context", "uncond_mask"), component="text_encoder", cached=True
            ),
            LoopNode(REFINE_LOOP, _start_refine, reads=("ids", "seed"), writes=("lm_tokens",), result=_lm_tokens),
            ComponentNode("refined", _refined, reads=("lm_tokens",), writes=("refined",)),
            ComponentNode(
                "encode_refined", _encode_refined, ("refined",), ("context", "context_mask"), component="text_encoder", cached=True
            ),
            LoopNode(
                DENOISE_LOOP,
                _start_denoise,
                reads=("seed", "context", "context_mask", "uncond_context", "uncond_mask"),
                writes=("latents",),
            ),
            ComponentNode("decode", _decode, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents"), ("refined", "refined")),
        bind=_bind,
    )


def refined_text(card: Card, refined: Any) -> str:
    """The words of a ``"refined"`` artifact ``(L,)`` (``<pad>`` dropped)."""
    words = card.spec.tokenizer.words
    return " ".join(words[int(i)] for i in np.asarray(refined).reshape(-1) if int(i) != 0)
