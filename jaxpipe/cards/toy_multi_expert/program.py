"""The ``multi-expert`` program: refine with every expert -> compose -> encode text -> denoise -> decode.

Keys: the request's ``key``; refiner ``i`` draws with ``card.expert_keys`` (``fold_in(key, 0)``
for refiner 0, ``fold_in(key, i + 1)`` after) and the denoiser with ``fold_in(key, 1)``.

The N refiners run as one component node that runs the ``refine`` loop whole (one ``vmap`` over
the stacked expert axis of a fused AR decode, each expert restricted to its slot, its records
captured), not as an engine-stepped loop: a request's refinement depends only on the refiners'
weights, its prompt, its key and the loop's settings, so the engine resolves it per request up
front (cached under ``refiners``, whose version moves with every expert's), then the composed
prompt's text encoding (cached under ``text_encoder``, keyed by the composed ids: new refiners
that compose the same prompt still hit). The denoise loop is stepped by the engine. A row whose
``refine`` input is false renders its prompt as written.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.cards.toy_multi_expert.card import (
    COMPONENT,
    DENOISE_LOOP,
    MODEL_ID,
    REFINE_LOOP,
    compose,
    expert_keys,
    slot_models,
)
from jaxpipe.cards.toy_unified import eos_id
from jaxpipe.cards.toy_unified.program import bind_refined, render_nodes
from jaxpipe.loops import ar
from jaxpipe.program import Bound, ComponentNode, Program
from jaxpipe.request import Request

__all__ = ["program", "expert_major"]


def expert_major(refinements: ar.Continuation) -> ar.Continuation:
    """The ``"refinements"`` slot with the expert axis first.

    Args:
      refinements: an ``ar.Continuation`` whose fields are ``(B, N, ...)``.

    Returns:
      The same continuation with fields ``(N, B, ...)``.
    """
    return jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), refinements)


def _refine(card: Card, reads: Mapping[str, Any], config: ar.ARConfig) -> dict[str, ar.Continuation]:
    """Every refiner continues ``ids`` ``(B, L)``: ``refinements``, an ``ar.Continuation`` with fields
    ``(B, N, ...)`` (each expert's buffer, generated slots and captured log-probs)."""
    keys = expert_keys(reads["key"], card.spec.config.num_refiners)
    allowed = jnp.asarray(card.spec.config.allowed_tokens())

    def decode(lm, k):
        final, records = ar.run(lm, ar.init(lm, reads["ids"], k, config), config, capture=True)
        return ar.continuation(final, records)

    out = slot_models(card[COMPONENT], allowed, decode)(keys)
    return {"refinements": jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), out)}


def _compose(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """``ids`` ``(B, L)`` and every refiner's words -> the composed prompt ids ``(B, L)`` (the prompt as
    written on rows whose ``refine`` is false)."""
    ids, r = reads["ids"], expert_major(reads["refinements"])
    composed = compose(ids, r.tokens, r.mask, eos_id(card), ids.shape[1])
    return {"composed": jnp.where(reads["refine"][:, None], composed, ids)}


def _bind(card: Card, request: Request) -> Bound:
    cfg = card.spec.config
    who = f"each of the {cfg.num_refiners} refiners needs"
    return bind_refined(card, request, REFINE_LOOP, DENOISE_LOOP, max_words=cfg.max_prompt_words, who=who)


@functools.cache
def program() -> Program:
    """The ``multi-expert`` program (any number of refiners): refine with every expert (one ``vmap``)
    -> compose -> encode the composed prompt -> denoise -> decode.

    Request: ``prompt`` (required, at most ``config.max_prompt_words`` words), ``seed``,
    ``num_steps``, ``guidance``; ``inputs`` as for ``unified``. Artifacts: ``"image"`` ``(H, W, C)``
    in [0, 1], ``"latents"`` ``(1, h, w, C)``, ``"refined"`` (the rendered, composed prompt's ids
    ``(L,)``, ``<pad>``-padded, as the ``unified`` card's), ``"refined_text"`` (that prompt as text)
    and ``"text"`` (the prompt as given).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key", "refine"),
        nodes=(
            generator.text_nodes()[1],
            ComponentNode(
                "refine", _refine, ("ids", "key"), ("refinements",), component=COMPONENT, cached=True, loop=REFINE_LOOP
            ),
            ComponentNode(
                "compose", _compose, ("ids", "refinements", "refine"), ("composed",), component=COMPONENT, cached=True
            ),
            *render_nodes("composed", DENOISE_LOOP),
        ),
        outputs=(("image", "image"), ("latents", "latents"), ("refined", "composed")),
        bind=_bind,
        texts=(("refined_text", "refined"),),
    )
