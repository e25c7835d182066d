"""Reproducible pretraining of the bundled ``ltx2-two-stage`` card, starting from the bundled ``wan-t2v``.

    python -m jaxpipe.digits.pretrain.ltx2 --out jaxpipe/digits/assets/ltx2-two-stage

The text encoder and autoencoder are ``wan-t2v``'s, frozen (the checkpoint takes them from that
card: ``save_card(..., base="wan-t2v")``). Data: the same captioned moving-digit videos as
``wan-t2v``, encoded once by the frozen autoencoder; the base stage's data are those latents
average-pooled 2×2 (``toy_two_stage.pool_latents``: ``(T, 8, 8, 4) -> (T, 4, 4, 4)``). Then

1. the one DiT (starting from ``wan-t2v``'s) is fine-tuned by flow matching (``Finetune``) on both
   resolutions, one full-resolution batch then ``base_per_full`` pooled batches in turn, so one
   network serves both loops (the full resolution is what ``wan-t2v`` already knows; the pooled
   one is new);
2. the upsampler learns pooled -> full latents by regression, its input noise-augmented (the
   base stage's samples are not exactly pooled latents).

Fixed seeds, so the same machine reproduces the same weights. Writes the card, ``metrics.jsonl``
(DiT, one line per step), ``upsampler_metrics.jsonl`` and ``pretrain.json`` (settings, timings,
final losses and the upsampler's held-out error against nearest-neighbour upsampling).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import cards, validate
from jaxpipe.card import Card
from jaxpipe.cards import toy_two_stage
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits.pretrain.common import (
    FlowSettings,
    array_batches,
    digit_videos,
    encode_dataset,
    output_dir,
    run_recipe,
    write_report,
)
from jaxpipe.nn import LatentUpsampler
from jaxpipe.training.fit import fit
from jaxpipe.training.loss_trainer import LossTrainer
from jaxpipe.training.methods.finetune import Finetune
from jaxpipe.training.optim import Optimizer

__all__ = [
    "MODEL_ID",
    "SHARED",
    "START_FROM",
    "PretrainConfig",
    "UpsamplerTrainer",
    "alternate",
    "main",
    "pretrain_ltx2",
    "upsampler_error",
    "upsampler_loss",
]

MODEL_ID = "ltx2-two-stage"
"""The card this recipe trains."""

START_FROM = "wan-t2v"
"""The bundled card the run starts from (its text encoder, DiT and autoencoder)."""
SHARED = ("text_encoder", "vae")
"""The components taken unchanged from ``START_FROM`` (and not stored again)."""


@dataclasses.dataclass(frozen=True)
class PretrainConfig(FlowSettings):
    """What the run does; the defaults are the bundled card's settings. The DiT trains ``steps`` on
    ``batch_size`` full-resolution clips then ``base_per_full`` batches of ``base_batch_size`` pooled ones in
    turn; the upsampler ``upsampler_steps`` at peak ``upsampler_learning_rate`` on batches of
    ``base_batch_size`` clips, its input noised by up to ``upsampler_noise``. Each run warms up over
    ``warmup_steps``, at most a tenth of the run (``run_optimizer``).

    Attributes:
        upsampler_steps: steps of the upsampler's run.
        base_per_full: pooled (base-stage) DiT batches after each full-resolution one.
        base_batch_size: clips per pooled DiT batch and per upsampler batch.
        upsampler_learning_rate: the upsampler's peak learning rate.
        upsampler_noise: the largest std of the noise added to the upsampler's input.
    """

    steps: int = 1600
    batch_size: int = 16
    learning_rate: float = 3e-4
    warmup_steps: int = 50
    copies: int = 4
    upsampler_steps: int = 1000
    base_per_full: int = 2
    base_batch_size: int = 32
    upsampler_learning_rate: float = 2e-3
    upsampler_noise: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        validate.counts(self, "upsampler_steps", "base_per_full", "base_batch_size")
        validate.positive(self, "upsampler_learning_rate")
        validate.non_negative(self, "upsampler_noise")

    def run_optimizer(self, learning_rate: float, steps: int) -> Optimizer:
        """The optimiser of a run of ``steps`` at peak ``learning_rate`` (the DiT's or the upsampler's).

        Args:
            learning_rate: the peak learning rate.
            steps: the run's length (the schedule's ``total_steps``).

        Returns:
            The recipe's optimiser, warming up over ``min(warmup_steps, steps // 10)`` steps.
        """
        warmup = min(self.warmup_steps, steps // 10)
        return self.optimizer(learning_rate=learning_rate, total_steps=steps, warmup_steps=warmup)


def alternate(*streams: Iterator) -> Iterator:
    """Round-robin over batch streams: one batch of each in turn (step ``i`` takes stream ``i % n``).

    Args:
        *streams: ``n`` endless batch iterators (one may be given more than once to weight it).

    Returns:
        The endless interleaved iterator.
    """
    while True:
        for stream in streams:
            yield next(stream)


def upsampler_loss(model: LatentUpsampler, batch, key: jax.Array, noise: float) -> tuple[jax.Array, dict]:
    """``mean((up(pooled + s·ε) - full)²)`` with ``s ~ U(0, noise)`` per example, on a batch
    ``{"latents": (B, T, h, w, C)}`` of full-resolution latents (pooled here).

    Args:
        model: the upsampler.
        batch: ``{"latents": (B, T, h, w, C)}``, ``h`` and ``w`` even.
        key: a PRNG key (the noise).
        noise: the largest noise std.

    Returns:
        The scalar loss and ``{"loss": it}``.
    """
    full = batch["latents"]
    pooled = toy_two_stage.pool_latents(full)
    k_scale, k_noise = jax.random.split(key)
    scale = jax.random.uniform(k_scale, (pooled.shape[0],) + (1,) * (pooled.ndim - 1), maxval=noise)
    noisy = pooled + scale * jax.random.normal(k_noise, pooled.shape)
    loss = jnp.mean((model(noisy) - full) ** 2)
    return loss, {"loss": loss}


class UpsamplerTrainer(LossTrainer):
    """Regression of a ``LatentUpsampler`` (``upsampler_loss`` with input noise up to ``noise``): ``init()``,
    jitted ``step(state, batch, key)``, ``model(state)``, by ``optimizer``."""

    def __init__(self, model: LatentUpsampler, optimizer: Optimizer, *, noise: float):
        super().__init__(model, lambda m, batch, key: upsampler_loss(m, batch, key, noise), optimizer)


def upsampler_error(model: LatentUpsampler, latents: np.ndarray) -> dict[str, float]:
    """Mean squared error of the upsampler and of nearest-neighbour upsampling, pooled -> full ``latents``.

    Args:
        model: the upsampler.
        latents: full-resolution latents ``(N, T, h, w, C)``, ``h`` and ``w`` even.

    Returns:
        ``{"upsampler_mse", "nearest_mse", "latent_var"}`` (the last: the latents' variance, for scale).
    """
    full = jnp.asarray(latents)
    pooled = toy_two_stage.pool_latents(full)
    nearest = jnp.repeat(jnp.repeat(pooled, 2, axis=2), 2, axis=3)
    up = jax.jit(lambda m, x: m(x))(model, pooled)
    return {
        "upsampler_mse": float(jnp.mean((up - full) ** 2)),
        "nearest_mse": float(jnp.mean((nearest - full) ** 2)),
        "latent_var": float(jnp.var(full)),
    }


def pretrain_ltx2(out: str | Path | None, cfg: PretrainConfig = PretrainConfig(), *, progress: bool = True) -> Card:
    """Train the ``ltx2-two-stage`` card from the bundled ``wan-t2v`` (see the module docstring); save it to ``out``.

    Args:
        out: the directory to write the card, its metrics and ``pretrain.json`` to (``None``: write nothing).
        cfg: the run's settings.
        progress: show progress bars.

    Returns:
        The trained ``ltx2-two-stage`` card.
    """
    out = output_dir(out, "metrics.jsonl", "upsampler_metrics.jsonl")
    start = time.perf_counter()
    base = cards.load(START_FROM)
    card = cards.build(MODEL_ID, seed=cfg.seed, config=digit_cards.bundled_config(MODEL_ID))
    card = card.replace(**{name: base[name] for name in ("text_encoder", "transformer", "vae")})
    arrays = encode_dataset(card, digit_videos("train", seed=cfg.seed, copies=cfg.copies))
    pooled = {"latents": np.asarray(toy_two_stage.pool_latents(jnp.asarray(arrays["latents"]))), "ids": arrays["ids"]}
    timings = {"encode_s": time.perf_counter() - start}

    start = time.perf_counter()
    optimizer = cfg.run_optimizer(cfg.learning_rate, cfg.steps)
    method = Finetune(card, cfg.finetune(optimizer=optimizer, trainable=("transformer",)))
    base_batches = array_batches(pooled, cfg.base_batch_size, seed=cfg.seed + 2)
    batches = alternate(array_batches(arrays, cfg.batch_size, seed=cfg.seed + 1), *[base_batches] * cfg.base_per_full)
    state, history = fit(
        method.step,
        method.init(),
        batches,
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc="ltx2 transformer",
        progress=progress,
    )
    card = method.card(state)
    timings["transformer_s"] = time.perf_counter() - start

    start = time.perf_counter()
    trainer = UpsamplerTrainer(
        card["upsampler"],
        cfg.run_optimizer(cfg.upsampler_learning_rate, cfg.upsampler_steps),
        noise=cfg.upsampler_noise,
    )
    up_state, up_history = fit(
        trainer.step,
        trainer.init(),
        array_batches({"latents": arrays["latents"]}, cfg.base_batch_size, seed=cfg.seed + 3),
        steps=cfg.upsampler_steps,
        key=jax.random.key(cfg.seed + 3),
        metrics_path=None if out is None else out / "upsampler_metrics.jsonl",
        desc="ltx2 upsampler",
        progress=progress,
    )
    card = card.replace(upsampler=trainer.model(up_state))
    timings["upsampler_s"] = time.perf_counter() - start

    if out is not None:
        save_card(card, out, base=START_FROM, base_components=SHARED)
        heldout = encode_dataset(card, digit_videos("heldout", seed=cfg.seed, copies=1))["latents"]
        cycle = 1 + cfg.base_per_full  # alternate(): step i is full resolution when i % cycle == 0, pooled otherwise
        full = [h for i, h in enumerate(history) if i % cycle == 0]
        half = [h for i, h in enumerate(history) if i % cycle]
        write_report(
            out,
            {
                "model_id": MODEL_ID,
                "settings": config_to_dict(cfg),
                "start_from": START_FROM,
                "shared_components": list(SHARED),
                "base_data": "full-resolution VAE latents average-pooled 2x2",
                "final_loss_full": float(np.mean([h["loss"] for h in full[-50:]])),
                "final_loss_base": float(np.mean([h["loss"] for h in half[-50:]])),
                "final_upsampler_loss": float(np.mean([h["loss"] for h in up_history[-50:]])),
                "heldout": upsampler_error(card["upsampler"], heldout),
                **timings,
            },
        )
    return card


def main(argv=None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``PretrainConfig`` field, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(
        PretrainConfig, "Pretrain the bundled ltx2-two-stage card from the bundled wan-t2v.", pretrain_ltx2, argv
    )


if __name__ == "__main__":
    main()
