"""The ``bagel-mot`` card: ONE Mixture-of-Transformers that thinks, generates and understands.

Components: ``transformer`` (a ``MoT``, modality routing: an understanding expert for text tokens,
a generation expert for image tokens, joint attention) and ``vae``. Three loops bind the same
``transformer``:

- ``generate_text`` (``ar_decode``): the MoT continues the prompt with "thought" tokens — in the
  digits world it completes a partial prompt into a full caption (digit, stroke, position,
  brightness) and ends it with ``<eos>``;
- ``generate_image`` (``denoise``): image latent tokens denoised by the same module, attending to
  the prompt + thought tokens through the text K/V the AR loop left in its cache;
- ``understand`` (``ar_decode``): an image's latent tokens in the cache as context, the caption
  decoded after a ``<bos>`` (the ``<eos>`` id doubles as it: "a text begins").

The MoT speaks the card's tokenizer plus ``<eos>`` (id ``tokenizer.vocab_size``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxpipe import validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards.mot import MoTCardConfig, build_card, eos_id
from jaxpipe.loops import ar
from jaxpipe.nn.mot import MoTConfig

__all__ = ["IMAGE_LOOP", "MODEL_ID", "THINK_LOOP", "UNDERSTAND_LOOP", "Config", "build", "eos_id"]

MODEL_ID = "toy-mot"
THINK_LOOP = "generate_text"
IMAGE_LOOP = "generate_image"
UNDERSTAND_LOOP = "understand"


@dataclasses.dataclass(frozen=True)
class Config(MoTCardConfig):
    """Everything that shapes a MoT card (``vocabulary`` required); the defaults are CPU-test sized.

    ``mot`` (``None``: the default MoT for the vocabulary); ``think``: the thinking policy (``eos_id``
    the MoT's last id); ``caption``: the understanding policy (greedy by default); ``sampling``: the
    image loop's. A prompt has at most
    ``mot.max_text - think.max_new_tokens`` words (``max_prompt_words``).

    Attributes:
      think: the thinking loop's settings (``None``: 4 tokens at temperature 1, stopping at ``<eos>``).
      caption: the understanding loop's settings (``None``: 5 greedy tokens, stopping at ``<eos>``).

    Raises:
      ValueError: if ``<bos>`` + ``caption.max_new_tokens`` exceeds ``mot.max_text``, or as ``MoTCardConfig``.
    """

    REWRITE: ClassVar[str] = "think"
    TEXT_LOOPS: ClassVar[tuple[str, ...]] = ("think", "caption")

    think: ar.ARConfig | None = None
    caption: ar.ARConfig | None = None

    def default_mot(self, vocab: int) -> MoTConfig:
        return MoTConfig(vocab_size=vocab + 1, max_text=8, latent_size=8, time_embed_dim=64)

    def default_text_loop(self, name: str, vocab: int) -> ar.ARConfig:
        if name == "caption":  # understanding reads the image greedily, one token longer
            return ar.ARConfig(max_new_tokens=5, temperature=0.0, eos_id=vocab)
        return super().default_text_loop(name, vocab)

    def __post_init__(self):
        super().__post_init__()
        validate.rule(
            1 + self.caption.max_new_tokens <= self.mot.max_text,
            f"<bos> + caption.max_new_tokens ({self.caption.max_new_tokens}) exceeds mot.max_text ({self.mot.max_text})",
        )


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A MoT card with freshly initialised components (deterministic in ``seed``).

    Its three loops (``generate_text``, ``generate_image``, ``understand``) bind the one ``transformer``.

    Args:
      config: the ``toy_mot`` family's ``Config`` (sizes, vocabulary, sampling defaults).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``toy_mot`` ``Card``.
    """
    loops = (
        LoopSpec(THINK_LOOP, "ar_decode", ("transformer",), config.think),
        LoopSpec(IMAGE_LOOP, "denoise", ("transformer",), config.sampling, latent_shape=config.latent_shape),
        LoopSpec(UNDERSTAND_LOOP, "ar_decode", ("transformer",), config.caption),
    )
    return build_card(
        config,
        loops,
        seed=seed,
        model_id=model_id,
        family="toy_mot",
        recipe=(THINK_LOOP, IMAGE_LOOP),
        capabilities=("t2i", "think", "understand"),
    )
