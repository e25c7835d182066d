"""The ``wan`` family: the real Wan text-to-video pipeline (UMT5-XXL text encoder, the Wan
transformer, the Wan video autoencoder) as a card, built from sizes or loaded from a diffusers folder;
and Wan 2.1 image-to-video (``WanImageToVideoPipeline``), which adds a CLIP vision encoder.

Wan 2.1 binds one transformer. Wan 2.2 A14B binds two experts, ``transformer`` (high noise) and
``transformer_2`` (low noise), in ONE denoise loop whose router (``policies.SigmaBoundary``)
switches at ``σ = boundary_ratio`` — the same jitted step, no retrace per expert. The loop runs
on channels-last latents ``(f, h, w, 16)`` with ``f = 1 + (frames − 1)/4`` and ``h = height/8``,
with classifier-free guidance against the negative prompt (``Request.inputs["negative_prompt"]``).

An image-to-video card (``Config.i2v``: the transformer reads ``2·z_dim + 4`` channels) runs the
``i2v_denoise`` loop instead: the transformer also sees CLIP's penultimate hidden states of the image
(``image_encoder``) in added cross-attention K/V, and the first-frame condition concatenated to the
latents on channels: 4 mask channels (ones on latent frame 0) and the VAE latents of the video
``[image, 0, 0, ...]``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards.diffusers_pipeline import load_components, read_pipeline
from jaxpipe.loops import denoise, policies
from jaxpipe.nn import clip_vision, t5, wan, wan_vae
from jaxpipe.nn.tokenizer import TokenizerSpec

__all__ = ["LOOP_ID", "I2V_LOOP_ID", "IMAGE_LAYER", "PIPELINES", "Config", "build", "load_pipeline"]

LOOP_ID = "t2v_denoise"
I2V_LOOP_ID = "i2v_denoise"
"""The denoise loop of an image-to-video card (a text-to-video card's is ``LOOP_ID``)."""
IMAGE_LAYER = -2
"""The CLIP hidden state Wan 2.1 I2V conditions on (transformers' ``hidden_states[-2]``, the penultimate layer's output)."""
PIPELINES = ("WanPipeline", "WanImageToVideoPipeline")
"""The diffusers pipeline classes (``model_index.json``'s ``_class_name``) this family loads."""


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``wan`` card. The defaults are a tiny random test card;
    ``t2v_1_3b()`` / ``t2v_14b()`` / ``t2v_a14b()`` / ``i2v_14b()`` / ``i2v_14b_720p()`` are the published
    sizes (``tiny_i2v()`` a tiny image-to-video card); ``from_diffusers`` reads a pipeline folder.

    Attributes:
      transformer: the Wan transformer (every expert has this shape).
      vae: the Wan video autoencoder.
      text_encoder: UMT5.
      height: video height in pixels (a multiple of ``8·patch``).
      width: video width in pixels (likewise).
      frames: frames per video, ``1 + 4k``.
      max_sequence_length: UMT5 ids per prompt.
      num_steps: the default number of denoise steps.
      guidance: the default CFG scale.
      shift: the flow-shift of the schedule.
      boundary_ratio: Wan 2.2's σ where the high-noise ``transformer`` hands over to the low-noise
        ``transformer_2`` (in (0, 1)); ``None``: one transformer (Wan 2.1).
      negative_prompt: CFG's unconditional prompt, unless a request sets ``inputs["negative_prompt"]``.
      tokenizer: the UMT5 tokenizer, if the card has one.
      image_encoder: the CLIP vision tower of an image-to-video card (``None`` for text-to-video).
      image_processing: how the request image is prepared for ``image_encoder`` (``CLIPImageProcessor``'s
        settings, the folder's ``image_processor/``).

    Raises:
      ValueError: if the components' sizes do not fit together, ``frames`` is not ``1 + 4k``, the
        image size is not a multiple of ``8·patch``, ``boundary_ratio`` is outside (0, 1), or an
        image-to-video card lacks its image encoder (Wan 2.2 I2V) or is first-last-frame (FLF2V).
    """

    transformer: wan.WanConfig = wan.WanConfig.tiny()
    vae: wan_vae.WanVAEConfig = wan_vae.WanVAEConfig.tiny()
    text_encoder: t5.T5EncoderConfig = t5.T5EncoderConfig.tiny(umt5=True)
    height: int = 16
    width: int = 16
    frames: int = 5
    max_sequence_length: int = 16
    num_steps: int = 4
    guidance: float = 5.0
    shift: float = 3.0
    boundary_ratio: float | None = None
    negative_prompt: str = ""
    tokenizer: TokenizerSpec | None = None
    image_encoder: clip_vision.CLIPVisionConfig | None = None
    image_processing: clip_vision.ImageProcessing | None = None

    def __post_init__(self):
        tf = self.transformer
        validate.rule(
            tf.text_dim == self.text_encoder.d_model,
            f"transformer.text_dim ({tf.text_dim}) must equal text_encoder.d_model ({self.text_encoder.d_model})",
        )
        if self.i2v:
            self._check_i2v()
        else:
            validate.rule(
                tf.in_channels == self.vae.z_dim and tf.out_channels == self.vae.z_dim,
                f"a text-to-video transformer reads and writes vae.z_dim ({self.vae.z_dim}) channels (got {tf.in_channels} in, {tf.out_channels} out)",
            )
            validate.rule(
                tf.image_dim is None and self.image_encoder is None and self.image_processing is None,
                "a text-to-video card has no image encoder, image processing or transformer.image_dim",
            )
        validate.rule(
            self.frames >= 1 and (self.frames - 1) % 4 == 0,
            f"frames must be 1 + 4k (the VAE compresses time 4×; got {self.frames})",
        )
        space = 8 * tf.patch_size[1]
        validate.rule(
            self.height % space == 0 and self.width % space == 0,
            f"height and width must be multiples of {space} (got {self.height}×{self.width})",
        )
        validate.rule(
            self.boundary_ratio is None or 0.0 < self.boundary_ratio < 1.0,
            f"boundary_ratio must lie in (0, 1) (got {self.boundary_ratio})",
        )

    def _check_i2v(self) -> None:
        tf, z, encoder = self.transformer, self.vae.z_dim, self.image_encoder
        if tf.out_channels != z:
            raise ValueError(f"an image-to-video transformer writes vae.z_dim ({z}) channels (got {tf.out_channels})")
        if encoder is None or tf.image_dim is None:
            raise ValueError(
                "an image-to-video card needs a CLIP image_encoder and transformer.image_dim (Wan 2.1 I2V); "
                "Wan 2.2 I2V, conditioned on the first frame alone, is not supported"
            )
        if tf.pos_embed_seq_len is not None:
            raise ValueError("first-last-frame (FLF2V) transformers (pos_embed_seq_len set) are not supported")
        if tf.image_dim != encoder.hidden_size:
            raise ValueError(
                f"transformer.image_dim ({tf.image_dim}) must equal image_encoder.hidden_size ({encoder.hidden_size})"
            )
        if self.image_processing is None:
            raise ValueError("an image-to-video card needs image_processing (the image encoder's preprocessing)")
        if tuple(self.image_processing.crop) != (encoder.image_size, encoder.image_size):
            raise ValueError(
                f"image_processing crops {tuple(self.image_processing.crop)} images; the image encoder "
                f"reads {encoder.image_size}×{encoder.image_size}"
            )

    @property
    def i2v(self) -> bool:
        """Whether this is an image-to-video card: the transformer reads the latents plus the first-frame
        condition (``2·z_dim + 4`` channels)."""
        return self.transformer.in_channels == 2 * self.vae.z_dim + 4

    @property
    def loop_id(self) -> str:
        """The card's denoise loop: ``I2V_LOOP_ID`` for an image-to-video card, else ``LOOP_ID``."""
        return I2V_LOOP_ID if self.i2v else LOOP_ID

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(f, h, w, z_dim)``."""
        return (1 + (self.frames - 1) // 4, self.height // 8, self.width // 8, self.vae.z_dim)

    @property
    def experts(self) -> tuple[str, ...]:
        """The transformer components the loop binds, in router order."""
        return ("transformer",) if self.boundary_ratio is None else ("transformer", "transformer_2")

    @property
    def sampling(self) -> denoise.DenoiseConfig:
        """The loop's default settings: steps, shift, guidance, and a σ-boundary router for two experts."""
        router = policies.Single() if self.boundary_ratio is None else policies.SigmaBoundary(self.boundary_ratio)
        return denoise.DenoiseConfig(num_steps=self.num_steps, shift=self.shift, guidance=self.guidance, router=router)

    @property
    def tokenizers(self) -> TokenizerSpec | None:
        """The card's tokenizer (``tokenizer``)."""
        return self.tokenizer

    @classmethod
    def tiny(cls, **overrides) -> Config:
        """The tiny random test card (the defaults), with ``overrides`` of any field."""
        return cls(**overrides)

    @classmethod
    def t2v_1_3b(cls, **overrides) -> Config:
        """Wan2.1-T2V-1.3B at 480×832, 81 frames, 50 steps, guidance 5, shift 3."""
        return cls(**{**_published(wan.WanConfig.t2v_1_3b(), shift=3.0), **overrides})

    @classmethod
    def t2v_14b(cls, **overrides) -> Config:
        """Wan2.1-T2V-14B at 720×1280 (shift 5)."""
        return cls(**{**_published(wan.WanConfig.t2v_14b(), shift=5.0, height=720, width=1280), **overrides})

    @classmethod
    def t2v_a14b(cls, **overrides) -> Config:
        """Wan2.2-T2V-A14B: two 14 B experts switched at σ = 0.875 (the published boundary ratio)."""
        return cls(
            **{
                **_published(
                    wan.WanConfig.t2v_14b(),
                    shift=12.0,
                    height=720,
                    width=1280,
                    guidance=4.0,
                    boundary_ratio=0.875,
                    num_steps=40,
                ),
                **overrides,
            }
        )

    @classmethod
    def tiny_i2v(cls, **overrides) -> Config:
        """A tiny random image-to-video card: the tiny transformer with 12 input channels and image K/V,
        a tiny CLIP tower (32² images), with ``overrides`` of any field."""
        encoder = clip_vision.CLIPVisionConfig.tiny()
        transformer = wan.WanConfig.tiny(in_channels=12, image_dim=encoder.hidden_size, added_kv_proj_dim=32)
        return cls(
            **{
                "transformer": transformer,
                "image_encoder": encoder,
                "image_processing": clip_vision.ImageProcessing.openai(encoder.image_size),
                **overrides,
            }
        )

    @classmethod
    def i2v_14b(cls, **overrides) -> Config:
        """Wan2.1-I2V-14B-480P at 480×832, 81 frames (shift 3): CLIP ViT-H/14's penultimate layer as image tokens."""
        return cls(**{**_published(wan.WanConfig.i2v_14b(), shift=3.0, **_clip_h14()), **overrides})

    @classmethod
    def i2v_14b_720p(cls, **overrides) -> Config:
        """Wan2.1-I2V-14B-720P at 720×1280 (shift 5)."""
        return cls(
            **{**_published(wan.WanConfig.i2v_14b(), shift=5.0, height=720, width=1280, **_clip_h14()), **overrides}
        )

    @classmethod
    def from_diffusers(cls, path: str | Path, **overrides) -> Config:
        """The config of a diffusers ``WanPipeline`` folder (Wan 2.1, or Wan 2.2 with ``transformer_2``
        and ``boundary_ratio`` in ``model_index.json``), or of a Wan 2.1 ``WanImageToVideoPipeline`` folder
        (with ``image_encoder/`` and ``image_processor/``).

        Args:
          path: a ``WanPipeline`` or ``WanImageToVideoPipeline`` folder.
          **overrides: ``Config`` fields to set instead.

        Returns:
          The ``Config`` (at the published 480×832, 81 frames, 50 steps; the scheduler's shift).

        Raises:
          ValueError: if the folder holds another pipeline, ``transformer_2`` and ``boundary_ratio`` do not
            come together, the experts differ in shape, it uses ``expand_timesteps``, or it is an
            image-to-video folder without an image encoder (Wan 2.2 I2V).
          FileNotFoundError: if a component folder is missing.
        """
        from jaxpipe.nn.hf import read_config

        folder = read_pipeline(path)
        if folder.pipeline not in PIPELINES:
            raise ValueError(f"{path}: a {folder.pipeline or 'non-Wan'} folder, not one of {PIPELINES}")
        transformer = wan.WanConfig.from_json(read_config(folder.component("transformer")))
        boundary = folder.index.get("boundary_ratio")
        if folder.has("transformer_2"):
            second = wan.WanConfig.from_json(read_config(folder.component("transformer_2")))
            if second != transformer:
                raise ValueError(
                    f"{path}: transformer_2 differs in shape from transformer; jaxpipe routes two same-shape experts"
                )
            if boundary is None:
                raise ValueError(f"{path}: transformer_2 without a boundary_ratio in model_index.json")
        elif boundary is not None:
            raise ValueError(f"{path}: boundary_ratio {boundary} but no transformer_2")
        if folder.index.get("expand_timesteps"):
            raise ValueError(f"{path}: expand_timesteps (Wan 2.2 TI2V-5B) is not supported")
        try:
            tokenizer = TokenizerSpec.from_folder(folder.component("tokenizer"))
        except FileNotFoundError:
            tokenizer = None
        fields = _published(transformer, shift=folder.schedule().shift, boundary_ratio=boundary, tokenizer=tokenizer)
        fields.update(
            vae=wan_vae.WanVAEConfig.from_json(read_config(folder.component("vae"))),
            text_encoder=t5.T5EncoderConfig.from_json(read_config(folder.component("text_encoder"))),
        )
        if folder.pipeline == "WanImageToVideoPipeline":
            if not folder.has("image_encoder"):
                raise ValueError(
                    f"{path}: an image-to-video folder without an image_encoder (Wan 2.2 I2V) is not supported"
                )
            fields.update(
                image_encoder=clip_vision.CLIPVisionConfig.from_json(read_config(folder.component("image_encoder"))),
                image_processing=clip_vision.ImageProcessing.from_folder(folder.component("image_processor")),
            )
        return cls(**{**fields, **overrides})


def _published(transformer: wan.WanConfig, **fields) -> dict:
    defaults = dict(
        transformer=transformer,
        vae=wan_vae.WanVAEConfig.wan21(),
        text_encoder=t5.T5EncoderConfig.umt5_xxl(),
        height=480,
        width=832,
        frames=81,
        max_sequence_length=512,
        num_steps=50,
        guidance=5.0,
    )
    return {**defaults, **fields}


def _clip_h14() -> dict:
    return dict(
        image_encoder=clip_vision.CLIPVisionConfig.vit_h14(), image_processing=clip_vision.ImageProcessing.openai()
    )


def _spec(config: Config, model_id: str) -> CardSpec:
    loop_id = config.loop_id
    return CardSpec(
        model_id=model_id,
        family="wan",
        loops=(LoopSpec(loop_id, "denoise", config.experts, config.sampling, latent_shape=config.latent_shape),),
        recipe=(loop_id,),
        parity=("C0", "C1", "C2", "C3"),
        capabilities=("i2v",) if config.i2v else ("t2v",),
        tokenizer=config.tokenizers,
        config=config,
    )


def build(config: Config = Config(), *, seed: int = 0, model_id: str = "wan") -> Card:
    """A ``wan`` card with random weights (deterministic in ``seed``); works under ``nnx.eval_shape``.

    Args:
      config: the card's config (default: the tiny test card).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``Card`` (``text_encoder``, one transformer per expert, ``vae``; and ``image_encoder`` for image-to-video).
    """
    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": t5.T5Encoder(config.text_encoder, rngs=rngs),
        **{name: wan.WanTransformer(config.transformer, rngs=rngs) for name in config.experts},
        "vae": wan_vae.WanVAE(config.vae, rngs=rngs),
    }
    if config.i2v:
        components["image_encoder"] = clip_vision.CLIPVisionEncoder(config.image_encoder, rngs=rngs)
    return Card(components, _spec(config, model_id))


def load_pipeline(path: str | Path, *, dtype: str = "float32", model_id: str | None = None, **overrides) -> Card:
    """A ``wan`` card with the weights of a diffusers ``WanPipeline`` folder (``Wan2.1-T2V-1.3B-Diffusers/``,
    ``Wan2.2-T2V-A14B-Diffusers/``) or ``WanImageToVideoPipeline`` folder (``Wan2.1-I2V-14B-480P-Diffusers/``).

    Args:
      path: the pipeline folder.
      dtype: the networks' parameter and activation dtype (e.g. ``"bfloat16"``).
      model_id: the card's id (default: the folder's name).
      **overrides: ``Config`` fields.

    Returns:
      The loaded ``Card``.

    Raises:
      ValueError: as ``Config.from_diffusers``.
      FileNotFoundError: if a component is missing.
      KeyMappingError: if a component's weights do not fit its network.
    """
    path = Path(path)
    config = Config.from_diffusers(path, **overrides)
    loaders = {"text_encoder": t5.load, **{name: wan.load for name in config.experts}, "vae": wan_vae.load}
    if config.i2v:
        loaders["image_encoder"] = clip_vision.load
    components, configs = load_components(read_pipeline(path), loaders, dtype)
    config = dataclasses.replace(
        config,
        transformer=configs["transformer"],
        vae=configs["vae"],
        text_encoder=configs["text_encoder"],
        **({"image_encoder": configs["image_encoder"]} if config.i2v else {}),
    )
    return Card(components, _spec(config, model_id or path.name))
