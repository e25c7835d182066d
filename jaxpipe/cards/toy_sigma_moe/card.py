"""The ``wan22-moe`` card: text -> a short video on two DiT experts switched by noise level (Wan 2.2's MoE).

Components: the text encoder, a high-noise expert ``transformer_high`` (σ >= ``boundary``), a
low-noise expert ``transformer_low`` (σ below it), both DiTs of the same size, and the
autoencoder. ONE denoise loop, ``t2v_denoise``, binds both experts; its router
(``policies.SigmaBoundary(boundary)``) picks one per request and step inside the same jitted step,
so a step runs the parameters of one DiT while the card stores two.
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards import generator
from jaxpipe.loops import denoise, policies

__all__ = ["MODEL_ID", "LOOP_ID", "EXPERTS", "Config", "build", "spec"]

MODEL_ID = "toy-sigma-moe"
LOOP_ID = "t2v_denoise"
EXPERTS = ("transformer_high", "transformer_low")
"""The loop's bound experts, in router order: expert 0 above the boundary, expert 1 below."""


@dataclasses.dataclass(frozen=True)
class Config(generator.VideoGeneratorConfig):
    """Everything that shapes a σ-routed two-expert card (``vocabulary`` required); the defaults are CPU-test sized.

    ``boundary``: the noise level in (0, 1) where the loop hands over from the high-noise expert
    (σ >= boundary) to the low-noise one. ``sampling`` is the loop's policy without its router
    (``policies.Single()``): the card's loop routes by ``boundary``.

    Attributes:
      sampling: the ``t2v_denoise`` loop's settings, router left as ``policies.Single()``.
      boundary: the hand-over noise level, in (0, 1).

    Raises:
      ValueError: on a boundary outside (0, 1) or a ``sampling`` with a router.
    """

    sampling: denoise.DenoiseConfig = denoise.DenoiseConfig()
    boundary: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        validate.rule(
            not isinstance(self.boundary, bool)
            and isinstance(self.boundary, (int, float))
            and 0.0 < self.boundary < 1.0,
            f"boundary (the noise level where transformer_high hands over to transformer_low) must be in (0, 1) "
            f"(got {self.boundary!r})",
        )
        validate.rule(
            self.sampling.router == policies.Single(),
            f"sampling.router must be left as policies.Single(): the loop routes by boundary={self.boundary} "
            f"(got {self.sampling.router})",
        )

    @property
    def loop_config(self) -> denoise.DenoiseConfig:
        """The loop's policy: ``sampling`` routed by ``policies.SigmaBoundary(boundary)``."""
        return self.sampling.replace(router=policies.SigmaBoundary(float(self.boundary)))


def build(config: Config, *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``wan22-moe`` card with freshly initialised components.

    Deterministic in ``seed``; the two experts draw different initial weights.

    Args:
      config: the ``toy_sigma_moe`` family's ``Config`` (sizes, vocabulary, sampling defaults).
      seed: the initialisation seed.
      model_id: the card's id.

    Returns:
      The ``toy_sigma_moe`` ``Card``.
    """
    from jaxpipe.nn import Autoencoder, DiT, TextEncoder

    rngs = nnx.Rngs(seed)
    components = {
        "text_encoder": TextEncoder(config.text, rngs=rngs),
        "transformer_high": DiT(config.dit, rngs=rngs),
        "transformer_low": DiT(config.dit, rngs=rngs),
        "vae": Autoencoder(config.vae, rngs=rngs),
    }
    return Card(components, spec(config, model_id))


def spec(config: Config, model_id: str = MODEL_ID) -> CardSpec:
    """The static half of a ``wan22-moe`` card: one ``t2v_denoise`` loop binding both experts.

    Args:
      config: the card's config (its ``loop_config`` routes by ``boundary``).
      model_id: the card's id.

    Returns:
      The ``CardSpec``.
    """
    from jaxpipe.nn import Tokenizer

    return CardSpec(
        model_id=model_id,
        family="toy_sigma_moe",
        loops=(LoopSpec(LOOP_ID, "denoise", EXPERTS, config.loop_config, latent_shape=config.latent_shape),),
        recipe=(LOOP_ID,),
        parity=("C0", "C1", "C2", "C3"),
        capabilities=("t2v",),
        tokenizer=Tokenizer(config.vocabulary),
        config=config,
    )
