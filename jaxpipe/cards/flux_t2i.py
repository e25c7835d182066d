"""The ``flux-t2i`` card family: text encoder + DiT + autoencoder, text -> image.

One loop, ``t2i_denoise``, drives the DiT; encoding the prompt and decoding the latents are
the program's component steps around it. ``generate`` runs all three as one jitted function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.nn import Autoencoder, AutoencoderConfig, DiT, DiTConfig, TextEncoder, TextEncoderConfig, Tokenizer

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
        if self.dit.text_dim != self.text.dim:
            raise ValueError(f"dit.text_dim ({self.dit.text_dim}) must equal text.dim ({self.text.dim})")
        if self.dit.latent_channels != self.vae.latent_channels:
            raise ValueError(
                f"dit.latent_channels ({self.dit.latent_channels}) must equal vae.latent_channels ({self.vae.latent_channels})"
            )
        if self.text.vocab_size != Tokenizer(self.vocabulary).vocab_size:
            raise ValueError(f"text.vocab_size must be {Tokenizer(self.vocabulary).vocab_size} for this vocabulary")
        if self.image_size % (self.vae.downsample * self.dit.patch_size):
            raise ValueError(
                f"image_size ({self.image_size}) must be divisible by vae.downsample·dit.patch_size "
                f"({self.vae.downsample * self.dit.patch_size})"
            )

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(T=1, h, w, C)``."""
        side = self.image_size // self.vae.downsample
        return (1, side, side, self.vae.latent_channels)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``flux-t2i`` card with freshly initialised components (deterministic in ``seed``)."""
    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": TextEncoder(config.text, rngs=rngs),
        "transformer": DiT(config.dit, rngs=rngs),
        "vae": Autoencoder(config.vae, rngs=rngs),
    }
    spec = CardSpec(
        model_id=model_id,
        family="flux_t2i",
        loops=(LoopSpec(LOOP_ID, "denoise", ("transformer",), config.sampling),),
        recipe=(LOOP_ID,),
        parity=("C0", "C1", "C2"),
        capabilities=("t2i",),
        tokenizer=Tokenizer(config.vocabulary),
        config=config,
    )
    return Card(components, spec)


def encode_prompts(card: Card, ids: jax.Array, *, with_uncond: bool = False) -> denoise.Conditioning:
    """Text conditioning for token ids ``(B, L)``; the empty prompt is the unconditional text."""
    encoder = card["text_encoder"]
    mask = ids != 0
    if not with_uncond:
        return denoise.Conditioning(context=encoder(ids), context_mask=mask)
    null = jnp.zeros_like(ids)
    return denoise.Conditioning(
        context=encoder(ids), context_mask=mask, uncond_context=encoder(null), uncond_mask=null != 0
    )


def _sampling(card: Card, num_steps, guidance) -> denoise.DenoiseConfig:
    base = card.spec.loop(LOOP_ID).config
    changes = {}
    if num_steps is not None:
        changes["num_steps"] = num_steps
    if guidance is not None:
        changes["guidance"] = float(guidance)
    return base.replace(**changes) if changes else base


def generate_from_ids(
    card: Card, ids: jax.Array, keys: jax.Array, sampling: denoise.DenoiseConfig
) -> jax.Array:
    """Images ``(B, H, W, C)`` in [0, 1] for token ids ``(B, L)`` and per-request keys ``(B,)``.

    Pure and jittable with ``sampling`` static: encode -> denoise (fused scan) -> decode.
    """
    cond = encode_prompts(card, ids, with_uncond=sampling.guidance != 1.0)
    state = denoise.init(keys, card.spec.config.latent_shape, cond, sampling)
    state, _ = denoise.run(card["transformer"], state, sampling)
    images = card["vae"].decode(state.x[:, 0])
    return jnp.clip((images + 1.0) / 2.0, 0.0, 1.0)


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
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("prompts must name at least one prompt")
    seeds = [seed + i for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
    if len(seeds) != len(prompts):
        raise ValueError(f"seed: got {len(seeds)} seeds for {len(prompts)} prompts")
    ids = jnp.asarray(card.spec.tokenizer.encode(prompts, card["text_encoder"].cfg.max_len))
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    return _generate_jit(card, ids, keys, _sampling(card, num_steps, guidance))
