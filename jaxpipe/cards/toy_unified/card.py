"""The ``toy_unified`` family: a refiner LM in front of a text-to-image generator (the digits world's ``unified``).

Components: ``text_encoder``, ``llm`` (a ``RefinerLM``), ``transformer`` (DiT), ``vae``. Two loops:
``refine`` (``ar_decode`` on ``llm``) continues the prompt with attribute words, then ``denoise``
renders the *refined* prompt. The LM speaks the card's tokenizer plus one extra token, ``<eos>``
(id ``tokenizer.vocab_size``), which ends a refinement and never reaches the text encoder.

``refined_ids`` turns the LM's buffer into the refined prompt: ``<eos>`` mapped to ``<pad>``, the
words compacted and cut to the text encoder's width.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.cards.toy_t2i import Config as T2IConfig
from jaxpipe.loops import ar
from jaxpipe.nn import LMConfig, RefinerLM, Tokenizer

__all__ = ["MODEL_ID", "REFINE_LOOP", "DENOISE_LOOP", "Config", "build", "eos_id", "compact", "refined_ids"]

MODEL_ID = "toy-unified"
REFINE_LOOP = "refine"
DENOISE_LOOP = "denoise"


@dataclasses.dataclass(frozen=True)
class Config(T2IConfig):
    """A text-to-image generator config plus the refiner LM and its decoding policy.

    ``lm`` (``None``: the default LM for the vocabulary) speaks the tokenizer's ids plus ``<eos>``;
    ``refine`` (``None``: up to ``REFINE_TOKENS`` tokens at temperature 1) has ``eos_id`` the LM's
    last id. A prompt of up to ``text.max_len - refine.max_new_tokens`` words is refined without
    truncation.

    Attributes:
      lm: the refiner LM (``None``: ``LMConfig(vocab_size=vocab + 1)``).
      refine: the ``refine`` loop's settings (``None``: ``REFINE_TOKENS`` tokens at temperature 1).
      REFINE_TOKENS: the default ``refine.max_new_tokens``, 3.

    Raises:
      ValueError: if the LM's vocabulary or ``eos_id`` does not fit the tokenizer, the refinement leaves
        no room for a prompt, or ``lm.max_len < text.max_len``.
    """

    lm: LMConfig | None = None
    refine: ar.ARConfig | None = None

    REFINE_TOKENS = 3

    def __post_init__(self):
        super().__post_init__()
        vocab = Tokenizer(self.vocabulary).vocab_size
        generator.fill(
            self,
            lm=lambda: LMConfig(vocab_size=vocab + 1),
            refine=lambda: ar.ARConfig(max_new_tokens=self.REFINE_TOKENS, temperature=1.0, eos_id=vocab),
        )
        validate.rule(
            self.lm.vocab_size == vocab + 1,
            f"lm.vocab_size must be the tokenizer's {vocab} words + <eos> = {vocab + 1} (got {self.lm.vocab_size})",
        )
        validate.rule(
            self.refine.eos_id == vocab, f"refine.eos_id must be the LM's <eos> id {vocab} (got {self.refine.eos_id})"
        )
        validate.rule(
            self.refine.max_new_tokens < self.text.max_len,
            f"refine.max_new_tokens ({self.refine.max_new_tokens}) must leave room for a prompt in the text "
            f"encoder's {self.text.max_len} tokens",
        )
        validate.rule(
            self.text.max_len <= self.lm.max_len,
            f"lm.max_len ({self.lm.max_len}) must be >= text.max_len ({self.text.max_len})",
        )

    @property
    def max_prompt_words(self) -> int:
        """The longest prompt the card refines without cutting the refinement short."""
        return self.text.max_len - self.refine.max_new_tokens


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``unified`` card with freshly initialised components (deterministic in ``seed``; the LM from ``seed + 1``).

    Args:
      config: the card's config.
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``Card``: the generator's components and ``llm``; loops ``refine`` then ``denoise``.
    """
    base = generator.build(
        config, seed=seed, model_id=model_id, family="toy_unified", loop_id=DENOISE_LOOP, capability="t2i"
    )
    llm = RefinerLM(config.lm, rngs=nnx.Rngs(seed + 1))
    refine = LoopSpec(REFINE_LOOP, "ar_decode", ("llm",), config.refine)
    spec = dataclasses.replace(
        base.spec, loops=(refine,) + base.spec.loops, recipe=(REFINE_LOOP, DENOISE_LOOP), capabilities=("t2i", "refine")
    )
    return Card({**base.components, "llm": llm}, spec)


def eos_id(card: Card) -> int:
    """The LM's end-of-refinement token id.

    Args:
      card: a refiner card.

    Returns:
      The id, the tokenizer's ``vocab_size``.
    """
    return card.spec.tokenizer.vocab_size


def compact(tokens: jax.Array, width: int) -> jax.Array:
    """Moves the words of each row to its front, keeping their order.

    Args:
      tokens: ``(B, T)`` word ids with ``<pad>`` (0) anywhere.
      width: the output width (rows are cut or padded to it).

    Returns:
      ``(B, width)``: the words in order, then padding.
    """
    order = jnp.argsort(tokens == 0, axis=1, stable=True)
    tokens = jnp.take_along_axis(tokens, order, axis=1)
    if tokens.shape[1] >= width:
        return tokens[:, :width]
    return jnp.pad(tokens, ((0, 0), (0, width - tokens.shape[1])))


def refined_ids(tokens: jax.Array, eos: int, width: int) -> jax.Array:
    """The refined prompts ``(B, width)`` for the text encoder from LM buffers ``(B, T)``:
    ``<eos>`` (and any ``<pad>`` the LM emitted) dropped, the words kept in order, cut or padded to ``width``.

    Args:
      tokens: ``(B, T)`` LM buffers (prompt then generated tokens).
      eos: the ``<eos>`` id.
      width: the text encoder's width.

    Returns:
      ``(B, width)`` ids.
    """
    return compact(jnp.where(tokens == eos, 0, tokens), width)
