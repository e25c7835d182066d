"""The ``wan-t2v`` card: text -> a short video on one DiT (no first frame).

Components: text encoder, a DiT over all frames jointly (bidirectional attention across frames)
and the autoencoder, which codes each frame on its own. The one loop, ``t2v_denoise``, denoises
latents ``(T, h, w, C)`` from pure noise.
"""

from __future__ import annotations

import dataclasses

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.nn import AutoencoderConfig, DiTConfig, TextEncoderConfig

MODEL_ID = "wan-t2v"
LOOP_ID = "t2v_denoise"


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``wan-t2v`` card; the defaults are CPU-test sized."""

    image_size: int = 16
    frames: int = 8
    text: TextEncoderConfig = TextEncoderConfig(vocab_size=len(VOCABULARY) + 2)
    dit: DiTConfig = DiTConfig()
    vae: AutoencoderConfig = AutoencoderConfig()
    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()
    vocabulary: tuple[str, ...] = VOCABULARY

    def __post_init__(self):
        generator.check_config(self)
        if self.dit.frame_cond:
            raise ValueError("wan-t2v generates every frame from text: its DiT takes no first frame (dit.frame_cond=False)")
        if self.frames < 1:
            raise ValueError(f"frames must be >= 1 (got {self.frames})")

    @classmethod
    def bundled(cls) -> "Config":
        """The bundled pretrained card: the ``flux-t2i`` bundled sizes (it starts from that card's weights),
        served with guidance 2 like ``flux-t2i``."""
        return generator.bundled_sizes(cls, sampling=denoise.DenoiseConfig(guidance=2.0))

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T, h, w, C)``."""
        return generator.video_latent_shape(self)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``wan-t2v`` card with freshly initialised components (deterministic in ``seed``)."""
    return generator.build(config, seed=seed, model_id=model_id, family="wan_t2v", loop_id=LOOP_ID, capability="t2v")
