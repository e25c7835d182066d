"""``Finetune``: flow-matching regression of a card's denoise loop (how the bundled generators are pretrained).

Per example: ``σ ~ sigmoid(N(0, 1))`` (logit-normal) or ``U(0, 1)``, ``ε ~ N(0, I)``,
``x_σ = (1-σ)·x0 + σ·ε`` and the loss ``mean((v_θ(x_σ, σ, cond) - (ε - x0))²)``. The card's family
says what ``x0`` and ``cond`` are (its ``FlowData`` hooks: e.g. the autoencoder's latent of the
batch's image and the text encoding of its caption); the velocity is the loop's own (its bound
denoiser(s), routed by σ). The conditioning is dropped to unconditional with probability
``cond_dropout`` so the card supports classifier-free guidance.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.loops import denoise

__all__ = ["FinetuneConfig", "FinetuneState", "Finetune"]


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Optimiser and objective settings. ``trainable`` names the components that learn."""

    learning_rate: float = 1e-3
    warmup_steps: int = 100
    total_steps: int = 2000
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    trainable: tuple[str, ...] = ("text_encoder", "transformer")
    cond_dropout: float = 0.1
    sigma_sampling: str = "logit_normal"

    def __post_init__(self):
        if self.sigma_sampling not in ("logit_normal", "uniform"):
            raise ValueError(f"sigma_sampling must be 'logit_normal' or 'uniform' (got {self.sigma_sampling!r})")
        if not 0.0 <= self.cond_dropout < 1.0:
            raise ValueError(f"cond_dropout must be in [0, 1) (got {self.cond_dropout})")
        if self.total_steps <= 0 or self.warmup_steps < 0:
            raise ValueError("total_steps must be > 0 and warmup_steps >= 0")
        if not self.trainable:
            raise ValueError("trainable must name at least one component")


class FinetuneState(NamedTuple):
    """Trainable params, frozen params (everything else), optimiser state, step counter."""

    params: nnx.State
    frozen: nnx.State
    opt_state: Any
    step: jax.Array


def make_optimizer(learning_rate: float, warmup_steps: int, total_steps: int, weight_decay: float, grad_clip: float):
    """Clipped AdamW with linear warm-up and cosine decay to 10% of the peak rate."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, max(warmup_steps, 1), max(total_steps, warmup_steps + 1), end_value=0.1 * learning_rate
    )
    return optax.chain(optax.clip_by_global_norm(grad_clip), optax.adamw(schedule, weight_decay=weight_decay))


def split_trainable(card: Card, trainable: tuple[str, ...]):
    """``(graphdef, trainable params, frozen params, non-param variables)`` of a card's components."""
    missing = sorted(set(trainable) - set(card.components))
    if missing:
        raise ValueError(f"trainable names component(s) {missing} that card {card.model_id!r} lacks: {sorted(card.components)}")
    graphdef, params, rest = nnx.split(card.components, nnx.Param, ...)
    train = nnx.State({k: params[k] for k in params if k in trainable})
    frozen = nnx.State({k: params[k] for k in params if k not in trainable})
    return graphdef, train, frozen, rest


def guarded_update(finite: jax.Array, new, old):
    """``new`` where ``finite`` else ``old``, leaf by leaf: a non-finite step leaves the state unchanged."""
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def guarded_steps(loss_fn, tx: optax.GradientTransformation, params, opt_state, keys: jax.Array):
    """One optimiser step of ``loss_fn(params, key) -> scalar`` per key of ``keys`` (K,), as a ``lax.scan``;
    a step whose loss or gradient is not finite leaves params and optimiser state unchanged (a critic's
    several updates per student update). Returns ``(params, opt_state, losses (K,), grad_norms (K,),
    skipped (K,) float)``."""

    def one(carry, key):
        p, opt = carry
        loss, grads = jax.value_and_grad(loss_fn)(p, key)
        updates, new_opt = tx.update(grads, opt, p)
        norm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(norm)
        carry = guarded_update(ok, (optax.apply_updates(p, updates), new_opt), (p, opt))
        return carry, (loss, norm, 1.0 - ok.astype(jnp.float32))

    (params, opt_state), (losses, norms, skipped) = jax.lax.scan(one, (params, opt_state), keys)
    return params, opt_state, losses, norms, skipped


class Finetune:
    """Flow-matching finetuning of a card's denoise loop: ``init(key)``, jitted ``step``, ``card(state)``.

    A batch is whatever the card's family reads (``Family.flow``); for the text-conditioned
    generators ``{"ids": (B, L) int32, "image": (B, H, W, C)}`` (text-to-image),
    ``{"ids", "video": (B, T, H, W, C)}`` (image-to-video; pixels in [-1, 1]), or
    ``{"ids", "latents": (B, T, h, w, C)}`` already encoded by the card's autoencoder.
    ``loop_id`` picks the denoise loop (default: the card's first).
    """

    def __init__(self, card: Card, config: FinetuneConfig = FinetuneConfig(), *, loop_id: str | None = None):
        loops = [l for l in card.spec.loops if l.kind == "denoise"]
        if loop_id is not None:
            loops = [card.spec.loop(loop_id)]
        if not loops or loops[0].kind != "denoise":
            raise ValueError(f"card {card.model_id!r} has no denoise loop to finetune")
        self.flow = registry.family_of(card).flow
        if self.flow is None:
            raise ValueError(f"card {card.model_id!r}: its family {card.spec.family!r} declares no flow-matching data (Family.flow)")
        self.config = config
        self.loop = loops[0]
        self.sampling = self.loop.config.replace(guidance=1.0, stg=0.0)  # flow matching regresses the plain velocity
        self.spec = card.spec
        self._graphdef, self._init_params, self._frozen, self._rest = split_trainable(card, config.trainable)
        self.tx = make_optimizer(
            config.learning_rate, config.warmup_steps, config.total_steps, config.weight_decay, config.grad_clip
        )
        self.step = jax.jit(self._step, donate_argnums=0)

    @property
    def transformer(self) -> str:
        """The (first) denoiser the loop binds."""
        return self.loop.binds[0]

    def init(self, key: jax.Array | None = None) -> FinetuneState:
        """The starting state: the card's weights and a fresh optimiser (``key`` is unused: nothing random)."""
        del key
        # Copies: the step donates its state, which must not delete the card's own arrays.
        params, frozen = jax.tree.map(jnp.array, (self._init_params, self._frozen))
        return FinetuneState(params, frozen, self.tx.init(params), jnp.zeros((), jnp.int32))

    def _components(self, params, frozen):
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def loss(self, params, frozen, batch, key) -> tuple[jax.Array, dict]:
        """Flow-matching loss of one batch (pure; differentiable in ``params``)."""
        comps = self._components(params, frozen)
        x0 = jax.lax.stop_gradient(self.flow.latents(comps, batch))
        b = x0.shape[0]
        k_drop, k_sigma, k_noise = jax.random.split(key, 3)
        keep = jax.random.uniform(k_drop, (b,)) >= self.config.cond_dropout
        if self.config.sigma_sampling == "logit_normal":
            sigma = jax.nn.sigmoid(jax.random.normal(k_sigma, (b,)))
        else:
            sigma = jax.random.uniform(k_sigma, (b,))
        noise = jax.random.normal(k_noise, x0.shape)
        s = sigma.reshape((b,) + (1,) * (x0.ndim - 1))
        x_sigma = (1.0 - s) * x0 + s * noise
        cond = self.flow.cond(comps, batch, keep, x0)
        v = denoise.velocity(tuple(comps[name] for name in self.loop.binds), x_sigma, sigma, cond, self.sampling)
        loss = jnp.mean((v - (noise - x0)) ** 2)
        return loss, {"loss": loss}

    def _step(self, state: FinetuneState, batch: dict, key: jax.Array) -> tuple[FinetuneState, dict]:
        (loss, metrics), grads = jax.value_and_grad(self.loss, has_aux=True)(state.params, state.frozen, batch, key)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
        new = FinetuneState(params, state.frozen, opt_state, state.step + 1)
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "grad_norm": optax.tree.norm(grads), "skipped": 1.0 - finite.astype(jnp.float32)}

    def card(self, state: FinetuneState) -> Card:
        """The card with the state's weights."""
        return Card(self._components(state.params, state.frozen), self.spec)
