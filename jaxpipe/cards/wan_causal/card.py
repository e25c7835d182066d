"""The ``wan-causal`` card: text -> a video generated chunk by chunk (causal, streamable, extendable).

Components: the text encoder, a block-causal DiT (``jaxpipe.nn.CausalDiT``: ``DiT``'s parameters,
so it starts from ``wan-t2v``'s) and the frame-wise autoencoder. The one loop, ``causal_rollout``
(kind ``chunk_rollout``), denoises ``frames / chunk_frames`` chunks in turn, each conditioned on
the cached K/V of the finished ones.
"""

from __future__ import annotations

import dataclasses


from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.data import VOCABULARY
from jaxpipe.loops.chunk import ChunkConfig
from jaxpipe.nn import AutoencoderConfig, DiTConfig, TextEncoderConfig

MODEL_ID = "wan-causal"
LOOP_ID = "causal_rollout"


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``wan-causal`` card; the defaults are CPU-test sized.

    ``frames`` is the default video length, generated as ``sampling.chunks`` chunks of
    ``sampling.chunk_frames`` frames (so ``chunks · chunk_frames == frames``).
    """

    image_size: int = 16
    frames: int = 8
    text: TextEncoderConfig = TextEncoderConfig(vocab_size=len(VOCABULARY) + 2)
    dit: DiTConfig = DiTConfig()
    vae: AutoencoderConfig = AutoencoderConfig()
    sampling: ChunkConfig = ChunkConfig()
    vocabulary: tuple[str, ...] = VOCABULARY

    def __post_init__(self):
        generator.check_config(self)
        if self.dit.frame_cond:
            raise ValueError("wan-causal conditions on earlier chunks, not on a first frame (dit.frame_cond=False)")
        if isinstance(self.frames, bool) or not isinstance(self.frames, int) or self.frames < 1:
            raise ValueError(f"frames must be a positive int (got {self.frames!r})")
        f = self.sampling.chunk_frames
        if self.frames % f:
            raise ValueError(f"sampling.chunk_frames={f} does not divide frames={self.frames}: a video is whole chunks")
        if self.sampling.chunks * f != self.frames:
            raise ValueError(
                f"sampling.chunks ({self.sampling.chunks}) · chunk_frames ({f}) must equal frames ({self.frames}); "
                f"use chunks={self.frames // f}"
            )

    @classmethod
    def bundled(cls) -> "Config":
        """The bundled card: ``wan-t2v``'s sizes (it starts from that card's weights), 4 chunks of 2 frames,
        every chunk kept in the cache, guidance 2 like ``wan-t2v``."""
        return generator.bundled_sizes(cls, sampling=ChunkConfig(num_steps=8, guidance=2.0, chunks=4, chunk_frames=2))

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T, h, w, C)`` of the default video."""
        return generator.video_latent_shape(self)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``wan-causal`` card with freshly initialised components (deterministic in ``seed``; the same
    initial weights as ``wan-t2v`` for a seed)."""
    from jaxpipe.nn.causal_dit import CausalDiT

    return generator.build(config, seed=seed, model_id=model_id, family="wan_causal", loop_id=LOOP_ID, capability="t2v",
                           denoiser=CausalDiT, kind="chunk_rollout", parity=("C0", "C1", "C3"))
