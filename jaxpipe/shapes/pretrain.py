"""Reproducible pretraining of the shapes world's bundled cards (fixed seeds: the same machine gives the same bits).

    python -m jaxpipe.shapes.pretrain shapes-t2i --out jaxpipe/shapes/assets/shapes-t2i
    python -m jaxpipe.shapes.pretrain shapes-t2v --out jaxpipe/shapes/assets/shapes-t2v
    python -m jaxpipe.shapes.pretrain shapes-unified --out jaxpipe/shapes/assets/shapes-unified

``shapes-t2i``: renders ``scenes`` captioned scenes of the six categories (seen colour-shape pairs only),
trains the autoencoder on them and fits its latent statistics, encodes them once, then trains the text
encoder and DiT by flow matching (``Finetune``, captions dropped 10% of the time for guidance).
``shapes-t2v`` starts from the bundled ``shapes-t2i`` (every component; an image is a one-frame video, the
autoencoder codes each frame alone and stays frozen) and learns motion on rendered videos. Each run writes
the card (``save_card``), ``metrics.jsonl`` (one line per step) and ``pretrain.json`` (the settings, the
command and the timings). ``shapes-unified`` is ``shapes-t2i``'s generator plus a refiner LM trained on the
world's captions: its recipe and flags are ``refiner``'s (this command hands them on).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import cards, validate
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.shapes import cards as shape_cards
from jaxpipe.shapes import refiner
from jaxpipe.shapes.grammar import captioned_scenes
from jaxpipe.shapes.scenes import render, render_video
from jaxpipe.training.autoencoder import AutoencoderTrainConfig, AutoencoderTrainer
from jaxpipe.training.data import array_batches, encode_captioned
from jaxpipe.training.fit import fit
from jaxpipe.training.methods.finetune import Finetune, FinetuneConfig
from jaxpipe.training.optim import Optimizer

__all__ = ["PretrainConfig", "DEFAULTS", "pretrain", "render_data", "main"]


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """What one pretraining run does.

    Attributes:
        seed: fixes the run (initialisation, scenes, batch order, noise).
        scenes: captioned scenes (images or videos) rendered for the run.
        autoencoder_steps: steps of the autoencoder's run (0: keep the starting card's autoencoder).
        autoencoder_batch: images per autoencoder step.
        steps: flow-matching steps of the text encoder and DiT.
        batch_size: examples (images or videos) per flow-matching step.
        learning_rate: the peak rate (warm-up over 100 steps, cosine decay to 10%).
        cond_dropout: the probability that an example's caption is dropped.

    Raises:
        ValueError: on a count that is not positive or a rate out of range.
    """

    seed: int = 0
    scenes: int = 24000
    autoencoder_steps: int = 1200
    autoencoder_batch: int = 32
    steps: int = 6000
    batch_size: int = 64
    learning_rate: float = 1e-3
    cond_dropout: float = 0.1

    def __post_init__(self):
        validate.counts(self, "seed", "autoencoder_steps", minimum=0)
        validate.counts(self, "scenes", "autoencoder_batch", "steps", "batch_size")
        validate.positive(self, "learning_rate")
        validate.fractions(self, "cond_dropout")


DEFAULTS = {
    "shapes-t2i": PretrainConfig(),
    "shapes-t2v": PretrainConfig(scenes=3000, autoencoder_steps=0, steps=1500, batch_size=16, learning_rate=5e-4),
}
"""Each card's bundled settings."""
START_FROM = {"shapes-t2v": "shapes-t2i"}
"""Cards whose run starts from a bundled card of the same component sizes (only what is new is learnt)."""


def render_data(model_id: str, cfg: PretrainConfig, frames: int = 8, size: int = 32) -> tuple[list[str], np.ndarray]:
    """The run's captions and pixels: ``(N,)`` captions and ``(N, size, size, 3)`` images (``shapes-t2i``) or
    ``(N, frames, size, size, 3)`` videos (``shapes-t2v``), in the autoencoder's ``[-1, 1]``.

    Args:
        model_id: ``"shapes-t2i"`` or ``"shapes-t2v"``.
        cfg: the run's settings (``seed``, ``scenes``).
        frames: frames per video.
        size: the image side.

    Returns:
        ``(captions, pixels)``.
    """
    video = model_id == "shapes-t2v"
    pairs = captioned_scenes(cfg.scenes, seed=cfg.seed, video=video, frames=frames)
    draw = (lambda s: render_video(s, frames, size)) if video else (lambda s: render(s, size))
    return [caption for caption, _ in pairs], np.stack([draw(scene) * 2.0 - 1.0 for _, scene in pairs])


def _optimizer(rate: float, steps: int) -> Optimizer:
    return Optimizer(
        rate, weight_decay=1e-4, schedule="warmup_cosine", warmup_steps=100, total_steps=steps, end_fraction=0.1
    )


def pretrain(
    model_id: str, out: str | Path | None, cfg: PretrainConfig | None = None, *, progress: bool = True
) -> Card:
    """Train the bundled card ``model_id`` and save it to ``out``.

    Args:
        model_id: ``"shapes-t2i"`` or ``"shapes-t2v"``.
        out: the directory for the card, ``metrics.jsonl`` and ``pretrain.json`` (``None``: write nothing).
        cfg: the run's settings (default: ``DEFAULTS[model_id]``).
        progress: show progress bars.

    Returns:
        The trained card.

    Raises:
        KeyError: if ``model_id`` is not a shapes card.
        ValueError: if ``cfg.autoencoder_steps`` is 0 for a card that starts from nothing.
    """
    cfg = cfg or DEFAULTS[model_id]
    out = None if out is None else Path(out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.jsonl", "autoencoder_metrics.jsonl"):
            (out / stale).unlink(missing_ok=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    captions, pixels = render_data(model_id, cfg)
    timings["render_s"] = time.perf_counter() - start
    card = cards.build(model_id, seed=cfg.seed, config=shape_cards.bundled_config(model_id))
    if model_id in START_FROM:
        base = cards.load(START_FROM[model_id])
        card = card.replace(**{name: base[name] for name in card.components})
    if cfg.autoencoder_steps:
        start = time.perf_counter()
        images = pixels.reshape(-1, *pixels.shape[-3:])
        trainer = AutoencoderTrainer(
            card["vae"], AutoencoderTrainConfig(optimizer=_optimizer(2e-3, cfg.autoencoder_steps))
        )
        state, _ = fit(
            trainer.step,
            trainer.init(),
            array_batches({"image": images}, cfg.autoencoder_batch, seed=cfg.seed),
            steps=cfg.autoencoder_steps,
            key=jax.random.key(cfg.seed),
            desc="autoencoder",
            progress=progress,
            metrics_path=None if out is None else out / "autoencoder_metrics.jsonl",
        )
        sample = jnp.asarray(images[np.random.default_rng(cfg.seed).permutation(len(images))[:2048]])
        card = card.replace(vae=trainer.model(state).fit_latent_stats(sample))
        timings["autoencoder_s"] = time.perf_counter() - start
    elif model_id not in START_FROM:
        raise ValueError(f"{model_id} starts from nothing: it needs autoencoder_steps > 0")

    start = time.perf_counter()
    arrays = encode_captioned(card, pixels, captions)
    method = Finetune(
        card, FinetuneConfig(optimizer=_optimizer(cfg.learning_rate, cfg.steps), cond_dropout=cfg.cond_dropout)
    )
    state, history = fit(
        method.step,
        method.init(),
        array_batches(arrays, cfg.batch_size, seed=cfg.seed + 1),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        desc=model_id,
        progress=progress,
        metrics_path=None if out is None else out / "metrics.jsonl",
    )
    timings["generator_s"] = time.perf_counter() - start
    card = method.card(state)
    if out is not None:
        save_card(card, out)
        report = {
            "model_id": model_id,
            "command": f"python -m jaxpipe.shapes.pretrain {model_id} --out {out}",
            "settings": config_to_dict(cfg),
            "start_from": START_FROM.get(model_id),
            "final_loss": float(np.mean([h["loss"] for h in history[-100:]])),
            **{k: round(v, 1) for k, v in timings.items()},
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        }
        (out / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")
    return card


def main(argv: list[str] | None = None) -> None:
    """``python -m jaxpipe.shapes.pretrain CARD --out DIR [--steps N ...]``: one flag per ``PretrainConfig`` field
    (``shapes-unified``: one per ``refiner.RefinerPretrainConfig`` field, ``refiner.main``).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: on a bad command line (status 2).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [refiner.MODEL_ID]:
        refiner.main(argv[1:])
        return
    parser = argparse.ArgumentParser(
        description="Pretrain a bundled card of the shapes world "
        f"({refiner.MODEL_ID}: see `... {refiner.MODEL_ID} --help` for its flags)."
    )
    parser.add_argument("card", choices=sorted([*DEFAULTS, refiner.MODEL_ID]))
    parser.add_argument("--out", required=True, help="directory to write the card to")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    for field in dataclasses.fields(PretrainConfig):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(field.default),
            default=None,
            help=f"default: the card's ({field.default} for shapes-t2i)",
        )
    args = parser.parse_args(argv)
    changes = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainConfig) if getattr(args, f.name) is not None
    }
    try:
        cfg = dataclasses.replace(DEFAULTS[args.card], **changes)
    except ValueError as error:
        parser.error(str(error))
    pretrain(args.card, args.out, cfg, progress=not args.quiet)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
