"""The ``flux-t2i`` card family: text encoder + DiT + autoencoder, text -> image.

One loop, ``t2i_denoise``, drives the DiT; encoding the prompt and decoding the latents are
component steps around it; ``generate`` runs all three as one jitted function. The card's
program (``jaxpipe.programs.flux_t2i``) composes the same pieces for the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax

from jaxpipe.card import Card
from jaxpipe.cards import common
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.nn import AutoencoderConfig, DiTConfig, TextEncoderConfig

MODEL_ID = "flux-t2i"
LOOP_ID = "t2i_denoise"


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``flux-t2i`` card; the defaults are CPU-test sized."""

    image_size: int = 16
    text: TextEncoderConfig = TextEncoderConfig(vocab_size=len(VOCABULARY) + 2)
    dit: DiTConfig = DiTConfig()
    vae: AutoencoderConfig = AutoencoderConfig()
    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()
    vocabulary: tuple[str, ...] = VOCABULARY

    def __post_init__(self):
        common.check_generator_config(self)

    @classmethod
    def bundled(cls) -> "Config":
        """The bundled pretrained card: a wider, deeper DiT and text encoder than the test default, served
        with classifier-free guidance 2 (measured: 93% prompted-digit accuracy vs 69% at guidance 1)."""
        return cls(
            text=dataclasses.replace(cls.text, dim=64),
            dit=DiTConfig(dim=96, depth=4, heads=4, text_dim=64),
            sampling=denoise.DenoiseConfig(guidance=2.0),
        )

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T=1, h, w, C)``."""
        side = self.image_size // self.vae.downsample
        return (1, side, side, self.vae.latent_channels)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``flux-t2i`` card with freshly initialised components (deterministic in ``seed``)."""
    return common.build_generator(
        config, seed=seed, model_id=model_id, family="flux_t2i", loop_id=LOOP_ID, capability="t2i"
    )


def generate_from_ids(
    card: Card, ids: jax.Array, keys: jax.Array, sampling: denoise.DenoiseConfig
) -> jax.Array:
    """Images ``(B, H, W, C)`` in [0, 1] for token ids ``(B, L)`` and per-request keys ``(B,)``.

    Pure and jittable with ``sampling`` static: encode -> denoise (fused scan) -> decode.
    """
    cond = common.encode_prompts(card, ids, with_uncond=sampling.guidance != 1.0)
    state = denoise.init(keys, card.spec.config.latent_shape, cond, sampling)
    state, _ = denoise.run(card["transformer"], state, sampling)
    return common.to_unit(card["vae"].decode(state.x[:, 0]))


_generate_jit = jax.jit(generate_from_ids, static_argnames="sampling")


def generate(
    card: Card,
    prompts: str | Sequence[str],
    *,
    seed: int | Sequence[int] = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
) -> jax.Array:
    """Render ``prompts`` with ``card``: images ``(B, H, W, C)`` in [0, 1].

    ``seed`` is one int for the batch (request b uses ``seed + b``) or one per prompt;
    ``num_steps`` / ``guidance`` default to the card's ``t2i_denoise`` settings.
    """
    prompts = common.as_prompts(prompts)
    ids = common.tokenize(card, prompts)
    keys = common.request_keys(seed, len(prompts))
    return _generate_jit(card, ids, keys, common.sampling(card, LOOP_ID, num_steps, guidance))
