"""Pieces every text-conditioned generator card shares: tokenizing, text conditioning, seeds, settings."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from flax import nnx

from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.loops import denoise


def check_generator_config(config) -> None:
    """Check that a generator family config's text encoder, DiT, autoencoder and vocabulary fit together."""
    from jaxpipe.nn import Tokenizer

    if config.dit.text_dim != config.text.dim:
        raise ValueError(f"dit.text_dim ({config.dit.text_dim}) must equal text.dim ({config.text.dim})")
    if config.dit.latent_channels != config.vae.latent_channels:
        raise ValueError(
            f"dit.latent_channels ({config.dit.latent_channels}) must equal vae.latent_channels ({config.vae.latent_channels})"
        )
    vocab_size = Tokenizer(config.vocabulary).vocab_size
    if config.text.vocab_size != vocab_size:
        raise ValueError(f"text.vocab_size must be {vocab_size} for this vocabulary (got {config.text.vocab_size})")
    factor = config.vae.downsample * config.dit.patch_size
    if config.image_size % factor:
        raise ValueError(f"image_size ({config.image_size}) must be divisible by vae.downsample·dit.patch_size ({factor})")


def build_generator(config, *, seed: int, model_id: str, family: str, loop_id: str, capability: str) -> Card:
    """A text-conditioned generator card (text encoder, DiT, autoencoder; one denoise loop) from a family config."""
    from jaxpipe.nn import Autoencoder, DiT, TextEncoder, Tokenizer

    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": TextEncoder(config.text, rngs=rngs),
        "transformer": DiT(config.dit, rngs=rngs),
        "vae": Autoencoder(config.vae, rngs=rngs),
    }
    spec = CardSpec(
        model_id=model_id,
        family=family,
        loops=(LoopSpec(loop_id, "denoise", ("transformer",), config.sampling),),
        recipe=(loop_id,),
        parity=("C0", "C1", "C2"),
        capabilities=(capability,),
        tokenizer=Tokenizer(config.vocabulary),
        config=config,
    )
    return Card(components, spec)


def as_prompts(prompts: str | Sequence[str]) -> list[str]:
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise ValueError("prompts must name at least one prompt")
    return prompts


def tokenize(card: Card, prompts: Sequence[str]) -> jax.Array:
    """Token ids ``(B, max_len)`` with the card's tokenizer (ValueError listing the vocabulary on unknown words)."""
    return jnp.asarray(card.spec.tokenizer.encode(list(prompts), card["text_encoder"].cfg.max_len))


def request_keys(seed: int | Sequence[int], n: int) -> jax.Array:
    """``(n,)`` PRNG keys: one int seeds request ``b`` with ``seed + b``; a sequence gives one seed each."""
    seeds = [seed + i for i in range(n)] if isinstance(seed, int) else list(seed)
    if len(seeds) != n:
        raise ValueError(f"seed: got {len(seeds)} seeds for {n} prompts")
    return jnp.stack([jax.random.key(s) for s in seeds])


def encode_prompts(card: Card, ids: jax.Array, *, with_uncond: bool = False, first_frame=None) -> denoise.Conditioning:
    """Text conditioning for token ids ``(B, L)``; the empty prompt is the unconditional text."""
    encoder = card["text_encoder"]
    mask = ids != 0
    if not with_uncond:
        return denoise.Conditioning(context=encoder(ids), context_mask=mask, first_frame=first_frame)
    null = jnp.zeros_like(ids)
    return denoise.Conditioning(
        context=encoder(ids), context_mask=mask, uncond_context=encoder(null), uncond_mask=null != 0, first_frame=first_frame
    )


def sampling(card: Card, loop_id: str, num_steps: int | None = None, guidance: float | None = None) -> denoise.DenoiseConfig:
    """The loop's sampling settings with per-request overrides (``None`` keeps the card default)."""
    base = card.spec.loop(loop_id).config
    changes = {}
    if num_steps is not None:
        changes["num_steps"] = num_steps
    if guidance is not None:
        changes["guidance"] = float(guidance)
    return base.replace(**changes) if changes else base


def to_unit(images: jax.Array) -> jax.Array:
    """Decoder output in [-1, 1] -> images in [0, 1] (clipped)."""
    return jnp.clip((images + 1.0) / 2.0, 0.0, 1.0)
