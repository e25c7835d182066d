"""The ``cosmos3`` card: one shared transformer reasons, then denoises a video.

The same MoT family as ``bagel-mot`` with ``"shared"`` routing (one parameter set for every
token, as Cosmos3). Two loops bind the one ``transformer``: ``reason`` (``ar_decode``) rewrites
the prompt into a complete caption (in the digits world: the digit and its motion, e.g.
``"seven"`` -> ``"seven moving right"``), and ``generate_video`` (``denoise``) renders an 8-frame
video conditioned on the **reasoned** caption alone (its text K/V replace the prompt's). The
card declares an optional ``sound_decoder`` it does not ship: the card validates and loads
without it.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxpipe import validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards.mot import MoTCardConfig, build_card, eos_id
from jaxpipe.loops import ar
from jaxpipe.nn.mot import MoTConfig

__all__ = ["MODEL_ID", "REASON_LOOP", "VIDEO_LOOP", "OPTIONAL", "Config", "build", "eos_id"]

MODEL_ID = "toy-mot-video"
REASON_LOOP = "reason"
VIDEO_LOOP = "generate_video"
OPTIONAL = ("sound_decoder",)


@dataclasses.dataclass(frozen=True)
class Config(MoTCardConfig):
    """Everything that shapes a reason-then-video MoT card (``vocabulary`` required; ``mot`` and ``reason``
    ``None``: the defaults for the vocabulary); the defaults are CPU-test sized. A prompt has at most
    ``mot.max_text - reason.max_new_tokens`` words.

    Attributes:
      reason: the reasoning loop's settings (``None``: 4 tokens at temperature 1, stopping at ``<eos>``).

    Raises:
      ValueError: if ``mot.frames < 2``, or as ``MoTCardConfig``.
    """

    REWRITE: ClassVar[str] = "reason"
    TEXT_LOOPS: ClassVar[tuple[str, ...]] = ("reason",)

    reason: ar.ARConfig | None = None

    def default_mot(self, vocab: int) -> MoTConfig:
        return MoTConfig(vocab_size=vocab + 1, max_text=8, latent_size=8, frames=8, time_embed_dim=64, routing="shared")

    def __post_init__(self):
        super().__post_init__()
        validate.rule(self.mot.frames >= 2, f"a video needs mot.frames >= 2 (got {self.mot.frames})")


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A reason-then-video MoT card with freshly initialised components (deterministic in ``seed``).

    Its optional ``sound_decoder`` is declared, not built.

    Args:
      config: the ``toy_mot_video`` family's ``Config`` (sizes, vocabulary, sampling defaults).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``toy_mot_video`` ``Card``.
    """
    loops = (
        LoopSpec(REASON_LOOP, "ar_decode", ("transformer",), config.reason),
        LoopSpec(VIDEO_LOOP, "denoise", ("transformer",), config.sampling, latent_shape=config.latent_shape),
    )
    return build_card(
        config,
        loops,
        seed=seed,
        model_id=model_id,
        family="toy_mot_video",
        recipe=(REASON_LOOP, VIDEO_LOOP),
        capabilities=("t2v", "reason"),
        optional=OPTIONAL,
    )
