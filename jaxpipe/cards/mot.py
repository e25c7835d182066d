"""What every Mixture-of-Transformers family shares (``toy_mot``, ``toy_mot_video``): the config checks
(``MoTCardConfig``) and program pieces over one ``transformer`` (a ``jaxpipe.nn.mot.MoT``) bound to an
AR loop and a denoise loop.

The prompt is prefilled once (a cached node, versioned with the ``transformer``); the AR loop
starts from that prefill; the denoise loop starts from the text K/V of whatever text the family
conditions on, with an all-masked text as the unconditional half of guidance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.loops import ar, denoise
from jaxpipe.nn import Autoencoder, AutoencoderConfig, Tokenizer
from jaxpipe.nn.mot import MoT, MoTCond, MoTConfig
from jaxpipe.program import ComponentNode, LoopNode
from jaxpipe.request import Request

__all__ = [
    "MoTCardConfig",
    "build_card",
    "fold",
    "lengths",
    "eos_id",
    "prefill_prompt",
    "start_ar",
    "final_state",
    "prompt_then_decode",
    "start_denoise",
    "prompt_ids",
    "settings_with_temperature",
    "request_key",
]


@dataclasses.dataclass(frozen=True)
class MoTCardConfig:
    """What both MoT families' configs share, and the checks of the MoT against its parts.

    ``__post_init__`` fills the ``None`` fields and checks the MoT against its tokenizer (its words +
    ``<eos>``), autoencoder (latent size and channels) and text loops (each stops at ``<eos>``; the
    rewrite leaves room for a prompt). A family adds one ``ar.ARConfig`` field per text loop.

    Attributes:
      vocabulary: the card's words (required, keyword-only).
      image_size: the side of a generated image in pixels.
      vae: the autoencoder.
      mot: the MoT (``None``: ``default_mot(vocab)`` for the vocabulary).
      sampling: the image / video loop's settings.
      REWRITE: the text loop that rewrites the prompt (``"think"``, ``"reason"``).
      TEXT_LOOPS: the names of the family's text-loop fields (``None`` there: ``default_text_loop``).

    Raises:
      ValueError: if the MoT does not fit its tokenizer, autoencoder or text loops.
    """

    REWRITE: ClassVar[str]
    TEXT_LOOPS: ClassVar[tuple[str, ...]]

    vocabulary: tuple[str, ...] = dataclasses.field(kw_only=True)
    image_size: int = 16
    vae: AutoencoderConfig = AutoencoderConfig()
    mot: MoTConfig | None = None
    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()

    def __post_init__(self):
        object.__setattr__(self, "vocabulary", tuple(self.vocabulary))
        vocab = Tokenizer(self.vocabulary).vocab_size
        generator.fill(
            self,
            mot=lambda: self.default_mot(vocab),
            **{name: (lambda name=name: self.default_text_loop(name, vocab)) for name in self.TEXT_LOOPS},
        )
        self._check_mot(vocab)

    def default_mot(self, vocab: int) -> MoTConfig:
        """The CPU-test-sized MoT of a ``vocab``-word tokenizer (+ <eos>); each family defines it.

        Args:
          vocab: the tokenizer's vocabulary size (the MoT has ``vocab + 1`` ids).

        Returns:
          A ``MoTConfig``.
        """
        raise NotImplementedError

    def default_text_loop(self, name: str, vocab: int) -> ar.ARConfig:
        """The default settings of text loop ``name``: 4 tokens sampled at temperature 1, stopping at <eos>.

        Args:
          name: one of ``TEXT_LOOPS``.
          vocab: the tokenizer's vocabulary size (= the MoT's ``<eos>`` id).

        Returns:
          An ``ar.ARConfig``.
        """
        return ar.ARConfig(max_new_tokens=4, temperature=1.0, eos_id=vocab)

    def _check_mot(self, vocab: int) -> None:
        """ValueErrors for a MoT that does not fit: ``vocab`` words + <eos>, each text loop stopping at
        <eos>, room for a prompt beside the rewrite, latents of the autoencoder's shape."""
        if self.mot.vocab_size != vocab + 1:
            raise ValueError(
                f"mot.vocab_size must be the tokenizer's {vocab} words + <eos> = {vocab + 1} (got {self.mot.vocab_size})"
            )
        for name in self.TEXT_LOOPS:
            if getattr(self, name).eos_id != vocab:
                raise ValueError(f"{name}.eos_id must be the MoT's <eos> id {vocab} (got {getattr(self, name).eos_id})")
        rewrite = getattr(self, self.REWRITE).max_new_tokens
        if rewrite >= self.mot.max_text:
            raise ValueError(
                f"{self.REWRITE}.max_new_tokens ({rewrite}) must leave room for a prompt in "
                f"mot.max_text ({self.mot.max_text})"
            )
        if self.image_size % self.vae.downsample or self.mot.latent_size != self.image_size // self.vae.downsample:
            raise ValueError(
                f"mot.latent_size must be image_size / vae.downsample = {self.image_size}/{self.vae.downsample} "
                f"(got {self.mot.latent_size})"
            )
        if self.mot.latent_channels != self.vae.latent_channels:
            raise ValueError(
                f"mot.latent_channels ({self.mot.latent_channels}) must equal vae.latent_channels "
                f"({self.vae.latent_channels})"
            )

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """The per-request latent shape of the image / video loop (the MoT's ``latent_shape``)."""
        return self.mot.latent_shape

    @property
    def max_prompt_words(self) -> int:
        """The words a prompt may have: the MoT's text slots less the rewrite's."""
        return self.mot.max_text - getattr(self, self.REWRITE).max_new_tokens


def build_card(
    config: MoTCardConfig,
    loops: tuple[LoopSpec, ...],
    *,
    seed: int,
    model_id: str,
    family: str,
    recipe: tuple[str, ...],
    capabilities: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> Card:
    """A MoT card with freshly initialised components (deterministic in ``seed``).

    ONE ``transformer`` (a ``MoT``) is bound to every loop of ``loops``, beside the autoencoder ``vae``.

    Args:
      config: the family's config.
      loops: the card's loops (each binding ``("transformer",)``).
      seed: the initialisation seed.
      model_id: the card's id.
      family: the family's name.
      recipe: the loop ids a default generation runs, in order.
      capabilities: what the card can do (``"t2i"``, ``"think"``, ...).
      optional: the loops of ``recipe`` a request may skip.

    Returns:
      The ``Card``.
    """
    rngs = nnx.Rngs(seed)
    components = {"transformer": MoT(config.mot, rngs=rngs), "vae": Autoencoder(config.vae, rngs=rngs)}
    spec = CardSpec(
        model_id=model_id,
        family=family,
        loops=loops,
        recipe=recipe,
        parity=("C0", "C1", "C2", "C3"),
        capabilities=capabilities,
        tokenizer=Tokenizer(config.vocabulary),
        config=config,
        optional=optional,
    )
    return Card(components, spec)


def fold(keys: jax.Array, stream: int) -> jax.Array:
    """Per-request keys ``fold_in(key, stream)``: each loop of a card draws from its own stream.

    Args:
      keys: ``(B,)`` typed PRNG keys.
      stream: the loop's stream index.

    Returns:
      ``(B,)`` typed PRNG keys.
    """
    return jax.vmap(lambda k: jax.random.fold_in(k, stream))(keys)


def lengths(ids: jax.Array) -> jax.Array:
    """The true lengths of right-padded ids (pad is id 0).

    Args:
      ids: ``(B, L)`` int token ids.

    Returns:
      ``(B,)`` int32 counts of non-pad ids.
    """
    return jnp.sum(ids != 0, axis=1).astype(jnp.int32)


def eos_id(card: Card) -> int:
    """The MoT's ``<eos>`` id: the token after the card tokenizer's words.

    Args:
      card: a MoT card.

    Returns:
      The id, an int (the tokenizer's ``vocab_size``).
    """
    return card.spec.tokenizer.vocab_size


def prefill_prompt(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt through the MoT once: next-token logits and the text K/V cache.

    Args:
      card: a MoT card.
      reads: ``{"ids": (B, L) int}``, right-padded prompts.

    Returns:
      ``{"prompt_logits": (B, V), "prompt_cache": MoTCache}``.
    """
    mot = card["transformer"]
    ids = reads["ids"]
    logits, cache = mot.prefill(ids, lengths(ids), mot.init_cache(ids.shape[0]))
    return {"prompt_logits": logits, "prompt_cache": cache}


def start_ar(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: ar.ARConfig) -> ar.ARState:
    """Starts an AR loop from the prefilled prompt (keys ``fold_in(key, 0)``).

    Args:
      card: a MoT card.
      loop: the AR loop (binds the MoT).
      reads: ``ids`` ``(B, L)``, ``key`` ``(B,)``, ``prompt_logits`` and ``prompt_cache`` (from
        ``prefill_prompt``).
      config: the loop's settings.

    Returns:
      The loop's first ``ar.ARState``.
    """
    (mot,) = card.bound(loop.id)
    prefilled = (reads["prompt_logits"], reads["prompt_cache"])
    return ar.init(mot, reads["ids"], fold(reads["key"], 0), config, prefilled=prefilled)


def final_state(state: Any) -> Any:
    """A loop's whole final state as its result (the next node reads its tokens and cache).

    Args:
      state: the loop's final state.

    Returns:
      ``state`` unchanged.
    """
    return state


def prompt_then_decode(loop_id: str, writes: str) -> tuple[ComponentNode, LoopNode]:
    """The nodes a MoT program starts with: prefill the prompt ``ids`` into the transformer's KV cache
    (cached per prompt), then decode from that cache in the ``ar_decode`` loop ``loop_id``.

    Args:
      loop_id: the ``ar_decode`` loop's id (thinking, reasoning ...).
      writes: the slot the loop's final state goes to.

    Returns:
      ``(prefill node, AR loop node)``: the prefill writes ``prompt_logits`` / ``prompt_cache``.
    """
    prefill = ComponentNode(
        "prefill",
        prefill_prompt,
        ("ids",),
        ("prompt_logits", "prompt_cache"),
        component="transformer",
        cached=True,
    )
    decode = LoopNode(
        loop_id,
        start_ar,
        reads=("ids", "key", "prompt_logits", "prompt_cache"),
        writes=(writes,),
        result=final_state,
    )
    return prefill, decode


def start_denoise(
    card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: denoise.DenoiseConfig
) -> denoise.DenoiseState:
    """Starts the denoise loop on the text K/V ``cond`` (keys ``fold_in(key, 1)``).

    Guidance's unconditional half attends to no text (zero K/V, all-false mask).

    Args:
      card: a MoT card.
      loop: the denoise loop (its ``latent_shape`` shapes the noise).
      reads: ``{"key": (B,) keys, "cond": MoTCond}``.
      config: the loop's settings.

    Returns:
      The loop's first ``denoise.DenoiseState``.
    """
    cond: MoTCond = reads["cond"]
    uncond = None
    if config.guide.needs_uncond:
        uncond = MoTCond(
            tuple(map(jnp.zeros_like, cond.k)), tuple(map(jnp.zeros_like, cond.v)), jnp.zeros_like(cond.mask)
        )
    return denoise.init(fold(reads["key"], 1), loop.latent_shape, cond, config, uncond)


def prompt_ids(card: Card, request: Request, *, max_words: int, who: str) -> np.ndarray:
    """The request's prompt as ids, padded to ``max_words``.

    Args:
      card: a MoT card.
      request: the request (a ``prompt`` of 1 to ``max_words`` words, no ``image``).
      max_words: the most words a prompt may have.
      who: what needs the rest of the packed sequence's text slots (said in the error).

    Returns:
      ``(1, max_words)`` int32 ids.

    Raises:
      ValueError: on an image, a missing or empty prompt, more than ``max_words`` words or a word outside
        the vocabulary.
    """
    if request.image is not None:
        raise ValueError(
            f"{card.model_id!r} renders text and takes no image here (got image={np.shape(request.image)})"
        )
    if request.prompt is None:
        raise ValueError(f"{card.model_id!r} renders a text prompt: the request needs prompt=...")
    words = request.prompt.split()
    if not words:
        raise ValueError(f"{card.model_id!r}: the prompt needs at least one word (e.g. 'seven')")
    if len(words) > max_words:
        raise ValueError(
            f"{card.model_id!r}: prompt {request.prompt!r} has {len(words)} words; the packed sequence has "
            f"max_text={card['transformer'].cfg.max_text} text slots and {who}, so prompts may have at most "
            f"max_prompt_words = {max_words}"
        )
    return card.spec.tokenizer.encode([request.prompt], max_words)


def settings_with_temperature(card: Card, loop_id: str, request: Request) -> ar.ARConfig:
    """An AR loop's settings with the request's ``inputs["temperature"]``, if given.

    Args:
      card: the card.
      loop_id: one of its AR loops.
      request: the request.

    Returns:
      The loop's ``ar.ARConfig``, its temperature replaced when the request sets one.
    """
    config = card.spec.loop(loop_id).config
    if request.inputs.get("temperature") is not None:
        config = config.replace(temperature=request.inputs["temperature"])
    return config


def request_key(request: Request) -> jax.Array:
    """The request seed's PRNG key.

    Args:
      request: the request.

    Returns:
      ``(1,)`` typed PRNG keys.
    """
    return generator.request_keys([request.seed])
