"""The ``flux-t2i`` card family: text encoder + DiT + autoencoder, text -> image.

One loop, ``t2i_denoise``, drives the DiT; encoding the prompt and decoding the latents are
the program's component steps around it (``program()``). ``generate`` runs all three as one
jitted function: the program's fast path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
from flax import nnx

from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards import common
from jaxpipe.data import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.nn import Autoencoder, AutoencoderConfig, DiT, DiTConfig, TextEncoder, TextEncoderConfig, Tokenizer
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, bind_text, start_denoise, text_nodes
from jaxpipe.request import Request

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


def _decode(card: Card, reads) -> dict[str, jax.Array]:
    """``latents`` ``(B, 1, h, w, C)`` -> ``image`` ``(B, H, W, C)`` in [0, 1]."""
    return {"image": common.to_unit(card["vae"].decode(reads["latents"][:, 0]))}


def _bind(card: Card, request: Request) -> Bound:
    if request.image is not None:
        raise ValueError(f"{card.model_id!r} renders text to an image and takes no image (got image={request.image.shape})")
    return bind_text(card, request, LOOP_ID)


@functools.cache
def program() -> Program:
    """The ``flux-t2i`` program: encode text (cached) -> ``t2i_denoise`` -> decode.

    Request: ``prompt`` (required), ``seed``, ``num_steps``, ``guidance``. Artifacts: ``"image"``
    ``(H, W, C)`` in [0, 1], ``"latents"`` ``(1, h, w, C)`` and ``"text"`` (the prompt).
    """
    return Program(
        name=MODEL_ID,
        inputs=("ids", "null_ids", "seed"),
        nodes=(
            *text_nodes(),
            LoopNode(
                LOOP_ID,
                start_denoise,
                reads=("seed", "context", "context_mask", "uncond_context", "uncond_mask"),
                writes=("latents",),
            ),
            ComponentNode("decode", _decode, reads=("latents",), writes=("image",), component="vae"),
        ),
        outputs=(("image", "image"), ("latents", "latents")),
        bind=_bind,
    )


def seeds_for(seed: int | Sequence[int], n: int) -> list[int]:
    """Per-prompt seeds: one int seeds prompt ``b`` with ``seed + b``; a sequence gives one seed each."""
    seeds = [seed + i for i in range(n)] if isinstance(seed, int) else list(seed)
    if len(seeds) != n:
        raise ValueError(f"seed: got {len(seeds)} seeds for {n} prompts")
    return seeds


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
    ``num_steps`` / ``guidance`` default to the card's ``t2i_denoise`` settings. A thin wrapper
    over ``program()``'s fast path (one jitted function for the whole batch).
    """
    prompts = common.as_prompts(prompts)
    seeds = seeds_for(seed, len(prompts))
    requests = [Request(card.model_id, prompt=p, seed=s, num_steps=num_steps, guidance=guidance) for p, s in zip(prompts, seeds)]
    return program().run(card, [program().bind(card, r) for r in requests])["image"]
