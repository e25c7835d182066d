"""The ``wan-causal`` card: text -> a video generated chunk by chunk (causal, streamable, extendable).

Components: the text encoder, a block-causal DiT (``jaxpipe.nn.CausalDiT``: ``DiT``'s parameters,
so it starts from ``wan-t2v``'s) and the frame-wise autoencoder. The one loop, ``causal_rollout``
(kind ``chunk_rollout``), denoises ``frames / chunk_frames`` chunks in turn, each conditioned on
the cached K/V of the finished ones.
"""

from __future__ import annotations

import dataclasses

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.loops.chunk import ChunkConfig

__all__ = ["MODEL_ID", "LOOP_ID", "Config", "build"]

MODEL_ID = "toy-causal"
LOOP_ID = "causal_rollout"


@dataclasses.dataclass(frozen=True)
class Config(generator.VideoGeneratorConfig):
    """Everything that shapes a chunked causal video card (``vocabulary`` required); the defaults are CPU-test sized.

    ``frames`` is the default video length, generated as ``sampling.chunks`` chunks of
    ``sampling.chunk_frames`` frames (so ``chunks · chunk_frames == frames``).

    Attributes:
      sampling: the ``causal_rollout`` loop's settings (chunk size, chunk count, steps per chunk,
        guidance); the other fields are ``VideoGeneratorConfig``'s.

    Raises:
      ValueError: if ``chunk_frames`` does not divide ``frames`` or ``chunks · chunk_frames != frames``.
    """

    sampling: ChunkConfig = ChunkConfig()

    def __post_init__(self):
        super().__post_init__()
        f = self.sampling.chunk_frames
        validate.rule(
            self.frames % f == 0,
            f"sampling.chunk_frames={f} does not divide frames={self.frames}: a video is whole chunks",
        )
        validate.rule(
            self.sampling.chunks * f == self.frames,
            f"sampling.chunks ({self.sampling.chunks}) · chunk_frames ({f}) must equal frames ({self.frames}); "
            f"use chunks={self.frames // f}",
        )


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``wan-causal`` card with freshly initialised components.

    Deterministic in ``seed``, with the same initial weights as ``wan-t2v`` for a seed.

    Args:
      config: the card's config.
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``Card`` (``text_encoder``, a ``CausalDiT`` ``transformer``, ``vae``; one ``chunk_rollout`` loop).
    """
    from jaxpipe.nn.causal_dit import CausalDiT

    return generator.build(
        config,
        seed=seed,
        model_id=model_id,
        family="toy_causal",
        loop_id=LOOP_ID,
        capability="t2v",
        denoiser=CausalDiT,
        kind="chunk_rollout",
        parity=("C0", "C1", "C3"),
    )
