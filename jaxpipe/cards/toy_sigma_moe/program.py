"""The ``wan22-moe`` program: encode text (cached) -> ``t2v_denoise`` (two σ-routed experts) -> decode every frame."""

from __future__ import annotations

import functools

from jaxpipe.cards import generator
from jaxpipe.cards.toy_sigma_moe.card import LOOP_ID, MODEL_ID
from jaxpipe.program import Program

__all__ = ["program"]


@functools.cache
def program() -> Program:
    """The ``wan22-moe`` program (``generator.text_to_video_program``): encode text (cached) ->
    ``t2v_denoise`` -> decode every frame. Request: ``prompt``, ``seed``, ``num_steps``, ``guidance``; artifacts
    ``"video"`` ``(T, H, W, C)`` in [0, 1], ``"latents"`` ``(T, h, w, C)``, ``"text"``."""
    return generator.text_to_video_program(MODEL_ID, LOOP_ID)
