"""Reproducible pretraining of the bundled ``unified`` card's refiner LM on digits-world captions.

    python -m jaxpipe.digits.pretrain.lm --out jaxpipe/digits/assets/unified

The LM learns the caption grammar of the digits world: a digit word, then each of
stroke / position / brightness independently with probability ``p_attribute`` (its word uniform),
in the canonical order, then ``<eos>``. Next-token cross-entropy on every position after the
digit word, padding masked. Given ``"seven"`` it continues with a spread of attribute words and
stops; given a full prompt (``"seven thick left bright"``) it emits ``<eos>``. RL later teaches
it which words the reward prefers.

The card is the bundled ``flux-t2i`` generator (text encoder, DiT, autoencoder; not stored again:
``save_card(..., base="flux-t2i")``) plus the trained ``llm``. Fixed seeds, so the same machine
reproduces the same weights; writes ``metrics.jsonl`` (one line per step) and ``pretrain.json``
(settings, final loss, the LM's next-token distributions, timings).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np

from jaxpipe import cards, validate
from jaxpipe.card import Card
from jaxpipe.cards import toy_unified
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.digits.pretrain.common import Settings, output_dir, run_recipe, write_report
from jaxpipe.digits.words import DIGIT_WORDS
from jaxpipe.nn import RefinerLM, Tokenizer
from jaxpipe.training.fit import fit
from jaxpipe.training.next_token import NextTokenTrainer, next_token_loss, next_token_probs, sequences, text_batches

__all__ = [
    "BASE",
    "BASE_COMPONENTS",
    "LMPretrainConfig",
    "LMTrainer",
    "lm_batches",
    "main",
    "next_token_loss",
    "next_token_probs",
    "pretrain_lm",
    "refinement_captions",
    "sequences",
]

BASE = "flux-t2i"
"""The bundled card whose generator the ``unified`` card shares (and does not store again)."""
BASE_COMPONENTS = ("text_encoder", "transformer", "vae")
"""The components the ``unified`` card takes from ``BASE`` (saved by reference to it)."""


@dataclasses.dataclass(frozen=True)
class LMPretrainConfig(Settings):
    """What an LM pretraining run does; the defaults are the bundled card's settings. ``p_attribute``: the
    probability that a caption names each attribute (``refinement_captions``).

    Attributes:
        p_attribute: the probability that a training caption names each attribute, in ``[0, 1]``.

    The other fields are ``Settings``', with this recipe's defaults.
    """

    steps: int = 1200
    batch_size: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 50
    p_attribute: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        validate.fractions(self, "p_attribute")


# -------------------------------------------------------------------------------------------- data


def refinement_captions(n: int, rng: np.random.Generator, p_attribute: float = 0.5) -> list[str]:
    """``n`` captions: a uniform digit word, then each attribute (stroke, position, brightness) present
    with probability ``p_attribute``, its word uniform, in the canonical ``digits.caption`` order.

    Args:
        n: the number of captions.
        rng: the NumPy generator drawing them.
        p_attribute: the probability that a caption names each attribute.

    Returns:
        ``n`` captions, e.g. ``"seven thick bright"``.
    """
    digit = rng.integers(0, len(DIGIT_WORDS), n)
    values = {}
    for name in digits.ATTRIBUTES:
        present = rng.random(n) < p_attribute
        word = rng.integers(0, len(digits.ATTRIBUTE_WORDS[name]), n)
        values[name] = [int(w) if p else None for p, w in zip(present, word)]
    return [digits.caption(int(digit[i]), *(values[a][i] for a in digits.ATTRIBUTES)) for i in range(n)]


def lm_batches(tokenizer: Tokenizer, cfg: LMPretrainConfig, width: int) -> Iterator[dict[str, jax.Array]]:
    """Endless batches ``{"ids": (batch_size, width)}``; batch ``i`` draws from ``default_rng([seed, i])``.

    Args:
        tokenizer: the card's word tokenizer.
        cfg: the run's settings (``seed``, ``batch_size``, ``p_attribute``).
        width: the row length (the text encoder's ``max_len``).

    Returns:
        An endless iterator of ``{"ids": int32 jax.Array (batch_size, width)}`` of ``refinement_captions``
        (``sequences``).
    """
    return text_batches(
        tokenizer, lambda n, rng: refinement_captions(n, rng, cfg.p_attribute), cfg.batch_size, cfg.seed, width
    )


# -------------------------------------------------------------------------------------------- loss


class LMTrainer(NextTokenTrainer):
    """``NextTokenTrainer`` with this recipe's optimiser (``cfg.optimizer()``).

    Args:
        model: the refiner LM to train.
        cfg: the run's settings.
    """

    def __init__(self, model: RefinerLM, cfg: LMPretrainConfig = LMPretrainConfig()):
        self.cfg = cfg
        super().__init__(model, cfg.optimizer())


# -------------------------------------------------------------------------------------------- evaluation


def _report(card: Card) -> dict:
    words = card.spec.tokenizer.words + ("<eos>",)
    after_seven = next_token_probs(card, ["seven"])[0]
    full = [digits.caption(d, s, p, b) for d in range(10) for s in (0, 1) for p in (0, 1, 2) for b in (0, 1)]
    eos_full = next_token_probs(card, full)[:, -1]
    return {
        "next_after_seven": {
            words[i]: round(float(after_seven[i]), 4) for i in np.argsort(-after_seven) if after_seven[i] > 0.005
        },
        "p_eos_full_prompt_mean": float(eos_full.mean()),
        "p_eos_full_prompt_min": float(eos_full.min()),
    }


# -------------------------------------------------------------------------------------------- the card


def pretrain_lm(
    out: str | Path | None, cfg: LMPretrainConfig = LMPretrainConfig(), *, base: str = BASE, progress: bool = True
) -> Card:
    """Train the refiner LM of a ``unified`` card whose generator is the bundled ``base`` card;
    save it to ``out`` (the generator by reference to ``base``).

    Args:
        out: the directory to write the card, ``metrics.jsonl`` and ``pretrain.json`` to (``None``: write nothing).
        cfg: the run's settings.
        base: the bundled card providing the text encoder, DiT and autoencoder.
        progress: show a progress bar.

    Returns:
        The ``unified`` card with the trained ``llm``.
    """
    out = output_dir(out, "metrics.jsonl")
    start = time.perf_counter()
    generator = cards.load(base)
    card = toy_unified.build(digit_cards.bundled_config("unified"), seed=cfg.seed, model_id="unified")
    card = card.replace(**{name: generator[name] for name in BASE_COMPONENTS})
    trainer = LMTrainer(card["llm"], cfg)
    width = card["text_encoder"].cfg.max_len
    state, history = fit(
        trainer.step,
        trainer.init(),
        lm_batches(card.spec.tokenizer, cfg, width),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc="refiner-lm",
        progress=progress,
    )
    card = card.replace(llm=trainer.model(state))
    seconds = time.perf_counter() - start
    if out is not None:
        save_card(card, out, base=base, base_components=BASE_COMPONENTS)
        final = float(np.mean([h["loss"] for h in history[-100:]]))
        write_report(
            out,
            {
                "model_id": card.model_id,
                "base": base,
                "settings": config_to_dict(cfg),
                "final_loss": final,
                **_report(card),
                "train_s": seconds,
            },
        )
    return card


def main(argv=None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``LMPretrainConfig`` field, ``--base``, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(
        LMPretrainConfig,
        "Pretrain the bundled unified card's refiner LM on digits-world captions.",
        pretrain_lm,
        argv,
        options={"--base": {"default": BASE, "help": "bundled card providing the text encoder, DiT and autoencoder"}},
    )


if __name__ == "__main__":
    main()
