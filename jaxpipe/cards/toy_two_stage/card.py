"""The ``ltx2-two-stage`` card: text -> video in two denoise stages on ONE DiT (LTX-2's pipeline shape).

Components: ``text_encoder``, ``transformer`` (one DiT, bound by both loops), ``upsampler`` (a
learned 2× latent upsampler) and ``vae``. Loops:

* ``base_denoise``: from pure noise at half the latent resolution, latents ``(T, h/2, w/2, C)``,
  on a short schedule (guided by CFG and, by default, spatio-temporal guidance);
* ``refine_denoise``: at full resolution ``(T, h, w, C)``, starting from the upsampled base
  latents re-noised to σ₀ = ``refine_sampling.start_sigma`` (``σ₀·ε + (1-σ₀)·up``), for a few steps
  of the schedule ``σ₀ · flow_sigmas(n, shift)``.

The base stage's training data are the full-resolution video latents average-pooled 2×2
(``pool_latents``), so the upsampler learns pooled -> full latents.
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.loops import denoise
from jaxpipe.nn import LatentUpsamplerConfig

__all__ = ["MODEL_ID", "BASE_LOOP", "REFINE_LOOP", "RATIO", "Config", "pool_latents", "build"]

MODEL_ID = "toy-two-stage"
BASE_LOOP = "base_denoise"
REFINE_LOOP = "refine_denoise"
RATIO = 2
"""Full latent resolution / base latent resolution (per spatial side): the upsampler's scale."""


@dataclasses.dataclass(frozen=True)
class Config(generator.VideoGeneratorConfig):
    """Everything that shapes a two-stage card (``vocabulary`` required); the defaults are CPU-test sized.

    ``base_sampling`` / ``refine_sampling``: the two loops' default settings (a request's
    ``num_steps`` sets the base stage's steps, ``inputs={"refine_steps": n}`` the refine stage's,
    and its ``guidance`` the CFG scale of both).

    Attributes:
      upsampler: the 2× latent upsampler (``scale`` must be ``RATIO``).
      base_sampling: the ``base_denoise`` loop's settings (``start_sigma`` 1: from pure noise).
      refine_sampling: the ``refine_denoise`` loop's settings (``start_sigma`` σ₀ in (0, 1)).

    Raises:
      ValueError: if the upsampler's scale or channels do not fit, the full latent side is not divisible
        by ``RATIO·dit.patch_size``, a loop's ``stg_blocks`` name blocks the DiT lacks, or a
        ``start_sigma`` is out of range.
    """

    upsampler: LatentUpsamplerConfig = LatentUpsamplerConfig(width=16, depth=1)
    base_sampling: denoise.DenoiseConfig = denoise.DenoiseConfig(num_steps=6, guidance=2.0, stg=1.0, stg_blocks=(1,))
    refine_sampling: denoise.DenoiseConfig = denoise.DenoiseConfig(num_steps=3, guidance=2.0, start_sigma=0.5)

    def __post_init__(self):
        super().__post_init__()
        validate.rule(
            self.upsampler.scale == RATIO,
            f"upsampler of the wrong scale: upsampler.scale must be {RATIO}, the full/base latent resolution ratio "
            f"(got {self.upsampler.scale})",
        )
        validate.rule(
            self.upsampler.latent_channels == self.vae.latent_channels,
            f"upsampler.latent_channels ({self.upsampler.latent_channels}) must equal vae.latent_channels "
            f"({self.vae.latent_channels})",
        )
        side, factor = self.image_size // self.vae.downsample, RATIO * self.dit.patch_size
        validate.rule(
            side % factor == 0,
            f"latent sizes not divisible: the full latent side ({side} = image_size / vae.downsample) must be divisible "
            f"by {RATIO}·dit.patch_size = {factor}, so the half-resolution base stage still patchifies",
        )
        for name in ("base_sampling", "refine_sampling"):
            config = getattr(self, name)
            validate.rule(
                isinstance(config, denoise.DenoiseConfig),
                f"{name} must be a DenoiseConfig (got {type(config).__name__})",
            )
            beyond = [i for i in config.stg_blocks if i >= self.dit.depth]
            validate.rule(
                not beyond, f"{name}.stg_blocks {beyond} name blocks the DiT lacks (dit.depth={self.dit.depth})"
            )
        validate.rule(
            self.base_sampling.start_sigma == 1.0,
            f"the base stage starts from pure noise: base_sampling.start_sigma must be 1 (got {self.base_sampling.start_sigma})",
        )
        validate.rule(
            0.0 < self.refine_sampling.start_sigma < 1.0,
            f"refine_sampling.start_sigma (σ₀, the noise level the upsampled latents are re-noised to) must be in (0, 1) "
            f"(got {self.refine_sampling.start_sigma})",
        )

    @property
    def base_latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request base-stage latent shape ``(T, h/2, w/2, C)``."""
        t, h, w, c = self.latent_shape
        return (t, h // RATIO, w // RATIO, c)


def pool_latents(latents: jax.Array) -> jax.Array:
    """Full-resolution latents ``(B, T, h, w, C)`` -> base-resolution ``(B, T, h/2, w/2, C)``: 2×2 average pooling
    (what the base stage learns to generate and the upsampler learns to invert).

    Args:
      latents: ``(B, T, h, w, C)``, ``h`` and ``w`` divisible by ``RATIO``.

    Returns:
      ``(B, T, h/2, w/2, C)``.
    """
    b, t, h, w, c = latents.shape
    return latents.reshape(b, t, h // RATIO, RATIO, w // RATIO, RATIO, c).mean(axis=(3, 5))


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A two-stage card with freshly initialised components (deterministic in ``seed``).

    Args:
      config: the card's config.
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``Card``: ``text_encoder``, ``transformer``, ``vae``, ``upsampler``; loops ``base_denoise`` then
      ``refine_denoise``, both on ``transformer``.
    """
    from jaxpipe.nn import Autoencoder, DiT, LatentUpsampler, TextEncoder, Tokenizer

    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": TextEncoder(config.text, rngs=rngs),
        "transformer": DiT(config.dit, rngs=rngs),
        "vae": Autoencoder(config.vae, rngs=rngs),
        "upsampler": LatentUpsampler(config.upsampler, rngs=rngs),
    }
    spec = CardSpec(
        model_id=model_id,
        family="toy_two_stage",
        loops=(
            LoopSpec(
                BASE_LOOP, "denoise", ("transformer",), config.base_sampling, latent_shape=config.base_latent_shape
            ),
            LoopSpec(
                REFINE_LOOP, "denoise", ("transformer",), config.refine_sampling, latent_shape=config.latent_shape
            ),
        ),
        recipe=(BASE_LOOP, REFINE_LOOP),
        parity=("C0", "C1", "C3"),
        capabilities=("t2v",),
        tokenizer=Tokenizer(config.vocabulary),
        config=config,
    )
    return Card(components, spec)
