"""The ``wan-causal`` program: encode text (cached) and an optional prefix video -> ``causal_rollout``
-> decode every frame."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.cards.toy_causal.card import LOOP_ID, MODEL_ID
from jaxpipe.loops import chunk
from jaxpipe.nn import DiTCond
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["READS", "program", "encode_prefix", "start", "video_latents"]

READS = (*generator.DENOISE_READS, "prefix")
"""What the rollout's ``start`` reads: the text conditioning, the key and the ``prefix`` latents."""


def encode_prefix(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """Encodes the video to continue into latents.

    Args:
      card: a ``wan-causal`` card.
      reads: ``{"prefix_video": (B, P, H, W, C)}`` in [0, 1] (``P`` may be 0: no prefix).

    Returns:
      ``{"prefix": (B, P, h, w, C)}`` latents (float32 zeros of that shape when ``P`` is 0).
    """
    video = reads["prefix_video"]
    if video.shape[1] == 0:  # no prefix: nothing to encode (static shape)
        cfg = card.spec.config
        side = cfg.image_size // cfg.vae.downsample
        return {"prefix": jnp.zeros(video.shape[:2] + (side, side, cfg.vae.latent_channels), jnp.float32)}
    return {"prefix": card["vae"].encode_video(video * 2.0 - 1.0)}


def start(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: chunk.ChunkConfig) -> chunk.ChunkState:
    """The rollout's start: text conditioning, the prefix prefilled into the cache, chunk 0's noise.

    Args:
      card: a ``wan-causal`` card.
      loop: the ``causal_rollout`` loop.
      reads: ``READS``: ``key`` ``(B,)``, the text conditioning (the unconditional half is used only
        when guiding) and ``prefix`` ``(B, P, h, w, C)``.
      config: the loop's ``ChunkConfig``.

    Returns:
      The loop's first ``ChunkState``.
    """
    cond = DiTCond(reads["context"], reads["context_mask"])
    uncond = DiTCond(reads["uncond_context"], reads["uncond_mask"]) if config.guide.needs_uncond else None
    return chunk.init(
        card[loop.binds[0]], reads["key"], loop.latent_shape, cond, config, uncond, prefix=reads["prefix"]
    )


def video_latents(state: chunk.ChunkState):
    """The loop's result: the whole video's latents (prefix, then the generated chunks).

    Args:
      state: the loop's final ``ChunkState``.

    Returns:
      ``(B, P + chunks·F, h, w, C)`` latents.
    """
    return state.video


def _prefix(card: Card, value) -> np.ndarray:
    cfg = card.spec.config
    video = np.asarray(value, np.float32)
    shape = (cfg.image_size, cfg.image_size, cfg.vae.image_channels)
    f = cfg.sampling.chunk_frames
    if video.ndim != 4 or video.shape[1:] != shape or video.shape[0] % f or not video.shape[0]:
        raise ValueError(
            f"{card.model_id!r}: inputs['video'] (the video to continue) must be (P, {', '.join(map(str, shape))}) frames "
            f"in [0, 1] with P a positive multiple of chunk_frames={f} (got {video.shape})"
        )
    if not np.all(np.isfinite(video)) or video.min() < 0 or video.max() > 1:
        raise ValueError(f"{card.model_id!r}: inputs['video'] must be finite values in [0, 1]")
    return video


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(
            f"{card.model_id!r} renders text to a video and takes no image (got image={request.image.shape}); "
            "to continue a video pass inputs={'video': frames}"
        )
    unknown = sorted(set(request.inputs) - {"video", "chunks"})
    if unknown:
        raise ValueError(f"{card.model_id!r} reads inputs 'video' (frames to continue) and 'chunks'; got {unknown}")
    bound = generator.bind_text(card, request, LOOP_ID)
    config = dict(bound.settings)[LOOP_ID]
    if "chunks" in request.inputs:
        n = request.inputs["chunks"]
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(
                f"{card.model_id!r}: inputs['chunks'] (chunks to generate) must be a positive int (got {n!r})"
            )
        config = dataclasses.replace(config, chunks=int(n))
    cfg = card.spec.config
    if "video" in request.inputs:
        prefix = _prefix(card, request.inputs["video"])[None]
    else:
        prefix = np.zeros((1, 0, cfg.image_size, cfg.image_size, cfg.vae.image_channels), np.float32)
    slots = {**bound.slots, "prefix_video": prefix}
    return Bound(slots=slots, settings=settings(**{LOOP_ID: config}), artifacts=bound.artifacts)


@functools.cache
def program() -> Program:
    """The ``wan-causal`` program: encode text (cached) and the prefix -> ``causal_rollout`` -> decode.

    Request: ``prompt`` (required), ``seed``, ``num_steps`` (per chunk), ``guidance``, and
    ``inputs``: ``"video"`` ``(P, H, W, C)`` in [0, 1], frames to continue (``P`` a multiple of
    ``chunk_frames``), ``"chunks"``: chunks to generate (default the card's). Artifacts:
    ``"video"`` ``(P + chunks·F, H, W, C)`` in [0, 1] (the prefix re-decoded, then the new
    frames), ``"latents"`` ``(P + chunks·F, h, w, C)`` and ``"text"``.
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key", "prefix_video"),
        nodes=(
            *generator.text_nodes(),
            ComponentNode("encode_prefix", encode_prefix, reads=("prefix_video",), writes=("prefix",), component="vae"),
            LoopNode(LOOP_ID, start, reads=READS, writes=("latents",), result=video_latents),
            ComponentNode("decode", generator.decode_video, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=_bind,
    )
