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
from jaxpipe.request import Request


@dataclasses.dataclass(frozen=True)
class MoTCardConfig:
    """What both MoT families' configs share: the ``vocabulary`` (required), ``image_size``, the autoencoder,
    the MoT (``None``: ``default_mot(vocab)`` for the vocabulary) and the image / video loop's ``sampling``;
    the checks of the MoT against its tokenizer, autoencoder and text loops; its latent shape and the words
    a prompt may have. A family adds one ``ar.ARConfig`` field per text loop (``TEXT_LOOPS``; ``None``:
    ``default_text_loop``), ``REWRITE`` naming the one that rewrites the prompt (``"think"``, ``"reason"``)."""

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
        generator.fill(self, mot=lambda: self.default_mot(vocab),
                       **{name: (lambda name=name: self.default_text_loop(name, vocab)) for name in self.TEXT_LOOPS})
        self._check_mot(vocab)

    def default_mot(self, vocab: int) -> MoTConfig:
        """The CPU-test-sized MoT of a ``vocab``-word tokenizer (+ <eos>)."""
        raise NotImplementedError

    def default_text_loop(self, name: str, vocab: int) -> ar.ARConfig:
        """The default settings of text loop ``name``: 4 tokens sampled at temperature 1, stopping at <eos>."""
        return ar.ARConfig(max_new_tokens=4, temperature=1.0, eos_id=vocab)

    def _check_mot(self, vocab: int) -> None:
        """ValueErrors for a MoT that does not fit: ``vocab`` words + <eos>, each text loop stopping at
        <eos>, room for a prompt beside the rewrite, latents of the autoencoder's shape."""
        if self.mot.vocab_size != vocab + 1:
            raise ValueError(f"mot.vocab_size must be the tokenizer's {vocab} words + <eos> = {vocab + 1} (got {self.mot.vocab_size})")
        for name in self.TEXT_LOOPS:
            if getattr(self, name).eos_id != vocab:
                raise ValueError(f"{name}.eos_id must be the MoT's <eos> id {vocab} (got {getattr(self, name).eos_id})")
        rewrite = getattr(self, self.REWRITE).max_new_tokens
        if rewrite >= self.mot.max_text:
            raise ValueError(f"{self.REWRITE}.max_new_tokens ({rewrite}) must leave room for a prompt in "
                             f"mot.max_text ({self.mot.max_text})")
        if self.image_size % self.vae.downsample or self.mot.latent_size != self.image_size // self.vae.downsample:
            raise ValueError(f"mot.latent_size must be image_size / vae.downsample = {self.image_size}/{self.vae.downsample} "
                             f"(got {self.mot.latent_size})")
        if self.mot.latent_channels != self.vae.latent_channels:
            raise ValueError(f"mot.latent_channels ({self.mot.latent_channels}) must equal vae.latent_channels "
                             f"({self.vae.latent_channels})")

    @property
    def latent_shape(self) -> tuple[int, ...]:
        return self.mot.latent_shape

    @property
    def max_prompt_words(self) -> int:
        """The words a prompt may have: the MoT's text slots less the rewrite's."""
        return self.mot.max_text - getattr(self, self.REWRITE).max_new_tokens

__all__ = ["MoTCardConfig", "build_card", "fold", "lengths", "prefill_prompt", "start_ar", "final_state", "start_denoise", "prompt_ids", "eos_id"]


def build_card(config: MoTCardConfig, loops: tuple[LoopSpec, ...], *, seed: int, model_id: str, family: str,
               recipe: tuple[str, ...], capabilities: tuple[str, ...], optional: tuple[str, ...] = ()) -> Card:
    """A MoT card with freshly initialised components (deterministic in ``seed``): ONE ``transformer`` (a
    ``MoT``) bound to every loop of ``loops``, and the autoencoder ``vae``."""
    rngs = nnx.Rngs(seed)
    components = {"transformer": MoT(config.mot, rngs=rngs), "vae": Autoencoder(config.vae, rngs=rngs)}
    spec = CardSpec(model_id=model_id, family=family, loops=loops, recipe=recipe, parity=("C0", "C1", "C2", "C3"),
                    capabilities=capabilities, tokenizer=Tokenizer(config.vocabulary), config=config, optional=optional)
    return Card(components, spec)


def fold(keys: jax.Array, stream: int) -> jax.Array:
    """Per-request keys ``fold_in(key, stream)``: each loop of a card draws from its own stream."""
    return jax.vmap(lambda k: jax.random.fold_in(k, stream))(keys)


def lengths(ids: jax.Array) -> jax.Array:
    """True lengths ``(B,)`` of right-padded ids ``(B, L)``."""
    return jnp.sum(ids != 0, axis=1).astype(jnp.int32)


def eos_id(card: Card) -> int:
    """The MoT's ``<eos>`` id: the token after the card tokenizer's words."""
    return card.spec.tokenizer.vocab_size


def prefill_prompt(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt ``ids`` ``(B, L)`` through the MoT once: next-token logits and the text K/V cache."""
    mot = card["transformer"]
    ids = reads["ids"]
    logits, cache = mot.prefill(ids, lengths(ids), mot.init_cache(ids.shape[0]))
    return {"prompt_logits": logits, "prompt_cache": cache}


def start_ar(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: ar.ARConfig) -> ar.ARState:
    """Start an AR loop from the prefilled prompt (keys ``fold_in(key, 0)``)."""
    (mot,) = card.bound(loop.id)
    prefilled = (reads["prompt_logits"], reads["prompt_cache"])
    return ar.init(mot, reads["ids"], fold(reads["key"], 0), config, prefilled=prefilled)


def final_state(state: Any) -> Any:
    """A loop's whole final state as its result (the next node reads its tokens and cache)."""
    return state


def start_denoise(card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: denoise.DenoiseConfig) -> denoise.DenoiseState:
    """Start the denoise loop on ``cond`` (a ``MoTCond``; keys ``fold_in(key, 1)``); guidance's
    unconditional half attends to no text."""
    cond: MoTCond = reads["cond"]
    uncond = None
    if config.guide.needs_uncond:
        uncond = MoTCond(tuple(map(jnp.zeros_like, cond.k)), tuple(map(jnp.zeros_like, cond.v)), jnp.zeros_like(cond.mask))
    return denoise.init(fold(reads["key"], 1), loop.latent_shape, cond, config, uncond)


def prompt_ids(card: Card, request: Request, *, max_words: int, who: str) -> np.ndarray:
    """The request's prompt as ids ``(1, max_words)``: 1 to ``max_words`` words (``who`` needs the rest
    of the packed sequence's text slots); clear errors otherwise."""
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text and takes no image here (got image={np.shape(request.image)})")
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
    """An AR loop's settings with the request's ``inputs["temperature"]``, if given."""
    config = card.spec.loop(loop_id).config
    if request.inputs.get("temperature") is not None:
        config = config.replace(temperature=request.inputs["temperature"])
    return config


def request_key(request: Request) -> jax.Array:
    return generator.request_keys([request.seed])
