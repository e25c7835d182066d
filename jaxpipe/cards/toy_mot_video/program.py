"""The ``cosmos3`` program: tokenize -> reason -> re-encode the reasoned caption -> denoise a video -> decode.

The prompt is prefilled once (cached); ``reason`` (keys ``fold_in(key, 0)``) continues it; the
reasoned caption (prompt + reasoned words, ``<eos>`` dropped) is prefilled by the same module and
its text K/V alone condition ``generate_video`` (keys ``fold_in(key, 1)``).
``inputs={"reason": False}`` renders the prompt as written.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import generator, mot
from jaxpipe.cards.toy_mot_video.card import MODEL_ID, REASON_LOOP, VIDEO_LOOP
from jaxpipe.cards.toy_unified.card import refined_ids
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["reason_t2v"]


def _reasoned(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """The reasoned caption ``(B, T)`` (words only) and its text K/V as the video's conditioning."""
    state, ids = reads["reasoning"], reads["ids"]
    width = state.tokens.shape[1]
    words = refined_ids(state.tokens, mot.eos_id(card), width)
    prompt = jnp.pad(ids, ((0, 0), (0, width - ids.shape[1])))
    reasoned = jnp.where(reads["reason"][:, None], words, prompt)
    model = card["transformer"]
    length = jnp.maximum(mot.lengths(reasoned), 1)
    _, cache = model.prefill(reasoned, length, model.init_cache(reasoned.shape[0]))
    return {"reasoned": reasoned, "cond": model.text_cond(cache, mot.lengths(reasoned))}


def _bind(card: Card, request: Request) -> Bound:
    config = card.spec.config
    ids = mot.prompt_ids(
        card, request, max_words=config.max_prompt_words, who=f"reasoning needs {config.reason.max_new_tokens}"
    )
    slots = {
        "ids": ids,
        "key": mot.request_key(request),
        "reason": np.asarray([bool(request.inputs.get("reason", True))]),
    }
    loops = settings(
        **{
            REASON_LOOP: mot.settings_with_temperature(card, REASON_LOOP, request),
            VIDEO_LOOP: generator.loop_config(card, VIDEO_LOOP, request),
        }
    )
    return Bound(slots=slots, settings=loops, artifacts={"text": request.prompt})


@functools.cache
def reason_t2v() -> Program:
    """Prefill (cached) -> reason (``ar_decode``) -> re-encode the reasoned caption -> denoise -> decode.

    Request: ``prompt`` (1 to ``config.max_prompt_words`` words), ``seed``, ``num_steps``,
    ``guidance``; ``inputs={"reason": False}`` skips reasoning, ``{"temperature": t}`` sets its
    temperature. Artifacts: ``"video"`` ``(T, H, W, C)`` in [0, 1], ``"latents"``, ``"reasoned"``
    (the caption rendered, ids) and ``"reasoned_text"``.
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "key", "reason"),
        nodes=(
            *mot.prompt_then_decode(REASON_LOOP, "reasoning"),
            ComponentNode(
                "encode_reasoned",
                _reasoned,
                reads=("ids", "reasoning", "reason"),
                writes=("reasoned", "cond"),
                component="transformer",
            ),
            LoopNode(VIDEO_LOOP, mot.start_denoise, reads=("key", "cond"), writes=("latents",)),
            ComponentNode("decode", generator.decode_video, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents"), ("reasoned", "reasoned")),
        bind=_bind,
        texts=(("reasoned_text", "reasoned"),),
    )
