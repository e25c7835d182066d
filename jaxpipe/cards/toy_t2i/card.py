"""The ``toy_t2i`` family: a small text encoder + DiT + autoencoder card, text -> image (the digits
world's ``flux-t2i`` is one).

One loop, ``t2i_denoise``, drives the DiT on latents ``(1, h, w, C)``; the program
(``program.py``) encodes the prompt, runs the loop and decodes.
"""

from __future__ import annotations

import dataclasses

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.loops import denoise

__all__ = ["MODEL_ID", "LOOP_ID", "Config", "build"]

MODEL_ID = "toy-t2i"
LOOP_ID = "t2i_denoise"


@dataclasses.dataclass(frozen=True)
class Config(generator.TextGeneratorConfig):
    """Everything that shapes a text-to-image card (``vocabulary`` required); the defaults are CPU-test sized.

    Attributes:
      sampling: the ``t2i_denoise`` loop's settings; the other fields are ``TextGeneratorConfig``'s.
    """

    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T=1, h, w, C)``."""
        side = self.image_size // self.vae.downsample
        return (1, side, side, self.vae.latent_channels)


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A text-to-image card with freshly initialised components (deterministic in ``seed``).

    Args:
      config: the ``toy_t2i`` family's ``Config`` (sizes, vocabulary, sampling defaults).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``toy_t2i`` ``Card``.
    """
    return generator.build(config, seed=seed, model_id=model_id, family="toy_t2i", loop_id=LOOP_ID, capability="t2i")
