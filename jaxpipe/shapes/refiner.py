"""Reproducible pretraining of ``shapes-unified``'s refiner LM on the shapes world's own captions.

    python -m jaxpipe.shapes.pretrain shapes-unified --out jaxpipe/shapes/assets/shapes-unified

The LM learns the caption grammar (``grammar``): train-split prompts of the six categories drawn equally
(``grammar.sample``; one-object prompts name a size 30% of the time, as ``shapes-t2i``'s captions do), each
followed by ``<eos>``, by next-token cross-entropy on every position after the first word, padding masked.
Held-out colour-shape pairs never appear. On a prompt that nothing can follow (two things, a relation, a
count) it emits ``<eos>``; on a partial one (``"a red"``) it continues grammatically. A one-object prompt
(``"a red circle"``) is also the start of every two-thing prompt, so there the LM spreads its mass between
``<eos>`` and ``and`` / ``left`` / ``right`` / ``above`` / ``below`` in the proportions of the captions: RL
on the card later teaches it what the reward prefers.

The card is the bundled ``shapes-t2i`` generator (text encoder, DiT, autoencoder; not stored again:
``save_card(..., base="shapes-t2i")``) plus the trained ``llm``. Fixed seeds, so the same machine
reproduces the same weights; writes ``metrics.jsonl`` (one line per step) and ``pretrain.json`` (the
settings, the command, the final loss, the LM's next-token distributions, the timings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import jax
import numpy as np

from jaxpipe import cards, validate
from jaxpipe.card import Card
from jaxpipe.cards import toy_unified
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.nn import RefinerLM, Tokenizer
from jaxpipe.shapes import cards as shape_cards
from jaxpipe.shapes.grammar import CATEGORIES, prompt_set, sample
from jaxpipe.training.fit import fit
from jaxpipe.training.next_token import NextTokenTrainer, next_token_loss, next_token_probs, sequences, text_batches
from jaxpipe.training.optim import Optimizer

__all__ = [
    "MODEL_ID",
    "BASE",
    "BASE_COMPONENTS",
    "RefinerPretrainConfig",
    "captions",
    "sequences",
    "lm_batches",
    "next_token_loss",
    "LMTrainer",
    "next_token_probs",
    "eos_on_test_prompts",
    "pretrain_refiner",
    "main",
]

MODEL_ID = "shapes-unified"
"""The card this recipe trains."""
BASE = "shapes-t2i"
"""The bundled card whose generator ``shapes-unified`` shares (and does not store again)."""
BASE_COMPONENTS = ("text_encoder", "transformer", "vae")
"""The components ``shapes-unified`` takes from ``BASE`` (saved by reference to it)."""


@dataclasses.dataclass(frozen=True)
class RefinerPretrainConfig:
    """What one refiner-LM run does; the defaults are the bundled card's settings.

    Attributes:
        seed: fixes the run (initialisation, captions, batch order).
        steps: optimiser updates.
        batch_size: captions per update.
        learning_rate: the peak rate (linear warm-up over ``warmup_steps``, cosine decay to 10%).
        warmup_steps: steps of the warm-up.
        grad_clip: the global gradient-norm clip.
        size_words: the probability that a one-object caption names the size (``grammar.sample``).

    Raises:
        ValueError: on a count that is not positive, a rate or clip that is not positive, or ``size_words``
            out of ``[0, 1]``.
    """

    seed: int = 0
    steps: int = 1500
    batch_size: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    grad_clip: float = 1.0
    size_words: float = 0.3

    def __post_init__(self):
        validate.counts(self, "seed", "warmup_steps", minimum=0)
        validate.counts(self, "steps", "batch_size")
        validate.positive(self, "learning_rate", "grad_clip")
        validate.fractions(self, "size_words")

    def optimizer(self) -> Optimizer:
        """The run's optimiser: clipped Adam, warm-up then cosine decay to 10% at ``steps``.

        Returns:
            The ``Optimizer``.
        """
        return Optimizer(
            self.learning_rate,
            grad_clip=self.grad_clip,
            schedule="warmup_cosine",
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
        )


# -------------------------------------------------------------------------------------------- data


def captions(n: int, rng: np.random.Generator, size_words: float = 0.3) -> list[str]:
    """``n`` train-split prompt texts, each of a category drawn uniformly from the six (seen pairs only).

    Args:
        n: how many.
        rng: the NumPy generator drawing them (advanced).
        size_words: the probability that a one-object prompt names the size.

    Returns:
        The texts, e.g. ``"a blue square and a yellow triangle"``.
    """
    return [
        sample(CATEGORIES[int(rng.integers(len(CATEGORIES)))], rng, "train", size_words=size_words).text
        for _ in range(n)
    ]


def lm_batches(tokenizer: Tokenizer, cfg: RefinerPretrainConfig, width: int) -> Iterator[dict[str, jax.Array]]:
    """Endless batches ``{"ids": (batch_size, width)}`` of ``captions``; batch ``i`` draws from ``default_rng([seed, i])``.

    Args:
        tokenizer: the card's word tokenizer.
        cfg: the run's settings (``seed``, ``batch_size``, ``size_words``).
        width: the row length.

    Returns:
        An endless iterator of ``{"ids": int32 jax.Array (batch_size, width)}`` (``sequences``).
    """
    return text_batches(tokenizer, lambda n, rng: captions(n, rng, cfg.size_words), cfg.batch_size, cfg.seed, width)


# -------------------------------------------------------------------------------------------- loss


class LMTrainer(NextTokenTrainer):
    """``NextTokenTrainer`` with this recipe's optimiser (``cfg.optimizer()``).

    Args:
        model: the refiner LM to train.
        cfg: the run's settings.
    """

    def __init__(self, model: RefinerLM, cfg: RefinerPretrainConfig = RefinerPretrainConfig()):
        self.cfg = cfg
        super().__init__(model, cfg.optimizer())


# -------------------------------------------------------------------------------------------- evaluation


def _top(probs: np.ndarray, words: Sequence[str], floor: float = 0.01) -> dict[str, float]:
    return {words[i]: round(float(probs[i]), 4) for i in np.argsort(-probs) if probs[i] > floor}


def eos_on_test_prompts(card: Card, prompts: int = 24) -> dict[str, float]:
    """The LM's mean ``p(<eos>)`` after the benchmark's test prompts of each category (``prompt_set(category,
    prompts)``: seen pairs, seed 0).

    Args:
        card: a ``toy_unified`` card of the shapes vocabulary.
        prompts: prompts per category.

    Returns:
        ``{category: mean p(<eos>)}``.
    """
    return {
        c: float(next_token_probs(card, [p.text for p in prompt_set(c, prompts)])[:, -1].mean()) for c in CATEGORIES
    }


def _report(card: Card) -> dict:
    words = card.spec.tokenizer.words + ("<eos>",)
    after = {
        text: _top(next_token_probs(card, [text])[0], words)
        for text in ("a red", "three", "a red circle", "a red circle left")
    }
    return {"next_token": after, "p_eos_test_prompts": {c: round(p, 4) for c, p in eos_on_test_prompts(card).items()}}


# -------------------------------------------------------------------------------------------- the card


def pretrain_refiner(
    out: str | Path | None, cfg: RefinerPretrainConfig = RefinerPretrainConfig(), *, progress: bool = True
) -> Card:
    """Train ``shapes-unified``'s refiner LM in front of the bundled ``shapes-t2i`` generator; save the card to
    ``out`` (the generator by reference to ``shapes-t2i``).

    Args:
        out: the directory for the card, ``metrics.jsonl`` and ``pretrain.json`` (``None``: write nothing).
        cfg: the run's settings.
        progress: show a progress bar.

    Returns:
        The ``shapes-unified`` card with the trained ``llm``.
    """
    out = None if out is None else Path(out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    start = time.perf_counter()
    generator = cards.load(BASE)
    card = toy_unified.build(shape_cards.bundled_config(MODEL_ID), seed=cfg.seed, model_id=MODEL_ID)
    card = card.replace(**{name: generator[name] for name in BASE_COMPONENTS})
    trainer = LMTrainer(card["llm"], cfg)
    state, history = fit(
        trainer.step,
        trainer.init(),
        lm_batches(card.spec.tokenizer, cfg, card["text_encoder"].cfg.max_len),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed),
        desc="shapes-refiner-lm",
        progress=progress,
        metrics_path=None if out is None else out / "metrics.jsonl",
    )
    card = card.replace(llm=trainer.model(state))
    seconds = time.perf_counter() - start
    if out is not None:
        save_card(card, out, base=BASE, base_components=BASE_COMPONENTS)
        report = {
            "model_id": MODEL_ID,
            "base": BASE,
            "command": f"python -m jaxpipe.shapes.pretrain {MODEL_ID} --out {out}",
            "settings": config_to_dict(cfg),
            "final_loss": float(np.mean([h["loss"] for h in history[-100:]])),
            "final_accuracy": float(np.mean([h["accuracy"] for h in history[-100:]])),
            **_report(card),
            "train_s": round(seconds, 1),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        }
        (out / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")
    return card


def main(argv: list[str] | None = None) -> None:
    """``python -m jaxpipe.shapes.pretrain shapes-unified --out DIR [--steps N ...]``: one flag per
    ``RefinerPretrainConfig`` field (``argv``: what follows the card id).

    Args:
        argv: the arguments after ``shapes-unified`` (default: ``sys.argv[1:]``).

    Raises:
        SystemExit: on a bad command line (status 2).
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m jaxpipe.shapes.pretrain {MODEL_ID}",
        description="Pretrain shapes-unified's refiner LM on the shapes world's captions.",
    )
    parser.add_argument("--out", required=True, help="directory to write the card to")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    for field in dataclasses.fields(RefinerPretrainConfig):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(field.default),
            default=field.default,
            help=f"default: {field.default}",
        )
    args = parser.parse_args(argv)
    try:
        cfg = RefinerPretrainConfig(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(RefinerPretrainConfig)}
        )
    except ValueError as error:
        parser.error(str(error))
    pretrain_refiner(args.out, cfg, progress=not args.quiet)
    print(f"wrote {args.out}")
