"""Reproducible pretraining of the bundled generator cards on the digits world.

    python -m jaxpipe.digits.pretrain.generators flux-t2i --out jaxpipe/digits/assets/flux-t2i
    python -m jaxpipe.digits.pretrain.generators wan-i2v  --out jaxpipe/digits/assets/wan-i2v
    python -m jaxpipe.digits.pretrain.generators wan-t2v  --steps 3000 --out jaxpipe/digits/assets/wan-t2v

Each command trains the autoencoder on train-split digits, fits its latent statistics, then
trains the text encoder and DiT by flow matching (``Finetune``); a card with a ``START_FROM``
entry (``wan-t2v``) instead starts from a bundled card of the same sizes (all of its components,
the autoencoder frozen as trained) and only learns what is new (``wan-t2v``: motion) — fixed seeds, so the same
machine reproduces the same weights — and writes the card with ``save_card`` plus
``metrics.jsonl`` (one line per step) and ``pretrain.json`` (the settings and timings).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import cards, validate
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.digits.pretrain.common import (
    FlowSettings,
    VideoBatch,
    array_batches,
    digit_videos,
    encode_dataset,
    output_dir,
    run_recipe,
    write_report,
)
from jaxpipe.nn import Autoencoder
from jaxpipe.training.autoencoder import AutoencoderTrainConfig, AutoencoderTrainer
from jaxpipe.training.fit import fit
from jaxpipe.training.methods.finetune import Finetune

__all__ = [
    "START_FROM",
    "VIDEO_CARDS",
    "PretrainConfig",
    "generator_data",
    "main",
    "pretrain_generator",
    "train_autoencoder",
]


@dataclasses.dataclass(frozen=True)
class PretrainConfig(FlowSettings, VideoBatch):
    """What a pretraining run does; the defaults are the bundled cards' settings. ``autoencoder_steps``:
    the autoencoder's run (its own optimiser, ``AutoencoderTrainConfig``'s); ``drop``: the probability that
    ``flux-t2i``'s captions leave out each attribute word (``digits.augment``).

    Attributes:
        autoencoder_steps: steps of the autoencoder's run.
        drop: the probability that a ``flux-t2i`` caption leaves out each attribute word.
    """

    autoencoder_steps: int = 1500
    drop: float = 0.3

    def __post_init__(self):
        super().__post_init__()
        validate.counts(self, "autoencoder_steps")
        validate.fractions(self, "drop")


START_FROM = {"wan-t2v": "flux-t2i"}
"""Cards whose pretraining starts from a bundled card with the same component sizes: ``wan-t2v``
learns motion on top of ``flux-t2i``'s text encoder, DiT (the same network: an image is a
1-frame video) and autoencoder (which codes each frame on its own)."""

VIDEO_CARDS = ("wan-i2v", "wan-t2v")
"""The video cards this recipe trains (on ``digit_videos``; ``flux-t2i`` trains on images)."""


def _as_arrays(batches):
    for batch in batches:
        yield {k: jnp.asarray(v) for k, v in batch.items() if k in ("image", "video", "ids")}


def train_autoencoder(
    model: Autoencoder, cfg: PretrainConfig, out: Path | None, *, progress: bool = True
) -> Autoencoder:
    """Reconstruction-train ``model`` on augmented train-split digits, then whiten its latents.

    Args:
        model: the card's autoencoder (freshly initialised).
        cfg: the run's settings (``seed``, ``copies``, ``batch_size``, ``autoencoder_steps``).
        out: the directory for ``autoencoder_metrics.jsonl`` (``None``: none).
        progress: show a progress bar.

    Returns:
        The trained autoencoder, its latent statistics fitted on 2,048 of the training images.
    """
    images, labels = digits.load_images("train")
    data = digits.augment(images, labels, seed=cfg.seed, copies=cfg.copies)
    optimizer = dataclasses.replace(AutoencoderTrainConfig().optimizer, total_steps=cfg.autoencoder_steps)
    trainer = AutoencoderTrainer(model, AutoencoderTrainConfig(optimizer=optimizer))
    state, _ = fit(
        trainer.step,
        trainer.init(),
        _as_arrays(digits.batches(data, cfg.batch_size, seed=cfg.seed)),
        steps=cfg.autoencoder_steps,
        key=jax.random.key(cfg.seed),
        metrics_path=None if out is None else out / "autoencoder_metrics.jsonl",
        desc="autoencoder",
        progress=progress,
    )
    sample = jnp.asarray(data.image[np.random.default_rng(cfg.seed).permutation(len(data))[:2048]])
    return trainer.model(state).fit_latent_stats(sample)


def generator_data(model_id: str, cfg: PretrainConfig):
    """The flow-matching data of a generator card: captioned images (t2i) or videos (i2v).

    Args:
        model_id: ``"flux-t2i"`` or one of ``VIDEO_CARDS``.
        cfg: the run's settings (``seed``, ``copies``, ``drop``).

    Returns:
        ``flux-t2i``: an ``ImageDataset`` of train-split renders; a video card: a ``VideoDataset``
        (``digit_videos("train")``).

    Raises:
        ValueError: if ``model_id`` has no recipe here.
    """
    if model_id == "flux-t2i":
        return digits.augment(*digits.load_images("train"), seed=cfg.seed, copies=cfg.copies, drop=cfg.drop)
    if model_id in VIDEO_CARDS:
        return digit_videos("train", seed=cfg.seed, copies=cfg.copies)
    raise ValueError(f"no pretraining recipe for {model_id!r}; use one of {['flux-t2i', *VIDEO_CARDS]}")


def pretrain_generator(
    model_id: str, out: str | Path | None, cfg: PretrainConfig = PretrainConfig(), *, progress: bool = True
) -> Card:
    """Train a generator card from scratch (autoencoder, then text encoder + DiT); save it to ``out``.

    A card in ``START_FROM`` starts from that bundled card instead and skips the autoencoder.

    Args:
        model_id: ``"flux-t2i"`` or one of ``VIDEO_CARDS``.
        out: the directory to write the card, its metrics and ``pretrain.json`` to (``None``: write nothing).
        cfg: the run's settings.
        progress: show progress bars.

    Returns:
        The trained card.

    Raises:
        KeyError: if ``model_id`` has no bundled config.
        ValueError: if ``model_id`` has no recipe here.
    """
    out = output_dir(out, "metrics.jsonl", "autoencoder_metrics.jsonl")
    timings = {}
    start = time.perf_counter()
    card = cards.build(model_id, seed=cfg.seed, config=digit_cards.bundled_config(model_id))
    data = generator_data(model_id, cfg)
    if model_id in START_FROM:
        base = cards.load(START_FROM[model_id])
        card = card.replace(**{name: base[name] for name in card.components})
    else:
        card = card.replace(vae=train_autoencoder(card["vae"], cfg, out, progress=progress))
        timings["autoencoder_s"] = time.perf_counter() - start

    start = time.perf_counter()
    method = Finetune(card, cfg.finetune())
    arrays = encode_dataset(card, data)
    state, history = fit(
        method.step,
        method.init(),
        array_batches(arrays, cfg.batch(model_id in VIDEO_CARDS), seed=cfg.seed + 1),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc=model_id,
        progress=progress,
    )
    timings["generator_s"] = time.perf_counter() - start
    card = method.card(state)
    if out is not None:
        save_card(card, out)
        final = float(np.mean([h["loss"] for h in history[-100:]]))
        write_report(
            out,
            {
                "model_id": model_id,
                "settings": config_to_dict(cfg),
                "start_from": START_FROM.get(model_id),
                "final_loss": final,
                **timings,
            },
        )
    return card


def main(argv=None) -> None:
    """The recipe's command line: ``MODEL_ID --out DIR``, one flag per ``PretrainConfig`` field, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(
        PretrainConfig,
        "Pretrain a bundled generator card on the digits world.",
        lambda out, cfg, *, model_id, progress: pretrain_generator(model_id, out, cfg, progress=progress),
        argv,
        options={"model_id": {"choices": ["flux-t2i", *VIDEO_CARDS]}},
    )


if __name__ == "__main__":
    main()
