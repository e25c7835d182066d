"""The ``unified`` card family: a refiner LM in front of a text-to-image generator (DESIGN §8).

Components: ``text_encoder``, ``llm`` (a ``RefinerLM``), ``transformer`` (DiT), ``vae``. Two loops:
``refine`` (``ar_decode`` on ``llm``) continues the prompt with attribute words, then ``denoise``
renders the *refined* prompt. The LM speaks the card's tokenizer plus one extra token, ``<eos>``
(id ``tokenizer.vocab_size``), which ends a refinement and never reaches the text encoder.

``refine_from_ids`` and ``refined_ids`` are the pure pieces the program and the RL rollout share:
the LM continues the prompt ids in its own buffer; the refined prompt is that buffer with
``<eos>`` mapped to ``<pad>``, cut to the text encoder's width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import common, flux_t2i
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import ar, denoise
from jaxpipe.nn import LMConfig, RefinerLM, Tokenizer

MODEL_ID = "unified"
REFINE_LOOP = "refine"
DENOISE_LOOP = "denoise"

_LM_VOCAB = len(VOCABULARY) + 3  # <pad>, <unk>, the words, <eos>


@dataclasses.dataclass(frozen=True)
class Config(flux_t2i.Config):
    """A ``flux-t2i`` generator config plus the refiner LM and its decoding policy.

    ``refine.eos_id`` must be the LM's last id (``<eos>``); a prompt of up to
    ``text.max_len - refine.max_new_tokens`` words is refined without truncation.
    """

    lm: LMConfig = LMConfig(vocab_size=_LM_VOCAB)
    refine: ar.ARConfig = ar.ARConfig(max_new_tokens=3, temperature=1.0, eos_id=_LM_VOCAB - 1)

    def __post_init__(self):
        super().__post_init__()
        vocab = Tokenizer(self.vocabulary).vocab_size
        if self.lm.vocab_size != vocab + 1:
            raise ValueError(f"lm.vocab_size must be the tokenizer's {vocab} words + <eos> = {vocab + 1} (got {self.lm.vocab_size})")
        if self.refine.eos_id != vocab:
            raise ValueError(f"refine.eos_id must be the LM's <eos> id {vocab} (got {self.refine.eos_id})")
        if self.refine.max_new_tokens >= self.text.max_len:
            raise ValueError(
                f"refine.max_new_tokens ({self.refine.max_new_tokens}) must leave room for a prompt in the text "
                f"encoder's {self.text.max_len} tokens"
            )
        if self.text.max_len > self.lm.max_len:
            raise ValueError(f"lm.max_len ({self.lm.max_len}) must be >= text.max_len ({self.text.max_len})")

    @classmethod
    def bundled(cls) -> "Config":
        """The bundled card: the bundled ``flux-t2i`` generator plus a small refiner LM."""
        base = flux_t2i.Config.bundled()
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(flux_t2i.Config)})

    @property
    def max_prompt_words(self) -> int:
        """The longest prompt the card refines without cutting the refinement short."""
        return self.text.max_len - self.refine.max_new_tokens


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``unified`` card with freshly initialised components (deterministic in ``seed``)."""
    generator = common.build_generator(
        config, seed=seed, model_id=model_id, family="unified", loop_id=DENOISE_LOOP, capability="t2i"
    )
    llm = RefinerLM(config.lm, rngs=nnx.Rngs(seed + 1))
    refine = LoopSpec(REFINE_LOOP, "ar_decode", ("llm",), config.refine)
    spec = dataclasses.replace(
        generator.spec,
        loops=(refine,) + generator.spec.loops,
        recipe=(REFINE_LOOP, DENOISE_LOOP),
        capabilities=("t2i", "refine"),
    )
    return Card({**generator.components, "llm": llm}, spec)


def eos_id(card: Card) -> int:
    """The LM's end-of-refinement token id."""
    return card.spec.tokenizer.vocab_size


def refine_from_ids(
    card: Card, ids: jax.Array, keys: jax.Array, config: ar.ARConfig, *, capture: bool = False
) -> tuple[ar.ARState, ar.TokenRecord | None]:
    """Continue prompts ``ids`` ``(B, L)`` with the card's LM: the final ``ARState`` (buffer
    ``(B, lm.max_len)``) and, with ``capture``, the per-token records ``(S, B)``. Pure, jittable."""
    start = ar.init(card["llm"], ids, keys, config)
    return ar.run(card["llm"], start, config, capture=capture)


def compact(tokens: jax.Array, width: int) -> jax.Array:
    """Word ids ``(B, T)`` with ``<pad>`` (0) anywhere -> ``(B, width)``: the words in order, then padding."""
    order = jnp.argsort(tokens == 0, axis=1, stable=True)
    tokens = jnp.take_along_axis(tokens, order, axis=1)
    if tokens.shape[1] >= width:
        return tokens[:, :width]
    return jnp.pad(tokens, ((0, 0), (0, width - tokens.shape[1])))


def refined_ids(tokens: jax.Array, eos: int, width: int) -> jax.Array:
    """The refined prompts ``(B, width)`` for the text encoder from LM buffers ``(B, T)``:
    ``<eos>`` (and any ``<pad>`` the LM emitted) dropped, the words kept in order, cut or padded to ``width``."""
    return compact(jnp.where(tokens == eos, 0, tokens), width)


def generate_from_ids(
    card: Card, ids: jax.Array, keys: jax.Array, refine: ar.ARConfig, sampling: denoise.DenoiseConfig
) -> tuple[jax.Array, jax.Array]:
    """Refine then render: ``(images (B, H, W, C) in [0, 1], refined ids (B, L))``. Pure, jittable.

    The LM draws with ``fold_in(key, 0)`` and the denoiser with ``fold_in(key, 1)``, so the two
    loops never share randomness.
    """
    lm_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
    gen_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    final, _ = refine_from_ids(card, ids, lm_keys, refine)
    text = refined_ids(final.tokens, eos_id(card), ids.shape[1])
    return flux_t2i.generate_from_ids(card, text, gen_keys, sampling), text


_generate_jit = jax.jit(generate_from_ids, static_argnames=("refine", "sampling"))


def generate(
    card: Card,
    prompts: str | Sequence[str],
    *,
    seed: int | Sequence[int] = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    temperature: float | None = None,
) -> tuple[jax.Array, list[str]]:
    """Refine ``prompts`` with the LM and render them: ``(images (B, H, W, C), refined prompts)``.

    ``temperature`` overrides the ``refine`` loop's (0 = greedy); the rest as in ``flux_t2i.generate``.
    """
    prompts = common.as_prompts(prompts)
    ids = common.tokenize(card, prompts)
    limit = card.spec.config.max_prompt_words
    long = [p for p, row in zip(prompts, ids) if int(jnp.sum(row != 0)) > limit]
    if long:
        raise ValueError(f"prompts {long} have more than {limit} words (the refiner needs room to add words)")
    refine = card.spec.loop(REFINE_LOOP).config
    if temperature is not None:
        refine = refine.replace(temperature=temperature)
    keys = common.request_keys(seed, len(prompts))
    images, text = _generate_jit(card, ids, keys, refine, common.sampling(card, DENOISE_LOOP, num_steps, guidance))
    words = card.spec.tokenizer.words
    refined = [" ".join(words[int(i)] for i in row if int(i) != 0) for row in text]
    return images, refined
