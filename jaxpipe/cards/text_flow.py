"""The ``FlowData`` hooks ``Finetune`` trains every text-conditioned generator family with
(``jaxpipe.cards.generator`` re-exports them): a batch's clean latents and the DiT's conditioning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe.nn import DiTCond

__all__ = ["TextFlow", "TEXT_FLOW"]


@dataclasses.dataclass(frozen=True)
class TextFlow:
    """``FlowData`` of a generator family.

    A batch is ``{"ids": (B, L), "image": (B, H, W, C)}`` or ``{"ids", "video": (B, T, H, W, C)}`` in
    [-1, 1], or ``{"ids", "latents": (B, T, h, w, C)}`` already encoded; a DiT with first-frame input
    conditions on the clean first frame.

    Attributes:
      denoiser: the name of the denoiser component.
    """

    denoiser: str = "transformer"

    def latents(self, components: Mapping[str, Any], batch: Mapping[str, Any]) -> jax.Array:
        """The batch's clean latents: given, or encoded by ``components["vae"]``.

        Args:
          components: component name -> module.
          batch: ``{"ids", "latents" | "video" | "image"}`` (first found in that order).

        Returns:
          ``x0``, ``(B, T, h, w, C)`` (``T`` = 1 for images).

        Raises:
          KeyError: if the batch has none of ``latents``, ``video``, ``image``.
        """
        vae = components["vae"]
        if "latents" in batch:
            return batch["latents"]
        if "video" in batch:
            return vae.encode_video(batch["video"])
        if "image" in batch:
            return vae.encode(batch["image"])[:, None]
        raise KeyError(f"a batch needs 'latents', 'video' or 'image' (got {sorted(batch)})")

    def cond(self, components: Mapping[str, Any], batch: Mapping[str, Any], keep: jax.Array, x0: jax.Array) -> DiTCond:
        """The DiT's conditioning: the encoded ``ids`` (the empty prompt on dropped rows) and the first frame.

        Args:
          components: component name -> module (``text_encoder`` and the denoiser).
          batch: ``{"ids": (B, L) int, ...}``.
          keep: ``(B,)`` bool; false rows get the empty prompt (caption dropout).
          x0: the clean latents ``(B, T, h, w, C)``; frame 0 conditions a DiT with ``frame_cond``.

        Returns:
          A ``DiTCond``.
        """
        ids = jnp.where(keep[:, None], batch["ids"], 0)
        first_frame = x0[:, 0] if components[self.denoiser].cfg.frame_cond else None
        return DiTCond(components["text_encoder"](ids), ids != 0, first_frame)


TEXT_FLOW = TextFlow()
