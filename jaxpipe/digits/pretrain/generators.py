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
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import cards
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.nn import Autoencoder
from jaxpipe.training.autoencoder import AutoencoderTrainConfig, AutoencoderTrainer
from jaxpipe.digits.pretrain.common import array_batches, encode_dataset, finetune_config, parse_settings, settings_parser
from jaxpipe.training.methods.finetune import Finetune
from jaxpipe.training.fit import fit



@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    """What a pretraining run does; the defaults are the bundled cards' settings."""

    seed: int = 0
    autoencoder_steps: int = 1500
    steps: int = 4000
    batch_size: int = 64
    video_batch_size: int = 16
    learning_rate: float = 1e-3
    copies: int = 8
    drop: float = 0.3


START_FROM = {"wan-t2v": "flux-t2i"}
"""Cards whose pretraining starts from a bundled card with the same component sizes: ``wan-t2v``
learns motion on top of ``flux-t2i``'s text encoder, DiT (the same network: an image is a
1-frame video) and autoencoder (which codes each frame on its own)."""

VIDEO_CARDS = ("wan-i2v", "wan-t2v")


def _as_arrays(batches):
    for batch in batches:
        yield {k: jnp.asarray(v) for k, v in batch.items() if k in ("image", "video", "ids")}


def train_autoencoder(model: Autoencoder, cfg: PretrainConfig, out: Path | None) -> Autoencoder:
    """Reconstruction-train ``model`` on augmented train-split digits, then whiten its latents."""
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
    )
    sample = jnp.asarray(data.image[np.random.default_rng(cfg.seed).permutation(len(data))[:2048]])
    return trainer.model(state).fit_latent_stats(sample)


def generator_data(model_id: str, cfg: PretrainConfig):
    """The flow-matching data of a generator card: captioned images (t2i) or videos (i2v)."""
    images, labels = digits.load_images("train")
    if model_id == "flux-t2i":
        return digits.augment(images, labels, seed=cfg.seed, copies=cfg.copies, drop=cfg.drop)
    if model_id in VIDEO_CARDS:
        return digits.concat([digits.make_videos(images, labels, seed=cfg.seed + i) for i in range(cfg.copies)])
    raise ValueError(f"no pretraining recipe for {model_id!r}; use one of {['flux-t2i', *VIDEO_CARDS]}")


def pretrain_generator(model_id: str, out: str | Path | None, cfg: PretrainConfig = PretrainConfig()) -> Card:
    """Train a generator card from scratch (autoencoder, then text encoder + DiT); save it to ``out``."""
    out = None if out is None else Path(out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.jsonl", "autoencoder_metrics.jsonl"):
            (out / stale).unlink(missing_ok=True)
    timings = {}
    start = time.perf_counter()
    card = cards.build(model_id, seed=cfg.seed, config=digit_cards.bundled_config(model_id))
    data = generator_data(model_id, cfg)
    if model_id in START_FROM:
        base = cards.load(START_FROM[model_id])
        card = card.replace(**{name: base[name] for name in card.components})
    else:
        card = card.replace(vae=train_autoencoder(card["vae"], cfg, out))
        timings["autoencoder_s"] = time.perf_counter() - start

    start = time.perf_counter()
    method = Finetune(card, finetune_config(cfg.learning_rate, cfg.steps))
    arrays = encode_dataset(card, data)
    state, history = fit(
        method.step,
        method.init(),
        array_batches(arrays, cfg.video_batch_size if model_id in VIDEO_CARDS else cfg.batch_size, seed=cfg.seed + 1),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc=model_id,
    )
    timings["generator_s"] = time.perf_counter() - start
    card = method.card(state)
    if out is not None:
        save_card(card, out)
        final = float(np.mean([h["loss"] for h in history[-100:]]))
        report = {"model_id": model_id, "settings": config_to_dict(cfg), "start_from": START_FROM.get(model_id),
                  "final_loss": final, **timings,
                  "jax": jax.__version__, "backend": jax.default_backend()}
        (out / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")
    return card


def main(argv=None) -> None:
    parser = settings_parser(PretrainConfig, "Pretrain a bundled generator card on the digits world.")
    parser.add_argument("model_id", choices=["flux-t2i", *VIDEO_CARDS])
    args, cfg = parse_settings(parser, PretrainConfig, argv)
    pretrain_generator(args.model_id, args.out, cfg)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
