"""The ``multi-expert`` program: refine with every expert -> compose -> encode text -> denoise -> decode.

Keys: request ``seed`` gives ``key = jax.random.key(seed)``; refiner ``i`` draws with
``multi_expert.expert_keys`` (``fold_in(key, 0)`` for refiner 0, ``fold_in(key, i + 1)`` after) and
the denoiser with ``fold_in(key, 1)``, exactly as ``jaxpipe.cards.multi_expert.generate_from_ids``,
so the engine's output equals ``multi_expert.generate`` for the same seed.

The N refiners run as one component node (one ``vmap`` over the stacked expert axis of a fused AR
decode, each expert restricted to its slot), not as an engine-stepped loop: a request's refinement
depends only on the refiners' weights, its prompt and its seed, so the engine resolves it per
request up front (cached under ``refiners``, whose version moves with every expert's), then the
composed prompt's text encoding (cached under ``text_encoder``, keyed by the composed ids: new
refiners that compose the same prompt still hit). The denoise loop is stepped by the engine.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import common, multi_expert
from jaxpipe.cards.multi_expert import COMPONENT, DENOISE_LOOP, MODEL_ID, REFINE_LOOP
from jaxpipe.cards.unified import eos_id
from jaxpipe.loops import ar, denoise
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, bind_text, encode_null, encode_text
from jaxpipe.request import Request

__all__ = ["program", "composed_text"]


def _request_keys(seed: jax.Array) -> jax.Array:
    return jax.vmap(jax.random.key)(seed)


def _refine(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Every refiner continues ``ids`` ``(B, L)``: ``expert_tokens`` ``(B, N, T)``, each expert's
    generated tokens (``<eos>`` included) in its buffer positions, ``<pad>`` elsewhere."""
    config = card.spec.loop(REFINE_LOOP).config
    keys = multi_expert.expert_keys(_request_keys(reads["seed"]), card.spec.config.num_refiners)
    final = multi_expert.refine_from_ids(card, reads["ids"], keys, config)
    generated = jax.vmap(lambda s: ar.generated_mask(s.prompt_length, s.length, s.tokens.shape[1]))(final)
    return {"expert_tokens": jnp.transpose(jnp.where(generated, final.tokens, 0), (1, 0, 2))}


def _compose(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """``ids`` ``(B, L)`` and ``expert_tokens`` ``(B, N, T)`` -> the composed prompt ids ``(B, L)``."""
    ids, tokens = reads["ids"], jnp.transpose(reads["expert_tokens"], (1, 0, 2))
    generated = jnp.ones(tokens.shape, bool)  # positions that were not generated already hold <pad>
    return {"composed": multi_expert.compose(ids, tokens, generated, eos_id(card), ids.shape[1])}


def _encode_composed(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    return encode_text(card, {"ids": reads["composed"]})


def _start_denoise(card: Card, reads: Mapping[str, Any], config: denoise.DenoiseConfig) -> denoise.DenoiseState:
    """Start the denoise loop on the composed prompt's encoding (the unconditional half only when
    ``config.guidance != 1``) with keys ``fold_in(key(seed), 1)``."""
    guided = config.guidance != 1.0
    cond = denoise.Conditioning(
        context=reads["context"],
        context_mask=reads["context_mask"],
        uncond_context=reads["uncond_context"] if guided else None,
        uncond_mask=reads["uncond_mask"] if guided else None,
    )
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(_request_keys(reads["seed"]))
    return denoise.init(keys, card.spec.config.latent_shape, cond, config)


def _decode(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """``latents`` ``(B, 1, h, w, C)`` -> ``image`` ``(B, H, W, C)`` in [0, 1]."""
    return {"image": common.to_unit(card["vae"].decode(reads["latents"][:, 0]))}


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text to an image and takes no image (got image={request.image.shape})")
    bound = bind_text(card, request, DENOISE_LOOP)
    words = int(np.count_nonzero(bound.slots["ids"]))
    limit = card.spec.config.max_prompt_words
    if words > limit:
        raise ValueError(
            f"{card.model_id!r}: prompt {request.prompt!r} has {words} words; each of the "
            f"{card.spec.config.num_refiners} refiners needs room for its words, so prompts may have at most "
            f"max_prompt_words = {limit}"
        )
    return bound


@functools.cache
def program() -> Program:
    """The ``multi-expert`` program (any number of refiners): refine with every expert (one ``vmap``)
    -> compose -> encode the composed prompt -> denoise -> decode.

    Request: ``prompt`` (required, at most ``config.max_prompt_words`` words), ``seed``,
    ``num_steps``, ``guidance``; the refiners decode with the card's ``refine`` loop settings.
    Artifacts: ``"image"`` ``(H, W, C)`` in [0, 1], ``"latents"`` ``(1, h, w, C)``, ``"composed"``
    (the composed prompt's ids ``(L,)``, ``<pad>``-padded; ``composed_text`` reads them) and
    ``"text"`` (the prompt as given).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "seed"),
        nodes=(
            ComponentNode(
                "encode_null", encode_null, ("null_ids",), ("uncond_context", "uncond_mask"), component="text_encoder", cached=True
            ),
            ComponentNode("refine", _refine, ("ids", "seed"), ("expert_tokens",), component=COMPONENT, cached=True),
            ComponentNode("compose", _compose, ("ids", "expert_tokens"), ("composed",), component=COMPONENT, cached=True),
            ComponentNode(
                "encode_composed", _encode_composed, ("composed",), ("context", "context_mask"), component="text_encoder", cached=True
            ),
            LoopNode(
                DENOISE_LOOP,
                _start_denoise,
                reads=("seed", "context", "context_mask", "uncond_context", "uncond_mask"),
                writes=("latents",),
            ),
            ComponentNode("decode", _decode, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents"), ("composed", "composed")),
        bind=_bind,
    )


def composed_text(card: Card, composed: Any) -> str:
    """The words of a ``"composed"`` artifact ``(L,)`` (``<pad>`` dropped)."""
    words = card.spec.tokenizer.words
    return " ".join(words[int(i)] for i in np.asarray(composed).reshape(-1) if int(i) != 0)
