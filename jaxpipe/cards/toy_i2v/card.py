"""The ``toy_i2v`` family: text + a first frame -> a short video (the digits world's ``wan-i2v``).

Components: text encoder, a DiT with first-frame conditioning (``frame_cond=True``) and the
autoencoder. The one loop, ``i2v_denoise``, denoises all frames jointly; the conditioning
image's latent is concatenated to every frame's tokens, with a flag on frame 0 (SVD-style).
"""

from __future__ import annotations

import dataclasses

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.loops import denoise
from jaxpipe.nn import DiTConfig

__all__ = ["MODEL_ID", "LOOP_ID", "Config", "build"]

MODEL_ID = "toy-i2v"
LOOP_ID = "i2v_denoise"


@dataclasses.dataclass(frozen=True)
class Config(generator.VideoGeneratorConfig):
    """Everything that shapes an image-to-video card (``vocabulary`` required); the defaults are CPU-test sized.

    Attributes:
      dit: the denoiser, with first-frame conditioning (``frame_cond=True``, required).
      sampling: the ``i2v_denoise`` loop's settings.
      MIN_FRAMES: 2 (the first frame and at least one more).
      FRAME_COND: ``True``.
    """

    dit: DiTConfig = DiTConfig(frame_cond=True)
    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()

    MIN_FRAMES = 2
    FRAME_COND = True

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """The conditioning image's shape ``(H, W, C)``."""
        return (self.image_size, self.image_size, self.vae.image_channels)


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """An image-to-video card with freshly initialised components (deterministic in ``seed``).

    Args:
      config: the ``toy_i2v`` family's ``Config`` (sizes, vocabulary, sampling defaults).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``toy_i2v`` ``Card``.
    """
    return generator.build(config, seed=seed, model_id=model_id, family="toy_i2v", loop_id=LOOP_ID, capability="i2v")
