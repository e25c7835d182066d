"""Reproducible pretraining of the bundled ``wan22-moe`` card: two σ-routed experts from ``wan-t2v``.

    python -m jaxpipe.digits.pretrain.moe --out jaxpipe/digits/assets/wan22-moe

Both experts start as copies of the bundled ``wan-t2v`` DiT; its text encoder and autoencoder are
taken as they are (frozen, and not stored again: the card is saved with ``base="wan-t2v"``). One
``Finetune`` run then trains the two experts through the card's own router: each training example
draws its σ, the loop's ``SigmaBoundary`` sends it to the high-noise expert (σ >= boundary) or the
low-noise one, so each expert only ever sees — and specialises on — its own σ range. Fixed seeds,
the same moving-digit videos as ``wan-t2v``'s recipe.

Writes the card (``save_card``), ``metrics.jsonl`` (one line per step) and ``pretrain.json``
(settings, timings, and the held-out flow-matching loss above and below the boundary of
``wan-t2v`` and of the trained experts, on the same noise).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import cards, validate
from jaxpipe.card import Card
from jaxpipe.cards import generator, toy_sigma_moe
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits import data as digits
from jaxpipe.digits.pretrain.common import (
    FlowSettings,
    array_batches,
    digit_videos,
    encode_dataset,
    output_dir,
    run_recipe,
    write_report,
)
from jaxpipe.loops import denoise
from jaxpipe.training.fit import fit
from jaxpipe.training.methods.finetune import Finetune

__all__ = ["BASE", "MODEL_ID", "SHARED", "MoEPretrainConfig", "from_single", "heldout_loss", "main", "pretrain_moe"]

MODEL_ID = "wan22-moe"
"""The card this recipe trains."""

BASE = "wan-t2v"
"""The bundled card both experts start from (and whose text encoder and autoencoder the card shares)."""
SHARED = ("text_encoder", "vae")
"""The components taken from ``BASE`` unchanged (and stored only there)."""


@dataclasses.dataclass(frozen=True)
class MoEPretrainConfig(FlowSettings):
    """What the ``wan22-moe`` run does; the defaults are the bundled card's settings. ``boundary``: the σ
    from which the high-noise expert denoises (in (0, 1)); ``eval_videos``: held-out videos of the report's losses.

    Attributes:
        boundary: the σ from which the high-noise expert denoises, in ``(0, 1)``.
        eval_videos: held-out videos the report's losses are measured on.
    """

    steps: int = 450
    batch_size: int = 16
    learning_rate: float = 3e-4
    warmup_steps: int = 30
    boundary: float = 0.5
    eval_videos: int = 64

    def __post_init__(self):
        super().__post_init__()
        validate.counts(self, "eval_videos")  # boundary: toy_sigma_moe.Config checks it


def from_single(single: Card, boundary: float) -> Card:
    """A ``wan22-moe`` card whose two experts are copies of ``single``'s ``transformer`` (a ``wan-t2v``
    card) and whose text encoder, autoencoder and sampling are ``single``'s.

    Args:
        single: a ``wan-t2v`` card.
        boundary: the router's σ boundary, in ``(0, 1)``.

    Returns:
        The ``wan22-moe`` card (``transformer_high``, ``transformer_low``: independent copies).

    Raises:
        ValueError: if ``boundary`` is not in ``(0, 1)`` (``toy_sigma_moe.Config``'s check).
    """
    base = single.spec.config
    config = toy_sigma_moe.Config(
        image_size=base.image_size,
        frames=base.frames,
        text=base.text,
        dit=base.dit,
        vae=base.vae,
        sampling=base.sampling,
        boundary=boundary,
        vocabulary=base.vocabulary,
    )
    # Two distinct modules: one module under two names would be one set of weights to nnx.split.
    return Card(
        {
            "text_encoder": single["text_encoder"],
            "transformer_high": nnx.clone(single["transformer"]),
            "transformer_low": nnx.clone(single["transformer"]),
            "vae": single["vae"],
        },
        toy_sigma_moe.spec(config),
    )


def heldout_loss(card: Card, latents: jax.Array, ids: jax.Array, sigmas: np.ndarray, seed: int) -> np.ndarray:
    """``(len(sigmas),)`` flow-matching loss ``mean((v - (ε - x0))²)`` of the card's denoise loop (its
    router, no guidance) on clean ``latents`` ``(N, T, h, w, C)`` captioned by ``ids`` ``(N, L)``, at
    each fixed σ with noise drawn from ``seed`` (the same noise for every card).

    Args:
        card: a text-to-video card (``wan-t2v`` or ``wan22-moe``).
        latents: clean latents ``(N, T, h, w, C)``.
        ids: their captions' token ids ``(N, L)``.
        sigmas: the noise levels, ``(S,)`` in ``[0, 1]``.
        seed: the noise's seed.

    Returns:
        The loss at each σ, float64 ``(S,)``.
    """
    loop = card.spec.loops[0]
    config = loop.config.replace(guidance=1.0)

    @jax.jit
    def at(components, sigma, key):
        models = tuple(components[name] for name in loop.binds)
        cond = generator.TextFlow(loop.binds[0]).cond(components, {"ids": ids}, jnp.ones(ids.shape[:1], bool), latents)
        noise = jax.random.normal(key, latents.shape)
        s = jnp.full(latents.shape[:1], sigma)
        x = (1.0 - sigma) * latents + sigma * noise
        v = denoise.velocity(models, x, s, cond, config)
        return jnp.mean((v - (noise - latents)) ** 2)

    keys = jax.random.split(jax.random.key(seed), len(sigmas))
    return np.array([float(at(card.components, jnp.float32(s), k)) for s, k in zip(sigmas, keys)])


def pretrain_moe(
    out: str | Path | None, cfg: MoEPretrainConfig = MoEPretrainConfig(), *, progress: bool = True
) -> Card:
    """Train both experts of a ``wan22-moe`` card from the bundled ``wan-t2v``; save it to ``out``.

    Prints the held-out losses above and below the boundary of ``wan-t2v`` and of the trained card.

    Args:
        out: the directory to write the card, ``metrics.jsonl`` and ``pretrain.json`` to (``None``: write nothing).
        cfg: the run's settings.
        progress: show a progress bar.

    Returns:
        The trained ``wan22-moe`` card.
    """
    out = output_dir(out, "metrics.jsonl")
    single = cards.load(BASE)
    card = from_single(single, cfg.boundary)

    arrays = encode_dataset(card, digit_videos("train", seed=cfg.seed, copies=cfg.copies))
    held_images, held_labels = digits.load_images("heldout")
    held = encode_dataset(
        card, digits.make_videos(held_images[: cfg.eval_videos], held_labels[: cfg.eval_videos], seed=cfg.seed + 1000)
    )
    held = {k: jnp.asarray(v) for k, v in held.items()}

    start = time.perf_counter()
    method = Finetune(card, cfg.finetune(trainable=toy_sigma_moe.EXPERTS))
    state, history = fit(
        method.step,
        method.init(),
        array_batches(arrays, cfg.batch_size, seed=cfg.seed + 1),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc="wan22-moe",
        progress=progress,
    )
    train_s = time.perf_counter() - start
    card = method.card(state)

    sigmas = (np.arange(16, dtype=np.float32) + 0.5) / 16  # midpoints of 16 equal σ bins
    above = sigmas >= cfg.boundary
    losses = {
        name: heldout_loss(c, held["latents"], held["ids"], sigmas, cfg.seed + 2)
        for name, c in ((BASE, single), ("wan22-moe", card))
    }
    report_loss = {
        name: {
            "above_boundary": float(loss[above].mean()),
            "below_boundary": float(loss[~above].mean()),
            "by_sigma": [round(float(x), 5) for x in loss],
        }
        for name, loss in losses.items()
    }
    if out is not None:
        save_card(card, out, base=BASE, base_components=SHARED)
        write_report(
            out,
            {
                "model_id": MODEL_ID,
                "settings": config_to_dict(cfg),
                "start_from": BASE,
                "final_loss": float(np.mean([h["loss"] for h in history[-100:]])),
                "train_s": train_s,
                "heldout_sigmas": [float(s) for s in sigmas],
                "heldout_loss": report_loss,
            },
        )
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "by_sigma"} for k, v in report_loss.items()}))
    return card


def main(argv=None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``MoEPretrainConfig`` field, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(
        MoEPretrainConfig, "Pretrain the wan22-moe card's two experts from the bundled wan-t2v.", pretrain_moe, argv
    )


if __name__ == "__main__":
    main()
