"""The ``ltx2-two-stage`` program: encode text (cached) -> ``base_denoise`` at half resolution ->
upsample -> ``refine_denoise`` from the re-noised upsampled latents -> decode every frame."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.cards.toy_two_stage.card import BASE_LOOP, MODEL_ID, REFINE_LOOP
from jaxpipe.loops import denoise
from jaxpipe.nn import DiTCond
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = ["BASE_STREAM", "REFINE_STREAM", "REFINE_READS", "program", "upsample", "start_refine", "refine_steps"]

BASE_STREAM, REFINE_STREAM = 0, 1
"""The two loops draw their noise from ``fold_in(request key, stream)``: independent streams of one seed."""

REFINE_READS = ("key", "context", "context_mask", "uncond_context", "uncond_mask", "upsampled")
"""What ``start_refine`` reads: the key, the text conditioning and the upsampled base latents."""


def upsample(card: Card, reads: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Upsamples the base stage's latents with the card's ``upsampler``.

    Args:
      card: a two-stage card.
      reads: ``{"base_latents": (B, T, h/2, w/2, C)}``.

    Returns:
      ``{"upsampled": (B, T, h, w, C)}``.
    """
    return {"upsampled": card["upsampler"](reads["base_latents"])}


def start_refine(
    card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: denoise.DenoiseConfig
) -> denoise.DenoiseState:
    """The refine loop's start: ``σ₀·ε + (1-σ₀)·upsampled`` with ``ε`` from ``fold_in(key, REFINE_STREAM)``
    (``denoise.init_from_latents``), conditioned on the same text as the base stage.

    Args:
      card: a two-stage card.
      loop: the ``refine_denoise`` loop.
      reads: ``REFINE_READS``: ``key`` ``(B,)``, the text conditioning and ``upsampled`` ``(B, T, h, w, C)``.
      config: the refine loop's settings (its ``start_sigma`` is σ₀).

    Returns:
      The loop's first ``DenoiseState``.

    Raises:
      ValueError: if the upsampled latents are not the loop's latent shape.
    """
    up = reads["upsampled"]
    if tuple(up.shape[1:]) != loop.latent_shape:
        raise ValueError(f"the upsampled latents are {tuple(up.shape[1:])} but {loop.id!r} runs at {loop.latent_shape}")
    keys = jax.vmap(lambda k: jax.random.fold_in(k, REFINE_STREAM))(reads["key"])
    cond = DiTCond(reads["context"], reads["context_mask"])
    uncond = DiTCond(reads["uncond_context"], reads["uncond_mask"]) if config.guide.needs_uncond else None
    return denoise.init_from_latents(keys, up, cond, config, uncond)


def refine_steps(request: Request) -> int | None:
    """The refine stage's step count a request asks for.

    Args:
      request: the request (``inputs["refine_steps"]``, optional).

    Returns:
      The step count, or ``None`` (the card's default).

    Raises:
      ValueError: if ``refine_steps`` is not a positive int.
    """
    steps = request.inputs.get("refine_steps")
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps <= 0:
        raise ValueError(f"inputs['refine_steps'] (the refine stage's steps) must be a positive int (got {steps!r})")
    return int(steps)


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(
            f"{card.model_id!r} renders text to a video and takes no image (got image={request.image.shape})"
        )
    text = generator.bind_text(card, request, BASE_LOOP)  # the base stage takes num_steps and guidance as they are
    refine = generator.loop_config(card, REFINE_LOOP, request.replace(num_steps=refine_steps(request)))
    return Bound(
        slots=text.slots, settings=settings(**dict(text.settings), **{REFINE_LOOP: refine}), artifacts=text.artifacts
    )


@functools.cache
def program() -> Program:
    """The ``ltx2-two-stage`` program.

    Request: ``prompt`` (required), ``seed``, ``num_steps`` (the base stage's steps),
    ``inputs={"refine_steps": n}`` (the refine stage's), ``guidance`` (the CFG scale of both stages;
    STG stays as the card sets it). Artifacts: ``"video"`` ``(T, H, W, C)`` in [0, 1], ``"latents"``
    ``(T, h, w, C)``, ``"base_latents"`` ``(T, h/2, w/2, C)``, ``"upsampled"`` ``(T, h, w, C)`` and
    ``"text"`` (the prompt).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "key"),
        nodes=(
            *generator.text_nodes(),
            LoopNode(
                BASE_LOOP, generator.start_denoise(BASE_STREAM), reads=generator.DENOISE_READS, writes=("base_latents",)
            ),
            ComponentNode("upsample", upsample, reads=("base_latents",), writes=("upsampled",), component="upsampler"),
            LoopNode(REFINE_LOOP, start_refine, reads=REFINE_READS, writes=("latents",)),
            ComponentNode("decode", generator.decode_video, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(
            ("video", "video"),
            ("latents", "latents"),
            ("base_latents", "base_latents"),
            ("upsampled", "upsampled"),
        ),
        bind=_bind,
    )
