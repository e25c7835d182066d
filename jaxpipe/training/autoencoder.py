"""Reconstruction training of the convolutional autoencoder (the first stage of every bundled generator)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.nn import Autoencoder
from jaxpipe.training.finetune import guarded_update, make_optimizer

__all__ = ["AutoencoderTrainConfig", "AutoencoderTrainer"]


@dataclasses.dataclass(frozen=True)
class AutoencoderTrainConfig:
    """``loss = mean((decode(encode(x)) - x)²) + latent_penalty · mean(z²)``; the penalty keeps latents tame."""

    learning_rate: float = 2e-3
    warmup_steps: int = 50
    total_steps: int = 1500
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    latent_penalty: float = 1e-4


class AutoencoderState(NamedTuple):
    params: nnx.State
    opt_state: Any
    step: jax.Array


class AutoencoderTrainer:
    """``init(key)``, jitted ``step(state, {"image": (B, H, W, C)}, key)``, ``model(state)``."""

    def __init__(self, model: Autoencoder, config: AutoencoderTrainConfig = AutoencoderTrainConfig()):
        self.config = config
        self._graphdef, self._params, self._rest = nnx.split(model, nnx.Param, ...)
        self.tx = make_optimizer(
            config.learning_rate, config.warmup_steps, config.total_steps, config.weight_decay, config.grad_clip
        )
        self.step = jax.jit(self._step, donate_argnums=0)

    def init(self, key: jax.Array | None = None) -> AutoencoderState:
        del key
        params = jax.tree.map(jnp.array, self._params)
        return AutoencoderState(params, self.tx.init(params), jnp.zeros((), jnp.int32))

    def loss(self, params, batch) -> tuple[jax.Array, dict]:
        model = nnx.merge(self._graphdef, params, self._rest)
        z = model.encode(batch["image"])
        recon = jnp.mean((model.decode(z) - batch["image"]) ** 2)
        loss = recon + self.config.latent_penalty * jnp.mean(z**2)
        return loss, {"loss": loss, "recon": recon}

    def _step(self, state: AutoencoderState, batch: dict, key: jax.Array):
        del key
        (loss, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(state.params, batch)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        new = AutoencoderState(optax.apply_updates(state.params, updates), opt_state, state.step + 1)
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "skipped": 1.0 - finite.astype(jnp.float32)}

    def model(self, state: AutoencoderState) -> Autoencoder:
        return nnx.merge(self._graphdef, state.params, self._rest)
