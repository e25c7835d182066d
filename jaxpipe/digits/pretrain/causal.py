"""Reproducible pretraining of the bundled ``wan-causal`` card (chunked causal video):

    python -m jaxpipe.digits.pretrain.causal --out jaxpipe/digits/assets/wan-causal

Starts from the bundled ``wan-t2v`` (its DiT weights become the causal DiT's, its text encoder
and autoencoder are shared, frozen) and fine-tunes the DiT by flow matching on the digits videos
with block-causal attention and **per-chunk noise levels** (diffusion forcing): every chunk gets
its own σ; with probability ``clean_past`` a random chunk ``k`` is the "current" one and every
earlier chunk is clean (σ = 0), as at inference where finished chunks sit in the cache. Chunks
at σ = 0 carry no loss (their velocity target is not identifiable from a clean input). With
probability ``shift_positions`` the clip's absolute frame positions start at a random whole
chunk in ``[0, max_offset]``, so continuing a video past the trained length stays in
distribution. Fixed seeds; writes the card with ``save_card(..., base="wan-t2v")`` (only the
DiT is stored), ``metrics.jsonl`` and ``pretrain.json``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import cards, samplers, validate
from jaxpipe.card import Card
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
from jaxpipe.nn.causal_dit import CausalDiT
from jaxpipe.training.fit import fit
from jaxpipe.training.loss_trainer import LossTrainer

__all__ = [
    "BASE",
    "MODEL_ID",
    "SHARED",
    "CausalPretrainConfig",
    "Trainer",
    "causal_card",
    "causal_loss",
    "chunk_sigmas",
    "main",
    "pretrain_causal",
]

MODEL_ID = "wan-causal"
"""The card this recipe trains."""

BASE = "wan-t2v"
"""The bundled card the run starts from (its DiT weights; its text encoder and autoencoder, shared)."""
SHARED = ("text_encoder", "vae")
"""The components taken from ``BASE`` unchanged and saved by reference to it."""


@dataclasses.dataclass(frozen=True)
class CausalPretrainConfig(FlowSettings):
    """What the run does; the defaults are the bundled card's settings. ``clean_past``, ``shift_positions``
    and ``max_offset`` (frames): see the module docstring.

    Attributes:
        clean_past: the probability that a row's chunks before a random current chunk are clean (σ = 0).
        shift_positions: the probability that a clip's frame positions start at a random whole chunk.
        max_offset: the largest such start, in frames (rounded down to whole chunks).
    """

    steps: int = 1200
    batch_size: int = 16
    learning_rate: float = 5e-4
    clean_past: float = 0.5
    shift_positions: float = 0.5
    max_offset: int = 8

    def __post_init__(self):
        super().__post_init__()
        validate.fractions(self, "clean_past", "shift_positions")
        validate.counts(self, "max_offset", minimum=0)


def causal_card(base: Card) -> Card:
    """A ``wan-causal`` card (bundled sizes) whose components are ``base``'s: the same text encoder and
    autoencoder, and a ``CausalDiT`` holding ``base``'s DiT weights.

    Args:
        base: a ``wan-t2v`` card of the bundled sizes.

    Returns:
        The ``wan-causal`` card.
    """
    card = cards.build(MODEL_ID, config=digit_cards.bundled_config(MODEL_ID))
    dit = card["transformer"]
    nnx.update(dit, nnx.state(base["transformer"]))
    return card.replace(transformer=dit, **{name: base[name] for name in SHARED})


def chunk_sigmas(key: jax.Array, batch: int, chunks: int, clean_past: float) -> jax.Array:
    """Per-chunk noise levels ``(batch, chunks)``: logit-normal per chunk; with probability ``clean_past``
    a row picks a current chunk ``k`` uniformly and its chunks ``< k`` are clean (σ = 0).

    Args:
        key: a PRNG key.
        batch: the number of rows.
        chunks: chunks per row.
        clean_past: the probability that a row's earlier chunks are clean.

    Returns:
        σ, float32 ``(batch, chunks)`` in ``[0, 1)``.
    """
    k_sigma, k_mode, k_current = jax.random.split(key, 3)
    sigma = jax.nn.sigmoid(jax.random.normal(k_sigma, (batch, chunks)))
    current = jax.random.randint(k_current, (batch, 1), 0, chunks)
    past = (jnp.arange(chunks)[None, :] < current) & (jax.random.uniform(k_mode, (batch, 1)) < clean_past)
    return jnp.where(past, 0.0, sigma)


def causal_loss(dit: CausalDiT, context, context_mask, x0, key, cfg: CausalPretrainConfig, chunk_frames: int):
    """Diffusion-forcing flow-matching loss of one batch of clean latents ``x0`` ``(B, T, h, w, C)``
    (mean squared velocity error over the chunks at σ > 0).

    Args:
        dit: the causal DiT.
        context: the text encoder's output for the captions, ``(B, L, D)``.
        context_mask: ``(B, L)`` bool, True at real (non-pad) tokens.
        x0: clean latents ``(B, T, h, w, C)``, ``T`` a multiple of ``chunk_frames``.
        key: a PRNG key (σ per chunk, noise, position shifts).
        cfg: the run's settings (``clean_past``, ``shift_positions``, ``max_offset``).
        chunk_frames: latent frames per chunk.

    Returns:
        The scalar loss.
    """
    b, t = x0.shape[:2]
    chunks = t // chunk_frames
    k_sigma, k_noise, k_shift, k_offset = jax.random.split(key, 4)
    sigma = chunk_sigmas(k_sigma, b, chunks, cfg.clean_past)
    offset = jax.random.randint(k_offset, (b,), 0, cfg.max_offset // chunk_frames + 1) * chunk_frames
    offset = jnp.where(jax.random.uniform(k_shift, (b,)) < cfg.shift_positions, offset, 0)
    noise = jax.random.normal(k_noise, x0.shape)
    frames = jnp.repeat(sigma, chunk_frames, axis=1)
    s = frames[:, :, None, None, None]
    v = dit(
        samplers.noised(x0, noise, frames), sigma, context, context_mask, chunk_frames=chunk_frames, frame_offset=offset
    )
    weight = (s > 0).astype(jnp.float32)
    err = jnp.sum(weight * (v - (noise - x0)) ** 2) / jnp.maximum(jnp.sum(jnp.broadcast_to(weight, x0.shape)), 1.0)
    return err


class Trainer(LossTrainer):
    """The DiT of a ``wan-causal`` card trained with ``causal_loss`` (its text encoder frozen, the captions
    dropped with probability ``cond_dropout``): ``init()``, jitted ``step``, ``card(state)``."""

    def __init__(self, card: Card, cfg: CausalPretrainConfig):
        self.cfg, self.base = cfg, card
        self.chunk_frames = card.spec.config.sampling.chunk_frames
        models = {"text_encoder": card["text_encoder"], "transformer": card["transformer"]}
        super().__init__(models, self.batch_loss, cfg.optimizer(), frozen=("text_encoder",))

    def batch_loss(self, models, batch, key: jax.Array) -> tuple[jax.Array, dict]:
        """``(loss, {"loss"})`` of one batch, each caption dropped with probability ``cond_dropout``.

        Args:
            models: ``{"text_encoder", "transformer"}``.
            batch: ``{"latents": (B, T, h, w, C), "ids": (B, L) int}``.
            key: a PRNG key (caption dropout and ``causal_loss``).

        Returns:
            The scalar ``causal_loss`` and ``{"loss": it}``.
        """
        k_drop, k_loss = jax.random.split(key)
        ids = batch["ids"]
        ids = jnp.where((jax.random.uniform(k_drop, (ids.shape[0],)) >= self.cfg.cond_dropout)[:, None], ids, 0)
        context = jax.lax.stop_gradient(models["text_encoder"](ids))
        loss = causal_loss(
            models["transformer"], context, ids != 0, batch["latents"], k_loss, self.cfg, self.chunk_frames
        )
        return loss, {"loss": loss}

    def card(self, state) -> Card:
        """The ``wan-causal`` card with ``state``'s DiT.

        Args:
            state: a training state of this trainer.

        Returns:
            The card given at construction, its ``"transformer"`` replaced.
        """
        return self.base.replace(transformer=self.model(state)["transformer"])


def pretrain_causal(
    out: str | Path | None, cfg: CausalPretrainConfig = CausalPretrainConfig(), *, progress: bool = True
) -> Card:
    """Train the ``wan-causal`` card from the bundled ``wan-t2v``; save it to ``out`` (if given).

    Args:
        out: the directory to write the card, ``metrics.jsonl`` and ``pretrain.json`` to (``None``: write nothing).
        cfg: the run's settings.
        progress: show a progress bar.

    Returns:
        The trained ``wan-causal`` card.
    """
    out = output_dir(out, "metrics.jsonl")
    start = time.perf_counter()
    card = causal_card(cards.load(BASE))
    arrays = encode_dataset(card, digit_videos("train", seed=cfg.seed, copies=cfg.copies))  # wan-t2v's data
    trainer = Trainer(card, cfg)
    state, history = fit(
        trainer.step,
        trainer.init(),
        array_batches(arrays, cfg.batch_size, seed=cfg.seed + 1),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc=MODEL_ID,
        progress=progress,
    )
    card = trainer.card(state)
    if out is not None:
        save_card(card, out, base=BASE, base_components=SHARED)
        write_report(
            out,
            {
                "model_id": MODEL_ID,
                "start_from": BASE,
                "settings": config_to_dict(cfg),
                "final_loss": float(np.mean([h["loss"] for h in history[-100:]])),
                "train_s": time.perf_counter() - start,
            },
        )
    return card


def main(argv=None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``CausalPretrainConfig`` field, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(
        CausalPretrainConfig,
        "Pretrain the bundled wan-causal card from wan-t2v (diffusion forcing).",
        pretrain_causal,
        argv,
    )


if __name__ == "__main__":
    main()
