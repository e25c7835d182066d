"""The ``bagel-mot`` programs: tokenize -> think -> denoise -> decode, and image -> caption.

``think_t2i`` (the default): the prompt is prefilled once (a cached node: the prompt's text K/V,
versioned with the ``transformer``), the MoT thinks (``generate_text``, keys ``fold_in(key, 0)``),
and the image loop (``generate_image``, keys ``fold_in(key, 1)``) denoises latent tokens that
attend to the prompt + thought K/V the AR loop left in its cache. ``inputs={"think": False}``
renders from the prompt's own K/V (the AR loop still runs; its tokens are not attended to).

``understand``: the image is encoded by the ``vae``, its latent tokens written into the MoT's
cache (a cached node), and the caption decoded after a ``<bos>``, optionally continuing a given
partial caption (the request's prompt).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator, mot
from jaxpipe.cards.toy_mot.card import IMAGE_LOOP, MODEL_ID, THINK_LOOP, UNDERSTAND_LOOP, eos_id
from jaxpipe.cards.toy_unified.card import refined_ids
from jaxpipe.loops import ar
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["think_t2i", "understand"]


def _condition(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """The image loop's conditioning: the thought's text K/V (prompt + thoughts) on thinking rows, the
    prompt's own K/V elsewhere; the text it renders as words (``<eos>`` dropped)."""
    model, thinking, think = card["transformer"], reads["thinking"], reads["think"]
    prompt = model.text_cond(reads["prompt_cache"], mot.lengths(reads["ids"]))
    thought = model.text_cond(thinking.cache, thinking.length)
    pick = lambda a, b: jnp.where(think.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
    cond = jax.tree.map(pick, thought, prompt)
    width = thinking.tokens.shape[1]
    words = refined_ids(thinking.tokens, eos_id(card), width)
    prompt_words = jnp.pad(reads["ids"], ((0, 0), (0, width - reads["ids"].shape[1])))
    return {"cond": cond, "thought": jnp.where(think[:, None], words, prompt_words)}


def _bind_think(card: Card, request: Request) -> Bound:
    config = card.spec.config
    ids = mot.prompt_ids(
        card,
        request,
        max_words=config.max_prompt_words,
        who=f"thinking needs {config.think.max_new_tokens} (captioning is the 'understand' program)",
    )
    think = np.asarray([bool(request.inputs.get("think", True))])
    slots = {"ids": ids, "key": mot.request_key(request), "think": think}
    loops = settings(
        **{
            THINK_LOOP: mot.settings_with_temperature(card, THINK_LOOP, request),
            IMAGE_LOOP: generator.loop_config(card, IMAGE_LOOP, request),
        }
    )
    return Bound(slots=slots, settings=loops, artifacts={"text": request.prompt})


@functools.cache
def think_t2i() -> Program:
    """Prefill (cached) -> think (``ar_decode``) -> condition -> denoise -> decode.

    Request: ``prompt`` (1 to ``config.max_prompt_words`` words), ``seed``, ``num_steps``,
    ``guidance``; ``inputs={"think": False}`` skips the thought, ``{"temperature": t}`` sets the
    thinking temperature. Artifacts: ``"image"`` ``(H, W, C)`` in [0, 1], ``"latents"``,
    ``"thought"`` (the prompt + thought words' ids, ``<pad>`` after) and ``"thought_text"``.
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "key", "think"),
        nodes=(
            *mot.prompt_then_decode(THINK_LOOP, "thinking"),
            ComponentNode(
                "condition", _condition, reads=("ids", "prompt_cache", "thinking", "think"), writes=("cond", "thought")
            ),
            LoopNode(IMAGE_LOOP, mot.start_denoise, reads=("key", "cond"), writes=("latents",)),
            ComponentNode("decode", generator.decode_image, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents"), ("thought", "thought")),
        bind=_bind_think,
        texts=(("thought_text", "thought"),),
    )


# ------------------------------------------------------------------------------------------ image -> caption
def _encode_image(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """The image ``(B, H, W, C)`` in [0, 1] -> its clean latents ``(B, 1, h, w, C)``."""
    return {"image_latents": card["vae"].encode(reads["image"] * 2.0 - 1.0)[:, None]}


def _see(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """Clean image latents -> their tokens' K/V in a fresh MoT cache (what the caption attends to)."""
    model, latents = card["transformer"], reads["image_latents"]
    return {"image_cache": model.prefill_image(latents, model.init_cache(latents.shape[0]))}


def _start_caption(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: ar.ARConfig) -> ar.ARState:
    (model,) = card.bound(loop.id)
    return ar.init(model, reads["ids"], reads["key"], config, cache=reads["image_cache"])


def _caption(state: ar.ARState) -> jax.Array:
    return state.tokens


def _caption_words(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    tokens = reads["tokens"]
    return {"caption": refined_ids(tokens, eos_id(card), tokens.shape[1])}


def _bind_understand(card: Card, request: Request) -> Bound:
    config = card.spec.config
    expected = (config.image_size, config.image_size, config.vae.image_channels)
    if request.image is None:
        raise ValueError(
            f"{card.model_id!r} understanding reads an image: the request needs image=... of shape {expected}"
        )
    image = np.asarray(request.image, np.float32)
    if image.shape != expected:
        raise ValueError(
            f"{card.model_id!r} understanding reads an image of shape {expected} in [0, 1]; got {image.shape}"
        )
    loop = card.spec.loop(UNDERSTAND_LOOP).config
    words = (request.prompt or "").split()
    room = config.mot.max_text - loop.max_new_tokens - 1
    if len(words) > room:
        raise ValueError(f"{card.model_id!r}: a caption prefix may have at most {room} words (got {request.prompt!r})")
    ids = np.zeros((1, 1 + room), np.int32)
    ids[0, 0] = eos_id(card)  # <bos>
    if words:
        ids[0, 1 : 1 + len(words)] = card.spec.tokenizer.encode([" ".join(words)], len(words))[0]
    if request.inputs.get("temperature") is not None:
        loop = loop.replace(temperature=request.inputs["temperature"])
    slots = {"image": image[None], "ids": ids, "key": mot.request_key(request)}
    return Bound(slots=slots, settings=settings(**{UNDERSTAND_LOOP: loop}), artifacts={"text": request.prompt or ""})


@functools.cache
def understand() -> Program:
    """Encode the image (cached) -> its K/V in the MoT cache (cached) -> decode the caption (``ar_decode``).

    Request: ``image`` ``(H, W, C)`` in [0, 1]; ``prompt``: optional words the caption starts with;
    ``inputs={"temperature": t}`` (default greedy). Artifacts: ``"caption"`` (word ids ``(T,)``,
    ``<pad>`` after) and ``"caption_text"``.
    """
    return Program(
        name=f"{MODEL_ID}:understand",
        inputs=("image", "ids", "key"),
        nodes=(
            ComponentNode("encode_image", _encode_image, ("image",), ("image_latents",), component="vae", cached=True),
            ComponentNode("see", _see, ("image_latents",), ("image_cache",), component="transformer", cached=True),
            LoopNode(
                UNDERSTAND_LOOP,
                _start_caption,
                reads=("ids", "key", "image_cache"),
                writes=("tokens",),
                result=_caption,
            ),
            ComponentNode("words", _caption_words, reads=("tokens",), writes=("caption",)),
        ),
        outputs=(("caption", "caption"),),
        bind=_bind_understand,
        texts=(("caption_text", "caption"),),
    )
