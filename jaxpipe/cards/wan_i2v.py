"""The ``wan-i2v`` card family: text + a first frame -> a short video.

Components: text encoder, a DiT with first-frame conditioning (``frame_cond=True``) and the
autoencoder. The one loop, ``i2v_denoise``, denoises all frames jointly; the conditioning
image's latent is concatenated to every frame's tokens, with a flag on frame 0 (SVD-style).
``animate`` runs encode -> denoise -> decode as one jitted function; the card's program
(``jaxpipe.programs.wan_i2v``) composes the same pieces for the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp

from jaxpipe.card import Card
from jaxpipe.cards import common
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.nn import AutoencoderConfig, DiTConfig, TextEncoderConfig

MODEL_ID = "wan-i2v"
LOOP_ID = "i2v_denoise"


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``wan-i2v`` card; the defaults are CPU-test sized."""

    image_size: int = 16
    frames: int = 8
    text: TextEncoderConfig = TextEncoderConfig(vocab_size=len(VOCABULARY) + 2)
    dit: DiTConfig = DiTConfig(frame_cond=True)
    vae: AutoencoderConfig = AutoencoderConfig()
    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()
    vocabulary: tuple[str, ...] = VOCABULARY

    def __post_init__(self):
        common.check_generator_config(self)
        if not self.dit.frame_cond:
            raise ValueError("wan-i2v needs a DiT with first-frame conditioning (dit.frame_cond=True)")
        if self.frames < 2:
            raise ValueError(f"frames must be >= 2 (got {self.frames})")

    @classmethod
    def bundled(cls) -> "Config":
        """The bundled pretrained card: the flux-t2i bundled sizes (a tiny DiT moves the digit but loses its shape)."""
        return cls(
            text=dataclasses.replace(cls.text, dim=64),
            dit=DiTConfig(dim=96, depth=4, heads=4, text_dim=64, frame_cond=True),
        )

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T, h, w, C)``."""
        side = self.image_size // self.vae.downsample
        return (self.frames, side, side, self.vae.latent_channels)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``wan-i2v`` card with freshly initialised components (deterministic in ``seed``)."""
    return common.build_generator(
        config, seed=seed, model_id=model_id, family="wan_i2v", loop_id=LOOP_ID, capability="i2v"
    )


def check_images(card: Card, images: jax.Array) -> None:
    """Raise a clear error unless ``images`` is ``(B, S, S, C)`` for the card's image size and channels."""
    cfg = card.spec.config
    expected = (cfg.image_size, cfg.image_size, cfg.vae.image_channels)
    if jnp.ndim(images) != 4 or tuple(jnp.shape(images)[1:]) != expected:
        raise ValueError(f"image must have shape (B, {', '.join(map(str, expected))}) in [0, 1]; got {jnp.shape(images)}")


def animate_from_ids(card: Card, ids: jax.Array, images: jax.Array, keys: jax.Array, sampling: denoise.DenoiseConfig):
    """Videos ``(B, T, H, W, C)`` in [0, 1] from token ids ``(B, L)`` and first frames ``(B, H, W, C)`` in [0, 1].

    Pure and jittable with ``sampling`` static: encode text and frame -> denoise -> decode.
    """
    chex.assert_equal_shape_prefix([ids, images], 1)
    first = card["vae"].encode(images * 2.0 - 1.0)
    cond = common.encode_prompts(card, ids, with_uncond=sampling.guidance != 1.0, first_frame=first)
    state = denoise.init(keys, card.spec.config.latent_shape, cond, sampling)
    state, _ = denoise.run(card["transformer"], state, sampling)
    return common.to_unit(card["vae"].decode_video(state.x))


_animate_jit = jax.jit(animate_from_ids, static_argnames="sampling")


def animate(
    card: Card,
    prompts: str | Sequence[str],
    images: jax.Array,
    *,
    seed: int | Sequence[int] = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
) -> jax.Array:
    """Animate first frames ``images`` ``(B, H, W, C)`` (or one ``(H, W, C)``) in [0, 1] as ``prompts`` say.

    Returns videos ``(B, T, H, W, C)`` in [0, 1]; seeds and settings as in ``flux_t2i.generate``.
    """
    prompts = common.as_prompts(prompts)
    images = jnp.asarray(images, jnp.float32)
    if images.ndim == 3:
        images = images[None]
    check_images(card, images)
    if images.shape[0] != len(prompts):
        raise ValueError(f"image: got {images.shape[0]} images for {len(prompts)} prompts")
    ids = common.tokenize(card, prompts)
    keys = common.request_keys(seed, len(prompts))
    return _animate_jit(card, ids, images, keys, common.sampling(card, LOOP_ID, num_steps, guidance))
