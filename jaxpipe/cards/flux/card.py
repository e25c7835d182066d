"""The ``flux`` family: the real FLUX.1 pipeline (CLIP-L + T5-XXL text encoders, the FLUX
transformer, the FLUX autoencoder) as a card, built from sizes or loaded from a diffusers folder.

Components carry the pipeline's own names (``text_encoder`` = CLIP, ``text_encoder_2`` = T5,
``transformer``, ``vae``). One loop, ``t2i_denoise``, drives the transformer on channels-last
latents ``(h, w, 16)`` with ``h = 2·(height // 16)``; FLUX.1-dev's guidance is distilled into the
transformer (an embedded scale, one forward per step), so the loop's CFG stays 1 and the request's
``guidance`` sets the embedded scale (``Sampling.embedded_guidance``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards.diffusers_pipeline import FlowSchedule, load_components, read_pipeline
from jaxpipe.loops import denoise
from jaxpipe.nn import autoencoder_kl, clip, flux, t5
from jaxpipe.nn.tokenizer import TokenizerSpec

__all__ = ["LOOP_ID", "PIPELINES", "Sampling", "Tokenizers", "Config", "build", "load_pipeline"]

LOOP_ID = "t2i_denoise"
PIPELINES = ("FluxPipeline",)
"""The diffusers pipeline classes (``model_index.json``'s ``_class_name``) this family loads."""


@dataclasses.dataclass(frozen=True)
class Sampling(denoise.DenoiseConfig):
    """The denoise loop's settings plus FLUX's embedded (distilled) guidance scale.

    Attributes:
      embedded_guidance: the scale the transformer embeds (``None`` for a transformer without a
        guidance embedding, e.g. FLUX.1-schnell).
    """

    embedded_guidance: float | None = 3.5


@dataclasses.dataclass(frozen=True)
class Tokenizers:
    """The two tokenizers of a FLUX card and their lengths: CLIP ids then T5 ids, concatenated into one
    ``ids`` row ``(clip_length + t5_length,)`` so a FLUX program has the one text input every
    text-prompted program has.

    Attributes:
      clip: the CLIP tokenizer (``None``: the card has no ``tokenizer.json``).
      t5: the T5 tokenizer (``None`` likewise).
      clip_length: CLIP ids per prompt.
      t5_length: T5 ids per prompt.
    """

    clip: TokenizerSpec | None
    t5: TokenizerSpec | None
    clip_length: int
    t5_length: int

    def encode(self, prompts: list[str]) -> np.ndarray:
        """The CLIP ids then the T5 ids of ``prompts``, one row each.

        Args:
          prompts: B prompt strings.

        Returns:
          ``(B, clip_length + t5_length)`` int32 ids.

        Raises:
          ValueError: if either tokenizer is missing.
        """
        if self.clip is None or self.t5 is None:
            raise ValueError(
                "this FLUX card has no tokenizer.json files: pass token ids directly (jaxpipe.cards.flux.ids)"
            )
        clip_ids, _ = self.clip.load()(prompts, self.clip_length)
        t5_ids, _ = self.t5.load()(prompts, self.t5_length)
        return np.concatenate([np.asarray(clip_ids, np.int32), np.asarray(t5_ids, np.int32)], axis=1)


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``flux`` card.

    The defaults are a tiny random test card; ``dev()`` and ``schnell()`` are the published sizes;
    ``from_diffusers`` reads a pipeline folder.

    Attributes:
      transformer: the FLUX transformer.
      vae: the FLUX autoencoder.
      text_encoder: CLIP (its pooled embedding conditions the transformer).
      text_encoder_2: T5 (its sequence is the transformer's context).
      height: image height in pixels.
      width: image width in pixels.
      max_sequence_length: T5 ids per prompt.
      clip_length: CLIP ids per prompt (at most CLIP's ``max_position_embeddings``).
      num_steps: the default number of denoise steps.
      guidance: the default embedded guidance scale; a number exactly when the transformer embeds
        guidance (FLUX.1-dev), ``None`` otherwise (schnell).
      schedule: the scheduler's shift settings.
      tokenizer: the CLIP tokenizer, if the card has one.
      tokenizer_2: the T5 tokenizer, if the card has one.

    Raises:
      ValueError: if the components' sizes do not fit together, the image is smaller than
        ``2·vae_scale``, ``clip_length`` is too long, or ``guidance`` disagrees with the transformer.
    """

    transformer: flux.FluxConfig = flux.FluxConfig.tiny()
    vae: autoencoder_kl.AutoencoderKLConfig = autoencoder_kl.AutoencoderKLConfig.tiny()
    text_encoder: clip.CLIPTextEncoderConfig = clip.CLIPTextEncoderConfig.tiny()
    text_encoder_2: t5.T5EncoderConfig = t5.T5EncoderConfig.tiny()
    height: int = 16
    width: int = 16
    max_sequence_length: int = 16
    clip_length: int = 16
    num_steps: int = 4
    guidance: float | None = 3.5
    schedule: FlowSchedule = FlowSchedule()
    tokenizer: TokenizerSpec | None = None
    tokenizer_2: TokenizerSpec | None = None

    def __post_init__(self):
        tf = self.transformer
        validate.rule(
            tf.joint_attention_dim == self.text_encoder_2.d_model,
            f"transformer.joint_attention_dim ({tf.joint_attention_dim}) must equal text_encoder_2.d_model ({self.text_encoder_2.d_model})",
        )
        validate.rule(
            tf.pooled_projection_dim == self.text_encoder.hidden_size,
            f"transformer.pooled_projection_dim ({tf.pooled_projection_dim}) must equal text_encoder.hidden_size ({self.text_encoder.hidden_size})",
        )
        validate.rule(
            tf.in_channels == 4 * self.vae.latent_channels,
            f"transformer.in_channels ({tf.in_channels}) must be 4 × vae.latent_channels ({self.vae.latent_channels}): FLUX packs 2×2 latent patches",
        )
        factor = 2 * self.vae_scale
        validate.rule(
            self.height >= factor and self.width >= factor,
            f"height and width must be at least {factor} (got {self.height}×{self.width})",
        )
        validate.rule(
            self.clip_length <= self.text_encoder.max_position_embeddings,
            f"clip_length ({self.clip_length}) exceeds CLIP's max_position_embeddings ({self.text_encoder.max_position_embeddings})",
        )
        validate.rule(
            (self.guidance is None) != tf.guidance_embeds,
            "guidance must be a number exactly when the transformer embeds guidance (FLUX.1-dev), None otherwise (schnell)",
        )

    @property
    def vae_scale(self) -> int:
        """The autoencoder's downsampling factor, ``2 ** (len(vae.block_out_channels) - 1)``."""
        return 2 ** (len(self.vae.block_out_channels) - 1)

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """Per-request latent shape ``(h, w, C)``: FLUX rounds the image down to a multiple of 2·vae_scale."""
        factor = 2 * self.vae_scale
        return (2 * (self.height // factor), 2 * (self.width // factor), self.vae.latent_channels)

    @property
    def sampling(self) -> Sampling:
        """The loop's default ``Sampling``: ``num_steps``, the schedule's shift for this image's token count,
        and ``guidance`` as the embedded scale."""
        h, w, _ = self.latent_shape
        return Sampling(
            num_steps=self.num_steps, shift=self.schedule.flow_shift(h * w // 4), embedded_guidance=self.guidance
        )

    @property
    def tokenizers(self) -> Tokenizers:
        """The card's ``Tokenizers`` (CLIP ``clip_length`` ids then T5 ``max_sequence_length`` ids)."""
        return Tokenizers(self.tokenizer, self.tokenizer_2, self.clip_length, self.max_sequence_length)

    @classmethod
    def tiny(cls, **overrides) -> Config:
        """The tiny random test card (the defaults), with ``overrides`` of any field."""
        return cls(**overrides)

    @classmethod
    def dev(cls, **overrides) -> Config:
        """FLUX.1-dev at 1024×1024, 28 steps, embedded guidance 3.5."""
        sizes = dict(
            transformer=flux.FluxConfig.dev(),
            vae=autoencoder_kl.AutoencoderKLConfig.flux(),
            text_encoder=clip.CLIPTextEncoderConfig.vit_l14(),
            text_encoder_2=t5.T5EncoderConfig.t5_xxl(),
            height=1024,
            width=1024,
            max_sequence_length=512,
            clip_length=77,
            num_steps=28,
            guidance=3.5,
        )
        return cls(**{**sizes, **overrides})

    @classmethod
    def schnell(cls, **overrides) -> Config:
        """FLUX.1-schnell: no guidance embedding, 4 steps, 256 T5 tokens, a fixed shift of 1."""
        return cls.dev(
            **{
                "transformer": flux.FluxConfig.schnell(),
                "max_sequence_length": 256,
                "num_steps": 4,
                "guidance": None,
                "schedule": FlowSchedule(shift=1.0, dynamic=False),
                **overrides,
            }
        )

    @classmethod
    def from_diffusers(cls, path: str | Path, **overrides) -> Config:
        """The config of a diffusers ``FluxPipeline`` folder (sizes from each component's ``config.json``,
        the schedule from ``scheduler/``, the tokenizers when their folders are there).

        Args:
          path: a ``FluxPipeline`` folder.
          **overrides: ``Config`` fields to set instead.

        Returns:
          The ``Config`` (1024×1024; dev's 28 steps, guidance 3.5 and 512 T5 ids, or schnell's 4 steps,
          no guidance and 256 T5 ids).

        Raises:
          ValueError: if the folder holds another pipeline.
          FileNotFoundError: if a component folder is missing.
        """
        from jaxpipe.nn.hf import read_config

        folder = read_pipeline(path)
        if folder.pipeline not in PIPELINES:
            raise ValueError(f"{path}: a {folder.pipeline or 'non-FLUX'} folder, not one of {PIPELINES}")
        transformer = flux.FluxConfig.from_json(read_config(folder.component("transformer")))
        tokenizers = {}
        for name in ("tokenizer", "tokenizer_2"):
            try:
                tokenizers[name] = TokenizerSpec.from_folder(folder.component(name))
            except FileNotFoundError:
                tokenizers[name] = None
        fields = dict(
            transformer=transformer,
            vae=autoencoder_kl.AutoencoderKLConfig.from_json(read_config(folder.component("vae"))),
            text_encoder=clip.CLIPTextEncoderConfig.from_json(read_config(folder.component("text_encoder"))),
            text_encoder_2=t5.T5EncoderConfig.from_json(read_config(folder.component("text_encoder_2"))),
            schedule=folder.schedule(),
            guidance=3.5 if transformer.guidance_embeds else None,
            max_sequence_length=512 if transformer.guidance_embeds else 256,
            height=1024,
            width=1024,
            num_steps=28 if transformer.guidance_embeds else 4,
            **tokenizers,
        )
        fields["clip_length"] = min(77, fields["text_encoder"].max_position_embeddings)  # FluxPipeline's CLIP length
        return cls(**{**fields, **overrides})


def _spec(config: Config, model_id: str) -> CardSpec:
    return CardSpec(
        model_id=model_id,
        family="flux",
        loops=(LoopSpec(LOOP_ID, "denoise", ("transformer",), config.sampling, latent_shape=config.latent_shape),),
        recipe=(LOOP_ID,),
        parity=("C0", "C1", "C2", "C3"),
        capabilities=("t2i",),
        tokenizer=config.tokenizers,
        config=config,
    )


def build(config: Config = Config(), *, seed: int = 0, model_id: str = "flux") -> Card:
    """A ``flux`` card with random weights (deterministic in ``seed``); works under ``nnx.eval_shape``.

    Args:
      config: the card's config (default: the tiny test card).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``Card`` (components ``text_encoder``, ``text_encoder_2``, ``transformer``, ``vae``).
    """
    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": clip.CLIPTextEncoder(config.text_encoder, rngs=rngs),
        "text_encoder_2": t5.T5Encoder(config.text_encoder_2, rngs=rngs),
        "transformer": flux.FluxTransformer(config.transformer, rngs=rngs),
        "vae": autoencoder_kl.AutoencoderKL(config.vae, rngs=rngs),
    }
    return Card(components, _spec(config, model_id))


def load_pipeline(path: str | Path, *, dtype: str = "float32", model_id: str | None = None, **overrides) -> Card:
    """A ``flux`` card with the weights of a diffusers ``FluxPipeline`` folder (``FLUX.1-dev/``).

    Args:
      path: the pipeline folder.
      dtype: the networks' parameter and activation dtype (``"bfloat16"`` to serve the 12 B transformer
        on one accelerator); the sampler math stays float32.
      model_id: the card's id (default: the folder's name).
      **overrides: ``Config`` fields (``height``, ``width``, ``num_steps`` ...).

    Returns:
      The loaded ``Card``.

    Raises:
      ValueError: if the folder is not a ``FluxPipeline`` or its scheduler is unsupported.
      FileNotFoundError: if a component is missing.
      KeyMappingError: if a component's weights do not fit its network.
    """
    path = Path(path)
    config = Config.from_diffusers(path, **overrides)
    components, configs = load_components(
        read_pipeline(path),
        {
            "text_encoder": clip.load,
            "text_encoder_2": t5.load,
            "transformer": flux.load,
            "vae": autoencoder_kl.load,
        },
        dtype,
    )
    config = dataclasses.replace(config, **configs)
    return Card(components, _spec(config, model_id or path.name))
