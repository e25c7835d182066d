"""``Finetune``: flow-matching regression of a card's denoise loop (how the bundled generators are pretrained).

Per example: ``σ`` from ``config.noise`` (logit-normal by default), ``ε ~ N(0, I)``,
``x_σ = (1-σ)·x0 + σ·ε`` and the loss ``mean((v_θ(x_σ, σ, cond) - (ε - x0))²)``. The card's family
says what ``x0`` and ``cond`` are (its ``FlowData`` hooks: e.g. the autoencoder's latent of the
batch's image and the text encoding of its caption); the velocity is the loop's own (its bound
denoiser(s), routed by σ). The conditioning is dropped to unconditional with probability
``cond_dropout`` so the card supports classifier-free guidance. One guarded optimiser step per batch
(``training.loss_trainer``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp

from jaxpipe import samplers, validate
from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.loops import denoise
from jaxpipe.training.loss_trainer import LossTrainer
from jaxpipe.training.noise import NoiseLevels
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.trainer import TrainState

__all__ = ["FinetuneConfig", "Finetune"]


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Flow-matching finetuning settings (hashable: static under ``jit``).

    Attributes:
      optimizer: clipped AdamW with warm-up and cosine decay (the pretraining recipes' schedule).
      trainable: the components that learn (the others are frozen).
      cond_dropout: probability in [0, 1) that an example's conditioning is dropped.
      noise: how σ is drawn (logit-normal on (0, 1) by default; ``NoiseLevels("uniform", 0, 1)``).

    Raises:
      ValueError: on construction, if ``cond_dropout`` is not in [0, 1) or ``trainable`` is empty.
    """

    optimizer: Optimizer = Optimizer(
        1e-3, weight_decay=1e-4, schedule="warmup_cosine", warmup_steps=100, total_steps=2000
    )
    trainable: tuple[str, ...] = ("text_encoder", "transformer")
    cond_dropout: float = 0.1
    noise: NoiseLevels = NoiseLevels("logit_normal", 0.0, 1.0)

    def __post_init__(self):
        validate.rule(0.0 <= self.cond_dropout < 1.0, f"cond_dropout must be in [0, 1) (got {self.cond_dropout})")
        validate.rule(bool(self.trainable), "trainable must name at least one component")


class Finetune(LossTrainer):
    """Flow-matching finetuning of a card's denoise loop: ``init(key)``, jitted ``step``, ``card(state)``.

    A batch is whatever the card's family reads (``Family.flow``); for the text-conditioned
    generators ``{"ids": (B, L) int32, "image": (B, H, W, C)}`` (text-to-image),
    ``{"ids", "video": (B, T, H, W, C)}`` (image-to-video; pixels in [-1, 1]), or
    ``{"ids", "latents": (B, T, h, w, C)}`` already encoded by the card's autoencoder.
    ``loop_id`` picks the denoise loop (default: the card's first).

    Args:
      card: the card to finetune.
      config: the settings.
      loop_id: the denoise loop to train (default: the card's first).

    Raises:
      ValueError: if the card has no such denoise loop, its family declares no flow-matching data, or
        ``config.trainable`` names a component it lacks.
    """

    roles = MappingProxyType({})

    def __init__(self, card: Card, config: FinetuneConfig = FinetuneConfig(), *, loop_id: str | None = None):
        loops = [lp for lp in card.spec.loops if lp.kind == "denoise"]
        if loop_id is not None:
            loops = [card.spec.loop(loop_id)]
        if not loops or loops[0].kind != "denoise":
            raise ValueError(f"card {card.model_id!r} has no denoise loop to finetune")
        self.flow = registry.family_of(card).flow
        if self.flow is None:
            raise ValueError(
                f"card {card.model_id!r}: its family {card.spec.family!r} declares no flow-matching data (Family.flow)"
            )
        missing = sorted(set(config.trainable) - set(card.components))
        if missing:
            raise ValueError(
                f"trainable names component(s) {missing} that card {card.model_id!r} lacks: {sorted(card.components)}"
            )
        self.config = config
        self.loop = loops[0]
        self.sampling = self.loop.config.replace(guidance=1.0, stg=0.0)  # flow matching regresses the plain velocity
        self.spec = card.spec
        frozen = tuple(name for name in card.components if name not in config.trainable)
        super().__init__(dict(card.components), self.flow_loss, config.optimizer, frozen=frozen)

    @property
    def transformer(self) -> str:
        """The (first) denoiser the loop binds."""
        return self.loop.binds[0]

    def flow_loss(self, comps: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array) -> tuple[jax.Array, dict]:
        """The flow-matching loss of one batch: ``mean((v_θ(x_σ, σ, cond) - (ε - x0))²)`` (pure; differentiable).

        Args:
          comps: the card's components (name -> module), at the weights being trained.
          batch: what the family reads (``Family.flow``).
          key: draws the conditioning dropout, σ and ε.

        Returns:
          ``(loss, {"loss": loss})``.
        """
        x0 = jax.lax.stop_gradient(self.flow.latents(comps, batch))
        b = x0.shape[0]
        k_drop, k_sigma, k_noise = jax.random.split(key, 3)
        keep = jax.random.uniform(k_drop, (b,)) >= self.config.cond_dropout
        sigma = self.config.noise.draw(k_sigma, b)
        noise = jax.random.normal(k_noise, x0.shape)
        x_sigma = samplers.noised(x0, noise, sigma)
        cond = self.flow.cond(comps, batch, keep, x0)
        v = denoise.velocity(tuple(comps[name] for name in self.loop.binds), x_sigma, sigma, cond, self.sampling)
        loss = jnp.mean((v - (noise - x0)) ** 2)
        return loss, {"loss": loss}

    def card(self, state: TrainState) -> Card:
        """The card with the state's weights."""
        return Card(self.model(state), self.spec)

    def role_card(self, state: TrainState, role: str) -> Card:
        """Finetune keeps no roles: always raises.

        Raises:
          KeyError: for every ``role``.
        """
        raise KeyError(f"Finetune keeps no roles (got {role!r})")
