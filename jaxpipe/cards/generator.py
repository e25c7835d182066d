"""What every text-conditioned generator family shares (``toy_t2i``, ``toy_i2v``, ``unified``,
``toy_multi_expert``): a text encoder, a ``DiT`` denoiser and an autoencoder.

Config checks and the card builder; the program pieces (cached text-encoding nodes, the denoise
loop's start, decode nodes, request binding); and the ``FlowData`` hooks ``Finetune`` trains
them with (``jaxpipe.cards.text_flow``, re-exported here). A family folder composes these into
its card and program; nothing here runs a whole pipeline (that is the program's job).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards.text_flow import TEXT_FLOW, TextFlow
from jaxpipe.loops import denoise
from jaxpipe.nn import AutoencoderConfig, DiTCond, DiTConfig, TextEncoderConfig
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings
from jaxpipe.request import Request

__all__ = [
    "TextGeneratorConfig",
    "VideoGeneratorConfig",
    "vocab_size",
    "fill",
    "build",
    "tokenize",
    "to_unit",
    "request_keys",
    "encode_text",
    "encode_null",
    "text_nodes",
    "start_denoise",
    "decode_image",
    "decode_video",
    "loop_config",
    "bind_text",
    "text_to_video_program",
    "TextFlow",
    "TEXT_FLOW",
]

Slots = dict[str, Any]


# ------------------------------------------------------------------------------------------ cards
def vocab_size(vocabulary: Sequence[str]) -> int:
    """The number of ids of a word tokenizer over ``vocabulary``: its words plus ``<pad>`` and ``<unk>``.

    Args:
      vocabulary: the words.

    Returns:
      The vocabulary size, an int.
    """
    from jaxpipe.nn import Tokenizer

    return Tokenizer(tuple(vocabulary)).vocab_size


def fill(config, **defaults: Callable[[], Any]) -> None:
    """Sets each field of the frozen ``config`` that is ``None`` to ``defaults[name]()``, in place.

    Called in ``__post_init__`` for the sizes a config derives from its vocabulary when they are not given.

    Args:
      config: a frozen dataclass instance.
      **defaults: field name -> a zero-argument factory of its default.
    """
    for name, make in defaults.items():
        if getattr(config, name) is None:
            object.__setattr__(config, name, make())


@dataclasses.dataclass(frozen=True)
class TextGeneratorConfig:
    """What every toy text-conditioned generator config holds.

    Families add their loops' settings; ``__post_init__`` checks that the parts fit together.

    Attributes:
      vocabulary: the card's words (required, keyword-only: a card speaks a world's words, e.g.
        ``jaxpipe.digits.VOCABULARY``).
      image_size: the side of a generated image in pixels.
      text: the text encoder (``None``: the default encoder for the vocabulary).
      dit: the denoiser.
      vae: the autoencoder.

    Raises:
      ValueError: if the vocabulary is empty or the parts do not fit (text width, latent channels,
        vocabulary size, an ``image_size`` not divisible by ``vae.downsample·dit.patch_size``).
    """

    vocabulary: tuple[str, ...] = dataclasses.field(kw_only=True)
    image_size: int = 16
    text: TextEncoderConfig | None = None
    dit: DiTConfig = DiTConfig()
    vae: AutoencoderConfig = AutoencoderConfig()

    def __post_init__(self):
        object.__setattr__(self, "vocabulary", tuple(self.vocabulary))
        validate.rule(bool(self.vocabulary), "a text-conditioned card needs a vocabulary (its world's words)")
        fill(self, text=lambda: TextEncoderConfig(vocab_size=vocab_size(self.vocabulary)))
        validate.rule(
            self.dit.text_dim == self.text.dim,
            f"dit.text_dim ({self.dit.text_dim}) must equal text.dim ({self.text.dim})",
        )
        validate.rule(
            self.dit.latent_channels == self.vae.latent_channels,
            f"dit.latent_channels ({self.dit.latent_channels}) must equal vae.latent_channels ({self.vae.latent_channels})",
        )
        validate.rule(
            self.text.vocab_size == vocab_size(self.vocabulary),
            f"text.vocab_size must be {vocab_size(self.vocabulary)} for this vocabulary (got {self.text.vocab_size})",
        )
        factor = self.vae.downsample * self.dit.patch_size
        validate.rule(
            not self.image_size % factor,
            f"image_size ({self.image_size}) must be divisible by vae.downsample·dit.patch_size ({factor})",
        )


@dataclasses.dataclass(frozen=True)
class VideoGeneratorConfig(TextGeneratorConfig):
    """A ``TextGeneratorConfig`` of a video card.

    A text-to-video DiT takes no first frame unless the family says so (``FRAME_COND``).

    Attributes:
      frames: frames per video (an int, at least ``MIN_FRAMES``).
      MIN_FRAMES: the fewest frames the family accepts.
      FRAME_COND: whether the family's DiT conditions on a first frame (``dit.frame_cond``).

    Raises:
      ValueError: on a bad ``frames`` or a DiT whose ``frame_cond`` differs from ``FRAME_COND``.
    """

    frames: int = 8

    MIN_FRAMES = 1
    FRAME_COND = False

    def __post_init__(self):
        super().__post_init__()
        validate.rule(
            not (isinstance(self.frames, bool) or not isinstance(self.frames, int) or self.frames < self.MIN_FRAMES),
            f"frames must be an int >= {self.MIN_FRAMES} (got {self.frames!r})",
        )
        validate.rule(
            self.dit.frame_cond == self.FRAME_COND,
            "an image-to-video card needs a DiT with first-frame conditioning (dit.frame_cond=True)"
            if self.FRAME_COND
            else "this card generates every frame from text: its DiT takes no first frame (dit.frame_cond=False)",
        )

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T, h, w, C)``."""
        side = self.image_size // self.vae.downsample
        return (self.frames, side, side, self.vae.latent_channels)


def build(
    config,
    *,
    seed: int,
    model_id: str,
    family: str,
    loop_id: str,
    capability: str,
    denoiser: type | None = None,
    kind: str = "denoise",
    parity: tuple[str, ...] = ("C0", "C1", "C2", "C3"),
) -> Card:
    """A text-conditioned generator card from a family config.

    The components (``text_encoder``, ``transformer``, ``vae``) are built in that order from one
    ``nnx.Rngs(seed)``; the card has one loop of ``kind`` on ``transformer`` with the config's
    ``latent_shape`` and ``sampling``.

    Args:
      config: a family config (a ``TextGeneratorConfig`` with ``latent_shape`` and ``sampling``).
      seed: the initialisation seed (same seed, same weights).
      model_id: the card's id.
      family: the family's name.
      loop_id: the id of the card's loop.
      capability: the card's one capability (e.g. ``"t2i"``).
      denoiser: the network class built from ``config.dit`` (default ``DiT``; ``CausalDiT`` for
        ``wan-causal``, whose same construction order gives the same initial weights for a seed).
      kind: the loop's kind.
      parity: the parity checks the card claims.

    Returns:
      The ``Card``.
    """
    from jaxpipe.nn import Autoencoder, DiT, TextEncoder, Tokenizer

    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": TextEncoder(config.text, rngs=rngs),
        "transformer": (DiT if denoiser is None else denoiser)(config.dit, rngs=rngs),
        "vae": Autoencoder(config.vae, rngs=rngs),
    }
    spec = CardSpec(
        model_id=model_id,
        family=family,
        loops=(LoopSpec(loop_id, kind, ("transformer",), config.sampling, latent_shape=config.latent_shape),),
        recipe=(loop_id,),
        parity=parity,
        capabilities=(capability,),
        tokenizer=Tokenizer(config.vocabulary),
        config=config,
    )
    return Card(components, spec)


def tokenize(card: Card, prompts: Sequence[str]) -> jax.Array:
    """Token ids of ``prompts`` with the card's tokenizer, padded to the text encoder's ``max_len``.

    Args:
      card: a text-conditioned card.
      prompts: B prompt strings.

    Returns:
      ``(B, max_len)`` int token ids.

    Raises:
      ValueError: on a word outside the card's vocabulary (listing the vocabulary).
    """
    return jnp.asarray(card.spec.tokenizer.encode(list(prompts), card["text_encoder"].cfg.max_len))


def to_unit(images: jax.Array) -> jax.Array:
    """Decoder output in [-1, 1] -> images in [0, 1] (clipped).

    Args:
      images: an array of any shape, nominally in [-1, 1].

    Returns:
      ``(images + 1) / 2`` clipped to [0, 1], same shape.
    """
    return jnp.clip((images + 1.0) / 2.0, 0.0, 1.0)


def request_keys(seeds: Sequence[int]) -> jax.Array:
    """One typed PRNG key ``jax.random.key(seed)`` per request seed.

    Args:
      seeds: B ints in ``[0, 2**32)``.

    Returns:
      ``(B,)`` typed PRNG keys.
    """
    return jax.vmap(jax.random.key)(jnp.asarray(np.asarray(seeds, np.uint32)))


# ------------------------------------------------------------------------------------------ program nodes
def encode_text(card: Card, reads: Mapping[str, Any]) -> Slots:
    """The prompt's text conditioning, from the card's ``text_encoder``.

    Args:
      card: a text-conditioned card.
      reads: ``{"ids": (B, L) int}``.

    Returns:
      ``{"context": (B, L, D), "context_mask": (B, L) bool}`` (the mask is true on non-pad ids).
    """
    ids = reads["ids"]
    return {"context": card["text_encoder"](ids), "context_mask": ids != 0}


def encode_null(card: Card, reads: Mapping[str, Any]) -> Slots:
    """The unconditional text of CFG, encoded from the empty prompt.

    Args:
      card: a text-conditioned card.
      reads: ``{"null_ids": (B, L) int}`` (all pad).

    Returns:
      ``{"uncond_context": (B, L, D), "uncond_mask": (B, L) bool}``.
    """
    ids = reads["null_ids"]
    return {"uncond_context": card["text_encoder"](ids), "uncond_mask": ids != 0}


def text_nodes() -> tuple[ComponentNode, ComponentNode]:
    """The two cached text-encoding nodes (prompt and empty prompt) of a text-conditioned card."""
    return (
        ComponentNode(
            "encode_text", encode_text, ("ids",), ("context", "context_mask"), component="text_encoder", cached=True
        ),
        ComponentNode(
            "encode_null",
            encode_null,
            ("null_ids",),
            ("uncond_context", "uncond_mask"),
            component="text_encoder",
            cached=True,
        ),
    )


DENOISE_READS = ("key", "context", "context_mask", "uncond_context", "uncond_mask")
"""What ``start_denoise`` reads (plus ``first_frame`` for image-to-video)."""


def start_denoise(stream: int | None = None) -> Callable:
    """The start of a generator's denoise loop, as a ``LoopNode`` calls it: ``start(card, loop, reads, config)``.

    Reads the per-request ``key`` ``(B,)`` (used as is, or ``fold_in(key, stream)`` when the card's
    other loops draw from the same key), the text conditioning (the unconditional half only when
    the config guides) and an optional ``first_frame`` latent; starts from noise of the loop's
    ``latent_shape``.

    Args:
      stream: the ``fold_in`` stream of this loop's keys (``None``: use the request keys as they are).

    Returns:
      ``start(card, loop, reads, config) -> DenoiseState``.
    """

    def start(
        card: Card, loop: LoopSpec, reads: Mapping[str, Any], config: denoise.DenoiseConfig
    ) -> denoise.DenoiseState:
        keys = reads["key"]
        if stream is not None:
            keys = jax.vmap(lambda k: jax.random.fold_in(k, stream))(keys)
        first = reads.get("first_frame")
        cond = DiTCond(reads["context"], reads["context_mask"], first)
        uncond = DiTCond(reads["uncond_context"], reads["uncond_mask"], first) if config.guide.needs_uncond else None
        return denoise.init(keys, loop.latent_shape, cond, config, uncond)

    return start


def decode_image(card: Card, reads: Mapping[str, Any]) -> Slots:
    """Decodes the one-frame latents to images with the card's ``vae``.

    Args:
      card: a card with a ``vae``.
      reads: ``{"latents": (B, 1, h, w, C)}``.

    Returns:
      ``{"image": (B, H, W, C)}`` in [0, 1].
    """
    return {"image": to_unit(card["vae"].decode(reads["latents"][:, 0]))}


def decode_video(card: Card, reads: Mapping[str, Any]) -> Slots:
    """Decodes every frame's latents with the card's ``vae``.

    Args:
      card: a card with a ``vae``.
      reads: ``{"latents": (B, T, h, w, C)}``.

    Returns:
      ``{"video": (B, T, H, W, C)}`` in [0, 1].
    """
    return {"video": to_unit(card["vae"].decode_video(reads["latents"]))}


def loop_config(card: Card, loop_id: str, request: Request):
    """The card's settings for ``loop_id`` with the request's ``num_steps`` / ``guidance``.

    Args:
      card: the card.
      loop_id: one of its denoise loops.
      request: the request (a ``None`` field keeps the card's default).

    Returns:
      The loop's config (a ``DenoiseConfig``), replaced where the request overrides it.
    """
    changes = {}
    if request.num_steps is not None:
        changes["num_steps"] = request.num_steps
    if request.guidance is not None:
        changes["guidance"] = request.guidance
    base = card.spec.loop(loop_id).config
    return dataclasses.replace(base, **changes) if changes else base


def bind_text(card: Card, request: Request, loop_id: str) -> Bound:
    """Bind the text part of a request: ``ids``/``null_ids`` ``(1, L)`` int32, ``key`` ``(1,)`` (the request
    seed's PRNG key), the loop's settings (card defaults overridden by the request) and the
    ``"text"`` artifact.

    Args:
      card: a text-conditioned card.
      request: the request (``prompt`` required).
      loop_id: the denoise loop whose settings the request overrides.

    Returns:
      The ``Bound`` slots, settings and artifacts.

    Raises:
      ValueError: on a missing prompt or a word outside the card's vocabulary (listing it).
    """
    if request.prompt is None:
        raise ValueError(f"{card.model_id!r} renders a text prompt: the request needs prompt=...")
    ids = card.spec.tokenizer.encode([request.prompt], card["text_encoder"].cfg.max_len)
    config = loop_config(card, loop_id, request)
    slots = {"ids": ids, "null_ids": np.zeros_like(ids), "key": request_keys([request.seed])}
    return Bound(slots=slots, settings=settings(**{loop_id: config}), artifacts={"text": request.prompt})


def text_to_video_program(model_id: str, loop_id: str) -> Program:
    """The program of a text-to-video card with one denoise loop (``wan-t2v``, ``wan22-moe``): encode text
    (cached) -> ``loop_id`` -> decode every frame.

    Request: ``prompt`` (required), ``seed``, ``num_steps``, ``guidance``; no image. Artifacts:
    ``"video"`` ``(T, H, W, C)`` in [0, 1], ``"latents"`` ``(T, h, w, C)`` and ``"text"`` (the prompt).

    Args:
      model_id: the program's name (the card's id).
      loop_id: the card's denoise loop.

    Returns:
      The ``Program``; its ``bind`` raises ``ValueError`` on a request with an image.
    """

    def bind(card: Card, request: Request) -> Bound:
        if request.image is not None:
            raise ValueError(
                f"{card.model_id!r} renders text to a video and takes no image (got image={request.image.shape}); "
                "animate a first frame with 'wan-i2v'"
            )
        return bind_text(card, request, loop_id)

    return Program(
        name=model_id,
        inputs=("ids", "null_ids", "key"),
        nodes=(
            *text_nodes(),
            LoopNode(loop_id, start_denoise(), reads=DENOISE_READS, writes=("latents",)),
            ComponentNode("decode", decode_video, reads=("latents",), writes=("video",), component="vae"),
        ),
        outputs=(("video", "video"), ("latents", "latents")),
        bind=bind,
    )
