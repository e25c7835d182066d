"""Reconstruction training of the convolutional autoencoder (the first stage of every toy generator).

``loss = mean((decode(encode(x)) - x)²) + latent_penalty · mean(z²)`` on image batches
``{"image": (B, H, W, C)}`` in [-1, 1]; one guarded step per batch (``training.loss_trainer``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from jaxpipe.nn import Autoencoder
from jaxpipe.training.loss_trainer import LossTrainer
from jaxpipe.training.optim import Optimizer

__all__ = ["AutoencoderTrainConfig", "AutoencoderTrainer", "reconstruction_loss"]


@dataclasses.dataclass(frozen=True)
class AutoencoderTrainConfig:
    """The optimiser (warm-up + cosine AdamW) and the latent penalty, which keeps latents tame.

    Attributes:
      optimizer: the optimiser settings.
      latent_penalty: the weight of ``mean(z²)`` in the loss.
    """

    optimizer: Optimizer = Optimizer(2e-3, schedule="warmup_cosine", warmup_steps=50, total_steps=1500)
    latent_penalty: float = 1e-4


def reconstruction_loss(
    model: Autoencoder, batch: Mapping[str, jax.Array], latent_penalty: float
) -> tuple[jax.Array, dict]:
    """The reconstruction loss of one image batch: ``mean((decode(encode(x)) - x)²) + latent_penalty · mean(z²)``.

    Args:
      model: the autoencoder.
      batch: ``{"image": (B, H, W, C)}`` in [-1, 1].
      latent_penalty: the weight of ``mean(z²)``.

    Returns:
      ``(loss, {"loss": loss, "recon": the reconstruction MSE})``, scalars.
    """
    z = model.encode(batch["image"])
    recon = jnp.mean((model.decode(z) - batch["image"]) ** 2)
    loss = recon + latent_penalty * jnp.mean(z**2)
    return loss, {"loss": loss, "recon": recon}


class AutoencoderTrainer(LossTrainer):
    """Reconstruction training of an autoencoder: a ``LossTrainer`` of ``reconstruction_loss``.

    ``init(key)``, jitted ``step(state, {"image": (B, H, W, C)}, key)``, ``model(state)``.

    Args:
      model: the autoencoder to train.
      config: the optimiser and the latent penalty.
    """

    def __init__(self, model: Autoencoder, config: AutoencoderTrainConfig = AutoencoderTrainConfig()):
        self.config = config
        super().__init__(
            model, lambda m, batch, key: reconstruction_loss(m, batch, config.latent_penalty), config.optimizer
        )
