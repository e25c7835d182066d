"""The ``wan-i2v`` card: text + a first frame -> a short video.

Components: text encoder, a DiT with first-frame conditioning (``frame_cond=True``) and the
autoencoder. The one loop, ``i2v_denoise``, denoises all frames jointly; the conditioning
image's latent is concatenated to every frame's tokens, with a flag on frame 0 (SVD-style).
"""

from __future__ import annotations

import dataclasses

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.nn import AutoencoderConfig, DiTConfig, TextEncoderConfig

MODEL_ID = "wan-i2v"
LOOP_ID = "i2v_denoise"


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``wan-i2v`` card; the defaults are CPU-test sized."""

    image_size: int = 16
    frames: int = 8
    text: TextEncoderConfig = TextEncoderConfig(vocab_size=len(VOCABULARY) + 2)
    dit: DiTConfig = DiTConfig(frame_cond=True)
    vae: AutoencoderConfig = AutoencoderConfig()
    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()
    vocabulary: tuple[str, ...] = VOCABULARY

    def __post_init__(self):
        generator.check_config(self)
        if not self.dit.frame_cond:
            raise ValueError("wan-i2v needs a DiT with first-frame conditioning (dit.frame_cond=True)")
        if self.frames < 2:
            raise ValueError(f"frames must be >= 2 (got {self.frames})")

    @classmethod
    def bundled(cls) -> "Config":
        """The bundled pretrained card: the flux-t2i bundled sizes (a tiny DiT moves the digit but loses its shape)."""
        return generator.bundled_sizes(cls, dit_changes={"frame_cond": True})

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T, h, w, C)``."""
        return generator.video_latent_shape(self)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """The conditioning image's shape ``(H, W, C)``."""
        return (self.image_size, self.image_size, self.vae.image_channels)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``wan-i2v`` card with freshly initialised components (deterministic in ``seed``)."""
    return generator.build(config, seed=seed, model_id=model_id, family="wan_i2v", loop_id=LOOP_ID, capability="i2v")
