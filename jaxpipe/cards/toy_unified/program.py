"""The ``unified`` program: refine the prompt (``ar_decode``) -> encode the refined prompt -> denoise -> decode.

Keys: the request's ``key``; the LM draws with ``fold_in(key, 0)`` and the denoiser with
``fold_in(key, 1)``, so the two loops never share randomness. RL rollouts run this program with
capture (``jaxpipe.training.rollout``), so they draw exactly what serving draws.

The refined prompt is only known after the ``refine`` loop, so its text encoding runs inside the
program after that loop; the engine's feature cache resolves only the empty prompt
(``encode_null``) up front. A row whose ``refine`` input is false renders its prompt as written
(the LM still runs; its words are dropped): how a group rollout keeps some original prompts and
how evaluation serves "original" next to "refined" with the same noise.
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
from jaxpipe.cards import generator, mot
from jaxpipe.cards.toy_unified.card import DENOISE_LOOP, MODEL_ID, REFINE_LOOP, eos_id, refined_ids
from jaxpipe.loops import ar
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["program", "bind_refined", "render_nodes"]


def _start_refine(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: ar.ARConfig) -> ar.ARState:
    """Start the LM on the prompt ``ids`` ``(B, L)`` with keys ``fold_in(key, 0)``."""
    keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(reads["key"])
    (llm,) = card.bound(loop.id)
    return ar.init(llm, reads["ids"], keys, config)


def _lm_tokens(state: ar.ARState) -> jax.Array:
    return state.tokens


def _refined(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The LM buffer ``(B, T)`` -> the refined prompt ids ``(B, L)`` (``<eos>`` -> ``<pad>``), or the
    prompt ``ids`` as written on rows whose ``refine`` is false."""
    ids = reads["ids"]
    refined = refined_ids(reads["lm_tokens"], eos_id(card), ids.shape[1])
    return {"refined": jnp.where(reads["refine"][:, None], refined, ids)}


def _encode(slot: str, card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    return generator.encode_text(card, {"ids": reads[slot]})


def render_nodes(slot: str, denoise_loop: str) -> tuple[ComponentNode, LoopNode, ComponentNode]:
    """The nodes that render a refined prompt: encode the ids in ``slot`` (cached; node ``encode_<slot>``),
    denoise (the loop ``denoise_loop``, stream 1) and decode the image.

    Args:
      slot: the slot holding the refined prompt's ids ``(B, L)``.
      denoise_loop: the denoise loop's id.

    Returns:
      ``(encode node, denoise node, decode node)``: they write ``context`` / ``context_mask``, ``latents``, ``image``.
    """
    return (
        ComponentNode(
            f"encode_{slot}",
            functools.partial(_encode, slot),
            (slot,),
            ("context", "context_mask"),
            component="text_encoder",
            cached=True,
        ),
        LoopNode(denoise_loop, generator.start_denoise(stream=1), reads=generator.DENOISE_READS, writes=("latents",)),
        ComponentNode("decode", generator.decode_image, reads=("latents",), writes=("image",), component="vae"),
    )


def bind_refined(
    card: Card, request: Request, refine_loop: str, denoise_loop: str, *, max_words: int, who: str
) -> Bound:
    """Bind a prompt that refiner(s) continue: the text slots, ``refine`` ``(1,)`` bool (the request's
    ``inputs["refine"]``, default true) and both loops' settings (``inputs["temperature"]``
    overrides the refiners'). Prompts are 1 to ``max_words`` words (``who`` need room for theirs).

    Args:
      card: a refiner card.
      request: the request (a prompt, no image).
      refine_loop: the refiners' loop id.
      denoise_loop: the denoise loop's id.
      max_words: the most words a prompt may have.
      who: who needs the room (said in the error).

    Returns:
      The ``Bound``.

    Raises:
      ValueError: on an image, a missing or empty prompt, more than ``max_words`` words or a word outside
        the vocabulary.
    """
    if request.image is not None:
        raise ValueError(
            f"{card.model_id!r} renders text to an image and takes no image (got image={request.image.shape})"
        )
    bound = generator.bind_text(card, request, denoise_loop)
    words = int(np.count_nonzero(bound.slots["ids"]))
    if words == 0:
        raise ValueError(f"{card.model_id!r}: the prompt needs at least one word (e.g. 'seven')")
    if words > max_words:
        raise ValueError(
            f"{card.model_id!r}: prompt {request.prompt!r} has {words} words; {who} room to add words, "
            f"so prompts may have at most max_prompt_words = {max_words}"
        )
    refine = mot.settings_with_temperature(card, refine_loop, request)
    flag = np.asarray([bool(request.inputs.get("refine", True))])
    loops = {**dict(bound.settings), refine_loop: refine}
    return dataclasses.replace(bound, slots={**bound.slots, "refine": flag}, settings=settings(**loops))


def _bind(card: Card, request: Request) -> Bound:
    limit = card.spec.config.max_prompt_words
    return bind_refined(card, request, REFINE_LOOP, DENOISE_LOOP, max_words=limit, who="the refiner needs")


@functools.cache
def program() -> Program:
    """The ``unified`` program: refine (ar) -> encode refined prompt -> denoise -> decode.

    Request: ``prompt`` (required, at most ``config.max_prompt_words`` words), ``seed``,
    ``num_steps``, ``guidance``; ``inputs={"temperature": t}`` overrides the refiner's (0 =
    greedy), ``inputs={"refine": False}`` renders the prompt as written. Artifacts: ``"image"``
    ``(H, W, C)`` in [0, 1], ``"latents"`` ``(1, h, w, C)``, ``"refined"`` (the rendered prompt's ids
    ``(L,)``, ``<pad>``-padded), ``"refined_text"`` (that prompt as text) and ``"text"`` (the prompt
    as given).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key", "refine"),
        nodes=(
            generator.text_nodes()[1],
            LoopNode(REFINE_LOOP, _start_refine, reads=("ids", "key"), writes=("lm_tokens",), result=_lm_tokens),
            ComponentNode("refined", _refined, reads=("ids", "lm_tokens", "refine"), writes=("refined",)),
            *render_nodes("refined", DENOISE_LOOP),
        ),
        outputs=(("image", "image"), ("latents", "latents"), ("refined", "refined")),
        bind=_bind,
        texts=(("refined_text", "refined"),),
    )
