"""The ``toy_multi_expert`` family: N refiner LMs and a text-to-image generator (the digits world's ``multi-expert``).

Components: ``text_encoder``, ``refiners`` (N ``RefinerLM``s of one architecture stored
**stacked**: one module whose every parameter has a leading expert axis of size N; expert ``i``
is addressed as ``refiner_i``), ``transformer``, ``vae``. Loops: ``refine`` (``ar_decode``, the N
refiners decoded as one ``vmap`` over the expert axis) then ``denoise``.

Each refiner owns one slot of the refined prompt: ``slots`` names each slot and its words
(``(("stroke", ("thin", "thick")), ...)``, a world's attributes), and refiner ``i`` may only say
the words of slot ``i % len(slots)`` (or ``<eos>``: say nothing), so the composed prompt
``prompt + word_0 + word_1 + ...`` — and hence the reward — depends on every refiner.
``slots=None`` leaves the vocabulary unrestricted (with N = 1 this is exactly the ``toy_unified`` card).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator, toy_unified
from jaxpipe.nn import MaskedLM, RefinerLM, Tokenizer

__all__ = [
    "MODEL_ID",
    "REFINE_LOOP",
    "DENOISE_LOOP",
    "COMPONENT",
    "EXPERT_PREFIX",
    "Config",
    "expert_names",
    "stacked_components",
    "stack",
    "expert",
    "build",
    "from_unified",
    "expert_keys",
    "slot_models",
    "compose",
]

MODEL_ID = "toy-multi-expert"
REFINE_LOOP = toy_unified.REFINE_LOOP
DENOISE_LOOP = toy_unified.DENOISE_LOOP
COMPONENT = "refiners"
"""The name of the stacked refiners component."""
EXPERT_PREFIX = "refiner_"
"""Expert ``i`` of the stacked component is addressed as ``f"{EXPERT_PREFIX}{i}"``."""


@dataclasses.dataclass(frozen=True)
class Config(toy_unified.Config):
    """A ``toy_unified`` config with N refiners; refiner ``i`` owns slot ``slots[i % len(slots)]``, a
    ``(name, words)`` pair (``None``: every refiner may say every word).

    Every refiner decodes ``refine.max_new_tokens`` tokens (default 1: one word or ``<eos>``);
    prompts may have up to ``text.max_len - N · max_new_tokens`` words.

    Attributes:
      num_refiners: N, the number of refiners (an int >= 1).
      slots: ``((name, words), ...)`` with words from the vocabulary, or ``None`` (unrestricted).
      REFINE_TOKENS: the default ``refine.max_new_tokens``, 1.

    Raises:
      ValueError: on a bad ``num_refiners``, slots with unknown or no words, no room left for a prompt,
        or as ``toy_unified.Config``.
    """

    num_refiners: int = 3
    slots: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    REFINE_TOKENS = 1

    def __post_init__(self):
        n = self.num_refiners
        validate.rule(
            not isinstance(n, bool) and isinstance(n, int) and n >= 1, f"num_refiners must be an int >= 1 (got {n!r})"
        )
        super().__post_init__()
        if self.slots is not None:
            slots = tuple((str(name), tuple(words)) for name, words in self.slots)
            object.__setattr__(self, "slots", slots)
            unknown = sorted({w for _, words in slots for w in words} - set(self.vocabulary))
            validate.rule(
                bool(slots) and not unknown and all(words for _, words in slots),
                f"slots must be (name, words) pairs with words from the vocabulary (got {self.slots!r}; unknown: {unknown})",
            )
        validate.rule(
            self.max_prompt_words >= 1,
            f"{n} refiners × {self.refine.max_new_tokens} tokens leave no room for a prompt in the text encoder's "
            f"{self.text.max_len} tokens; raise text.max_len or lower num_refiners",
        )

    @property
    def max_prompt_words(self) -> int:
        """The longest prompt the card refines without cutting a refinement short:
        ``text.max_len - num_refiners · refine.max_new_tokens``."""
        return self.text.max_len - self.num_refiners * self.refine.max_new_tokens

    def slot(self, i: int) -> str | None:
        """The name of the slot refiner ``i`` owns (``None``: unrestricted).

        Args:
          i: the refiner's index.

        Returns:
          The slot's name, or ``None`` when ``slots`` is ``None``.
        """
        return None if self.slots is None else self.slots[i % len(self.slots)][0]

    def allowed_tokens(self) -> np.ndarray:
        """``(N, V)`` bool: the tokens each refiner may emit (its slot's words and ``<eos>``)."""
        tokenizer = Tokenizer(self.vocabulary)
        allowed = np.zeros((self.num_refiners, self.lm.vocab_size), bool)
        for i in range(self.num_refiners):
            if self.slots is None:
                allowed[i] = True
                continue
            for word in self.slots[i % len(self.slots)][1]:
                allowed[i, tokenizer.words.index(word)] = True
            allowed[i, self.refine.eos_id] = True
        return allowed


def expert_names(card_or_config) -> tuple[str, ...]:
    """``("refiner_0", ..., "refiner_{N-1}")``: how loops, versions and weight sync address the experts.

    Args:
      card_or_config: a multi-expert card or its ``Config``.

    Returns:
      The N expert names.
    """
    config = card_or_config.spec.config if isinstance(card_or_config, Card) else card_or_config
    return tuple(f"{EXPERT_PREFIX}{i}" for i in range(config.num_refiners))


def stacked_components(card: Card) -> dict[str, tuple[str, ...]]:
    """``{"refiners": ("refiner_0", ..., "refiner_{N-1}")}``: the component stored stacked on a leading
    expert axis and its experts' names, the family hook behind ``jaxpipe.cards.stacked_components``
    (the engine keeps one weight version per expert and publishes experts slice by slice).

    Args:
      card: a multi-expert card.

    Returns:
      ``{COMPONENT: expert names}``.
    """
    return {COMPONENT: expert_names(card)}


def stack(lms: Sequence[RefinerLM]) -> RefinerLM:
    """One ``RefinerLM`` whose every variable stacks those of ``lms`` on a leading axis.

    Args:
      lms: N ``RefinerLM``s of one ``LMConfig``.

    Returns:
      A ``RefinerLM`` whose every variable is ``(N, ...)``.

    Raises:
      ValueError: if ``lms`` is empty or their configs differ.
    """
    if not lms:
        raise ValueError("stack needs at least one LM")
    if len({lm.cfg for lm in lms}) != 1:
        raise ValueError("stacked refiners must share one LMConfig")
    graphdef = nnx.graphdef(lms[0])
    states = [nnx.state(lm) for lm in lms]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def expert(card: Card, i: int) -> RefinerLM:
    """Refiner ``i`` as a plain ``RefinerLM`` (a slice of the stacked component).

    Args:
      card: a multi-expert card.
      i: the refiner's index, in ``[0, N)``.

    Returns:
      The ``RefinerLM``.

    Raises:
      IndexError: if ``i`` is out of range.
    """
    n = card.spec.config.num_refiners
    if not 0 <= i < n:
        raise IndexError(f"refiner index {i} out of range for {n} refiners")
    graphdef, state = nnx.split(card[COMPONENT])
    return nnx.merge(graphdef, jax.tree.map(lambda x: x[i], state))


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A multi-refiner card with freshly initialised components (refiner ``i`` from seed ``seed + 1 + i``).

    Args:
      config: the card's config.
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``Card``: the generator's components and the stacked ``refiners``; loops ``refine`` then ``denoise``.
    """
    base = generator.build(
        config, seed=seed, model_id=model_id, family="toy_multi_expert", loop_id=DENOISE_LOOP, capability="t2i"
    )
    refiners = stack([RefinerLM(config.lm, rngs=nnx.Rngs(seed + 1 + i)) for i in range(config.num_refiners)])
    refine = LoopSpec(REFINE_LOOP, "ar_decode", (COMPONENT,), config.refine)
    spec = dataclasses.replace(
        base.spec, loops=(refine,) + base.spec.loops, recipe=(REFINE_LOOP, DENOISE_LOOP), capabilities=("t2i", "refine")
    )
    return Card({**base.components, COMPONENT: refiners}, spec)


def from_unified(card: Card, num_refiners: int = 3, *, model_id: str = MODEL_ID, **changes) -> Card:
    """A multi-refiner card (id ``model_id``) from a ``toy_unified`` card: its generator, and its LM copied
    into every refiner.

    Args:
      card: a ``toy_unified`` card (with an ``llm``).
      num_refiners: N.
      model_id: the new card's id.
      **changes: ``Config`` fields (e.g. ``slots``).

    Returns:
      The multi-expert ``Card``.

    Raises:
      ValueError: if ``card`` has no ``llm``, or the config is invalid.
    """
    if "llm" not in card.components:
        raise ValueError(f"from_unified needs a refiner card with an 'llm' (got {card.model_id!r})")
    base = card.spec.config
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(toy_unified.Config) if f.name != "refine"}
    config = Config(**{**fields, "num_refiners": num_refiners, **changes})
    refiners = stack([card["llm"]] * num_refiners)
    template = nnx.eval_shape(lambda: build(config, model_id=model_id))
    components = {name: card[name] for name in ("text_encoder", "transformer", "vae")}
    return Card({**components, COMPONENT: refiners}, template.spec)


def expert_keys(keys: jax.Array, num_refiners: int) -> jax.Array:
    """``(N, B)`` refiner keys from per-sample keys ``(B,)``: refiner 0 uses ``fold_in(key, 0)`` (the
    ``unified`` card's LM key), refiner ``i > 0`` uses ``fold_in(key, i + 1)``; the denoiser keeps
    ``fold_in(key, 1)``.

    Args:
      keys: ``(B,)`` typed PRNG keys, one per sample.
      num_refiners: N.

    Returns:
      ``(N, B)`` typed PRNG keys.
    """
    index = jnp.array([0] + [i + 1 for i in range(1, num_refiners)], jnp.uint32)
    return jax.vmap(lambda i: jax.vmap(lambda k: jax.random.fold_in(k, i))(keys))(index)


def slot_models(refiners: RefinerLM, allowed: jax.Array, fn):
    """``vmap`` of ``fn(lm_i, *args)`` over the expert axis: ``fn`` gets refiner ``i`` restricted to its slot.

    Args:
      refiners: the stacked ``RefinerLM`` (every variable ``(N, ...)``).
      allowed: ``(N, V)`` bool, each refiner's allowed tokens.
      fn: ``fn(lm, *args)``, called with a ``MaskedLM`` of refiner ``i``.

    Returns:
      A function of ``(expert-stacked args...)`` (each ``(N, ...)``), returning ``fn``'s outputs stacked
      on a leading expert axis; the stacked params are the first mapped input.
    """
    graphdef, state = nnx.split(refiners)

    def one(params, allowed_i, *args):
        return fn(MaskedLM(nnx.merge(graphdef, params), allowed_i), *args)

    return lambda *args: jax.vmap(one)(state, allowed, *args)


def compose(prompt_ids: jax.Array, tokens: jax.Array, generated: jax.Array, eos: int, width: int) -> jax.Array:
    """The composed prompts ``(B, width)``: ``prompt_ids`` ``(B, L)`` followed by refiner 0's words,
    refiner 1's, ... taken from LM buffers ``tokens`` ``(N, B, T)`` where ``generated`` ``(N, B, T)``;
    ``<eos>`` dropped, words compacted.

    Args:
      prompt_ids: ``(B, L)`` int ids of the prompts.
      tokens: ``(N, B, T)`` the refiners' LM buffers.
      generated: ``(N, B, T)`` bool, where the buffers hold generated tokens.
      eos: the ``<eos>`` id.
      width: the composed rows' width.

    Returns:
      ``(B, width)`` ids: the words in order, then padding (cut to ``width``).
    """
    words = jnp.where(generated & (tokens != eos), tokens, 0)
    n, b, t = words.shape
    joined = jnp.concatenate([prompt_ids, jnp.transpose(words, (1, 0, 2)).reshape(b, n * t)], axis=1)
    return toy_unified.compact(joined, width)
