"""The ``wan`` programs: UMT5 encodings of the prompt and the negative prompt (cached) -> ``t2v_denoise`` -> decode;
for an image-to-video card, also the image's CLIP tokens and first-frame condition (cached) -> ``i2v_denoise`` -> decode."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.cards.wan.card import I2V_LOOP_ID, IMAGE_LAYER, LOOP_ID
from jaxpipe.loops import denoise
from jaxpipe.nn import clip_vision
from jaxpipe.nn.wan import WanCond
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = [
    "program",
    "i2v_program",
    "program_for",
    "encode_text",
    "encode_null",
    "encode_image",
    "encode_condition",
    "start",
    "start_i2v",
    "decode",
    "tokenize",
    "resize_image",
]


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
    return Bound(
        slots=_text_slots(card, request), settings=settings(**{LOOP_ID: config}), artifacts={"text": request.prompt}
    )


def _text_slots(card: Card, request: Request) -> dict[str, np.ndarray]:
    """The slots both programs bind from the text: the prompt's and the negative prompt's ids, and the seed's key."""
    negative = request.inputs.get("negative_prompt", card.spec.config.negative_prompt)
    ids = tokenize(card, [request.prompt, negative])
    return {"ids": ids[:1], "null_ids": ids[1:], "key": generator.request_keys([request.seed])}


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
            ComponentNode(
                "encode_null", encode_null, ("null_ids",), ("uncond_context",), component="text_encoder", cached=True
            ),
            LoopNode(LOOP_ID, start, reads=("key", "context", "uncond_context"), writes=("latents",)),
            ComponentNode("decode", decode, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=_bind,
    )


# ------------------------------------------------------------------------------------------ image-to-video
def encode_image(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The image's CLIP tokens, as ``WanImageToVideoPipeline.encode_image``: the image encoder's
    penultimate hidden state (``hidden_states[-2]``, class token included).

    Args:
      card: an image-to-video ``wan`` card.
      reads: ``{"pixel_values": (B, S, S, 3)}``, the image after ``clip_vision.preprocess``.

    Returns:
      ``{"image_embeds": (B, 1 + N, image_dim)}`` (257 × 1280 for ViT-H/14).
    """
    return {"image_embeds": card["image_encoder"].hidden_state(reads["pixel_values"], IMAGE_LAYER)}


def encode_condition(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The first-frame condition, as ``WanImageToVideoPipeline.prepare_latents``: 4 mask channels (ones on
    latent frame 0, where the image is given) and the normalised VAE latents of the video
    ``[image, 0, 0, ...]`` (``frames`` frames in [-1, 1], the image first, mid-grey after).

    Args:
      card: an image-to-video ``wan`` card.
      reads: ``{"image": (B, H, W, 3)}`` in [0, 1] at the card's video size.

    Returns:
      ``{"condition": (B, f, h, w, 4 + z_dim)}``, mask channels first.
    """
    config = card.spec.config
    first = reads["image"].astype(jnp.float32)[:, None] * 2.0 - 1.0
    b, _, h, w, c = first.shape
    video = jnp.concatenate([first, jnp.zeros((b, config.frames - 1, h, w, c), jnp.float32)], axis=1)
    latents = card["vae"].encode_latents(video)
    mask = jnp.zeros((*latents.shape[:4], 4), jnp.float32).at[:, 0].set(1.0)
    return {"condition": jnp.concatenate([mask, latents], axis=-1)}


def start_i2v(
    card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: denoise.DenoiseConfig
) -> denoise.DenoiseState:
    """Starts the image-to-video loop: noise of the loop's latent shape, conditioned on the prompt, the
    image tokens and the first-frame condition; CFG's other branch swaps only the prompt for the
    negative prompt (image tokens and condition are the same, as in ``WanImageToVideoPipeline``).

    Args:
      card: an image-to-video ``wan`` card.
      loop: the ``i2v_denoise`` loop.
      reads: ``key`` ``(B,)``, ``context`` and ``uncond_context`` ``(B, L, D)``, ``image_embeds`` and ``condition``.
      config: the loop's settings.

    Returns:
      The loop's first ``DenoiseState``.
    """
    image, condition = reads["image_embeds"], reads["condition"]
    cond = WanCond(reads["context"], image, condition)
    uncond = WanCond(reads["uncond_context"], image, condition) if config.guide.needs_uncond else None
    return denoise.init(reads["key"], loop.latent_shape, cond, config, uncond)


def resize_image(image: Any, height: int, width: int) -> jax.Array:
    """An image resized to the video size, as ``WanImageToVideoPipeline`` does (``VideoProcessor``: to exactly
    ``height × width``, aspect ratio not kept, Lanczos); here antialiased Lanczos-3 in float, clipped to
    [0, 1] (PIL resamples uint8 pixels, so resized images differ from diffusers' by interpolation detail;
    an image already of the video size is unchanged).

    Args:
      image: ``(H, W, 3)`` in [0, 1].
      height: the video height.
      width: the video width.

    Returns:
      ``(height, width, 3)`` float32 in [0, 1].
    """
    image = jnp.asarray(image, jnp.float32)
    if image.shape[:2] == (height, width):
        return image
    return jnp.clip(
        jax.image.resize(image, (height, width, image.shape[-1]), method="lanczos3", antialias=True), 0.0, 1.0
    )


def _bind_i2v(card: Card, request: Request) -> Bound:
    config = card.spec.config
    if request.prompt is None:
        raise ValueError(f"{card.model_id!r} renders a text prompt: the request needs prompt=...")
    if request.image is None:
        raise ValueError(f"{card.model_id!r} animates a first frame: the request needs image=(H, W, 3) in [0, 1]")
    if request.image.ndim != 3 or request.image.shape[-1] != 3 or min(request.image.shape[:2]) < 1:
        raise ValueError(
            f"{card.model_id!r}: image must be an RGB image (H, W, 3) in [0, 1]; got shape {tuple(request.image.shape)}"
        )
    loop = generator.loop_config(card, I2V_LOOP_ID, request)
    image = jnp.asarray(request.image, jnp.float32)
    # CLIP sees the image as given (its processor resizes and crops); the VAE sees it resized to the video
    slots = {
        **_text_slots(card, request),
        "pixel_values": np.asarray(clip_vision.preprocess(image[None], config.image_processing)),
        "image": np.asarray(resize_image(image, config.height, config.width))[None],
    }
    return Bound(slots=slots, settings=settings(**{I2V_LOOP_ID: loop}), artifacts={"text": request.prompt})


@functools.cache
def i2v_program() -> Program:
    """The ``wan`` image-to-video program: encode the prompt, the negative prompt, the image's CLIP tokens and
    the first-frame condition (all cached) -> ``i2v_denoise`` -> decode.

    Request: ``prompt`` and ``image`` ``(H, W, 3)`` in [0, 1] of any size (both required), ``seed``,
    ``num_steps``, ``guidance``, ``inputs={"negative_prompt": ...}``. Artifacts: ``"video"`` ``(F, H, W, 3)``
    in [0, 1], ``"latents"`` ``(f, h, w, 16)`` and ``"text"``.
    """
    return Program(
        name="wan_i2v",
        inputs=("ids", "null_ids", "key", "pixel_values", "image"),
        nodes=(
            ComponentNode("encode_text", encode_text, ("ids",), ("context",), component="text_encoder", cached=True),
            ComponentNode(
                "encode_null", encode_null, ("null_ids",), ("uncond_context",), component="text_encoder", cached=True
            ),
            ComponentNode(
                "encode_image",
                encode_image,
                ("pixel_values",),
                ("image_embeds",),
                component="image_encoder",
                cached=True,
            ),
            ComponentNode(
                "encode_condition", encode_condition, ("image",), ("condition",), component="vae", cached=True
            ),
            LoopNode(
                I2V_LOOP_ID,
                start_i2v,
                reads=("key", "context", "uncond_context", "image_embeds", "condition"),
                writes=("latents",),
            ),
            ComponentNode("decode", decode, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=_bind_i2v,
    )


def program_for(card: Card) -> str:
    """The name of the ``wan`` program that serves ``card``: ``"i2v"`` for an image-to-video card, else ``"t2v"``.

    Args:
      card: a ``wan`` card.

    Returns:
      A key of the family's programs.
    """
    return "i2v" if card.spec.config.i2v else "t2v"
