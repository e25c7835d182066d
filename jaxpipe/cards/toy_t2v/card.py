"""The ``toy_t2v`` family: text -> a short video on one DiT, no first frame (the digits world's ``wan-t2v``).

Components: text encoder, a DiT over all frames jointly (bidirectional attention across frames)
and the autoencoder, which codes each frame on its own. The one loop, ``t2v_denoise``, denoises
latents ``(T, h, w, C)`` from pure noise.
"""

from __future__ import annotations

import dataclasses

from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.loops import denoise

__all__ = ["MODEL_ID", "LOOP_ID", "Config", "build"]

MODEL_ID = "toy-t2v"
LOOP_ID = "t2v_denoise"


@dataclasses.dataclass(frozen=True)
class Config(generator.VideoGeneratorConfig):
    """Everything that shapes a text-to-video card (``vocabulary`` required); the defaults are CPU-test sized.

    Attributes:
      sampling: the ``t2v_denoise`` loop's settings; the other fields are ``VideoGeneratorConfig``'s.
    """

    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A text-to-video card with freshly initialised components (deterministic in ``seed``).

    Args:
      config: the ``toy_t2v`` family's ``Config`` (sizes, vocabulary, sampling defaults).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``toy_t2v`` ``Card``.
    """
    return generator.build(config, seed=seed, model_id=model_id, family="toy_t2v", loop_id=LOOP_ID, capability="t2v")
