"""Reproducible pretraining of a Mixture-of-Transformers card on the digits world (``bagel-mot``).

    python -m jaxpipe.digits.pretrain.mot --out jaxpipe/digits/assets/bagel-mot
    python -m jaxpipe.digits.pretrain.mot --model-id cosmos3 --steps 3000 --out jaxpipe/digits/assets/cosmos3

The MoT learns its jobs at once, one summed loss per batch of captioned digits (latents by the
bundled ``flux-t2i`` autoencoder for ``bagel-mot``, ``wan-i2v``'s for the video card ``cosmos3``,
which the card shares):

- **generation** (flow matching on the image tokens of the packed sequence) conditioned on the
  caption + ``<eos>`` (a finished thought), a prefix of it (a partial prompt, what the card sees
  without thinking) or nothing (so the card supports guidance);
- **thinking** (next-token loss on those text tokens): completing a prefix into a caption, then
  ``<eos>``;
- **understanding** (``bagel-mot``: next-token loss on ``<bos>`` caption ``<eos>`` with the clean
  image's tokens as context).

Fixed seeds: the same machine reproduces the same weights. Writes the card (the autoencoder by
reference to its base card), ``metrics.jsonl`` and ``pretrain.json``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import cards, samplers, validate
from jaxpipe.card import Card
from jaxpipe.cards import generator, toy_mot, toy_mot_video
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.cards.mot import eos_id
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.digits.pretrain.common import (
    RenderedSettings,
    VideoBatch,
    array_batches,
    digit_videos,
    output_dir,
    run_recipe,
    write_report,
)
from jaxpipe.nn.mot import MoT
from jaxpipe.training.fit import fit
from jaxpipe.training.loss_trainer import LossTrainer

__all__ = [
    "BASES",
    "BASE_COMPONENTS",
    "MoTPretrainConfig",
    "MoTTrainer",
    "caption_ids",
    "generation_text",
    "main",
    "mot_loss",
    "pretrain_mot",
    "training_arrays",
]

BASE_COMPONENTS = ("vae",)
"""The components a MoT card takes from its base card (``BASES``), saved by reference to it."""


@dataclasses.dataclass(frozen=True)
class MoTPretrainConfig(RenderedSettings, VideoBatch):
    """What a MoT pretraining run does; the defaults are the bundled card's settings. ``p_full`` / ``p_empty``:
    the probabilities that an image is generated from its whole caption / from nothing (``generation_text``);
    ``text_weight``: the weight of the next-token losses; ``routing``: ``bagel-mot``'s expert routing.

    Attributes:
        p_full: the probability that an image is generated from its whole caption + ``<eos>``.
        p_empty: the probability that it is generated from no text (``p_full + p_empty <= 1``; otherwise
            from a random non-empty prefix of the caption).
        text_weight: the weight of the thinking and understanding losses.
        routing: ``bagel-mot``'s expert routing (its bundled preset's option).
    """

    p_full: float = 0.5
    p_empty: float = 0.1
    text_weight: float = 1.0
    routing: str = "modality"

    def __post_init__(self):
        super().__post_init__()
        validate.fractions(self, "p_full", "p_empty")
        validate.rule(
            self.p_full + self.p_empty <= 1, f"p_full + p_empty must be <= 1 (got {self.p_full} + {self.p_empty})"
        )
        validate.non_negative(self, "text_weight")


def _next_token_loss(logits: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy and accuracy of ``logits[:, t]`` predicting ``ids[:, t + 1]`` over non-pad targets."""
    targets, mask = ids[:, 1:], (ids[:, 1:] != 0).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    right = (jnp.argmax(logits[:, :-1], axis=-1) == targets).astype(jnp.float32)
    count = jnp.maximum(mask.sum(), 1.0)
    return (nll * mask).sum() / count, (right * mask).sum() / count


def generation_text(words: jax.Array, eos: int, width: int, key: jax.Array, cfg: MoTPretrainConfig) -> jax.Array:
    """Per row, the text the image is generated from ``(B, width)``: the caption ``words`` ``(B, W)``
    (right-padded) + ``<eos>`` (probability ``p_full``), nothing (``p_empty``) or a random non-empty
    prefix of the words.

    Args:
        words: caption token ids ``(B, W)``, right-padded with 0, at least one word per row.
        eos: the ``<eos>`` id.
        width: the text length (``mot.cfg.max_text``), more than ``W`` so that ``<eos>`` fits.
        key: a PRNG key.
        cfg: the run's settings (``p_full``, ``p_empty``).

    Returns:
        The token ids ``(B, width)``, right-padded with 0.
    """
    b, n = words.shape
    k_kind, k_len = jax.random.split(key)
    u = jax.random.uniform(k_kind, (b,))
    count = jnp.sum(words != 0, axis=1)
    cut = jnp.floor(jax.random.uniform(k_len, (b,)) * count).astype(jnp.int32) + 1  # 1..count
    pos = jnp.arange(width)[None, :]
    padded = jnp.pad(words, ((0, 0), (0, width - n)))
    full = jnp.where(pos == count[:, None], eos, padded)
    prefix = jnp.where(pos < cut[:, None], padded, 0)
    text = jnp.where((u < cfg.p_full)[:, None], full, prefix)
    return jnp.where((u >= 1.0 - cfg.p_empty)[:, None], 0, text)


def caption_ids(words: jax.Array, eos: int) -> jax.Array:
    """``<bos>`` (= ``<eos>``) + caption words ``(B, W)`` + ``<eos>``: an understanding target ``(B, W + 2)``.

    Args:
        words: caption token ids ``(B, W)``, right-padded with 0.
        eos: the ``<eos>`` id (also the ``<bos>`` marker).

    Returns:
        The token ids ``(B, W + 2)``, the dtype of ``words``, right-padded with 0.
    """
    b = words.shape[0]
    marker = jnp.full((b, 1), eos, words.dtype)
    padded = jnp.concatenate([marker, words, jnp.zeros((b, 1), words.dtype)], axis=1)
    end = jnp.sum(words != 0, axis=1) + 1
    return jnp.where(jnp.arange(padded.shape[1])[None, :] == end[:, None], eos, padded)


def mot_loss(
    mot: MoT, batch, key: jax.Array, eos: int, cfg: MoTPretrainConfig, understand: bool
) -> tuple[jax.Array, dict]:
    """Flow matching + thinking + understanding on a batch ``{"latents", "words"}`` (pure; differentiable in ``mot``).

    The loss is ``flow + text_weight * (think + understand)``.

    Args:
        mot: the Mixture-of-Transformers.
        batch: ``{"latents": (B, T, h, w, C), "words": (B, W) int}`` (clean latents, right-padded caption ids).
        key: a PRNG key (generation text, σ and noise).
        eos: the ``<eos>`` id.
        cfg: the run's settings.
        understand: add the understanding loss (``bagel-mot``; 0 when False).

    Returns:
        The scalar loss and ``{"loss", "flow", "think", "think_acc", "understand", "understand_acc"}`` scalars.
    """
    x0, words = batch["latents"], batch["words"]
    b = x0.shape[0]
    k_text, k_sigma, k_noise = jax.random.split(key, 3)
    text = generation_text(words, eos, mot.cfg.max_text, k_text, cfg)
    sigma = jax.nn.sigmoid(jax.random.normal(k_sigma, (b,)))
    noise = jax.random.normal(k_noise, x0.shape)
    logits, v = mot.forward(text, text != 0, samplers.noised(x0, noise, sigma), sigma)
    flow = jnp.mean((v - (noise - x0)) ** 2)
    think, think_acc = _next_token_loss(logits, text)
    if understand:
        caption = caption_ids(words, eos)
        understanding, understand_acc = _next_token_loss(mot.understand(caption, caption != 0, x0), caption)
    else:
        understanding = understand_acc = jnp.zeros(())
    loss = flow + cfg.text_weight * (think + understanding)
    return loss, {
        "loss": loss,
        "flow": flow,
        "think": think,
        "think_acc": think_acc,
        "understand": understanding,
        "understand_acc": understand_acc,
    }


class MoTTrainer(LossTrainer):
    """``init()``, jitted ``step(state, {"latents", "words"}, key)``, ``model(state)``: the summed MoT loss."""

    def __init__(self, model: MoT, eos: int, cfg: MoTPretrainConfig = MoTPretrainConfig(), *, understand: bool = True):
        self.cfg, self.eos, self.understand = cfg, eos, understand
        super().__init__(model, lambda m, batch, key: mot_loss(m, batch, key, eos, cfg, understand), cfg.optimizer())


def training_arrays(card: Card, cfg: MoTPretrainConfig, chunk: int = 256) -> dict[str, np.ndarray]:
    """``{"latents": (N, T, h, w, C), "words": (N, W)}``: train-split digits encoded once by the card's
    autoencoder — full-caption images (``bagel-mot``; W = 4) or captioned moving-digit videos
    (``cosmos3``; ``"seven moving right"``, W = 3).

    Args:
        card: a MoT card with its base card's autoencoder.
        cfg: the run's settings (``seed``, ``copies``).
        chunk: images or videos encoded per jitted call.

    Returns:
        The latents and the captions' token ids (NumPy).
    """
    if card.spec.family == toy_mot_video.FAMILY.name:
        data = digit_videos("train", seed=cfg.seed, copies=cfg.copies)
        pixels, field, width = data.video, "video", 3
    else:
        data = digits.augment(*digits.load_images("train"), seed=cfg.seed, copies=cfg.copies)
        pixels, field, width = data.image, "image", 4
    encode = jax.jit(lambda vae, x: generator.TEXT_FLOW.latents({"vae": vae}, {field: x}))
    latents = np.concatenate(
        [np.asarray(encode(card["vae"], jnp.asarray(pixels[i : i + chunk]))) for i in range(0, len(pixels), chunk)]
    )
    return {"latents": latents, "words": card.spec.tokenizer.encode(list(data.caption), width)}


BASES = {"bagel-mot": "flux-t2i", "cosmos3": "wan-i2v"}
"""The bundled card whose autoencoder each MoT card shares."""


def pretrain_mot(
    out: str | Path | None,
    cfg: MoTPretrainConfig = MoTPretrainConfig(),
    *,
    model_id: str = "bagel-mot",
    progress: bool = True,
) -> Card:
    """Train a MoT card (``bagel-mot`` with ``cfg.routing``, or ``cosmos3``) on its bundled base card's
    autoencoder; save it to ``out`` (the autoencoder by reference).

    Args:
        out: the directory to write the card, ``metrics.jsonl`` and ``pretrain.json`` to (``None``: write nothing).
        cfg: the run's settings.
        model_id: ``"cosmos3"`` (the video card), or the id of a ``bagel-mot``-shaped card (``"bagel-mot"``).
        progress: show a progress bar.

    Returns:
        The trained card.
    """
    out = output_dir(out, "metrics.jsonl")
    start = time.perf_counter()
    video = model_id == "cosmos3"
    config = digit_cards.bundled_config("cosmos3") if video else digit_cards.bundled_config("bagel-mot", cfg.routing)
    card = (toy_mot_video if video else toy_mot).build(config, seed=cfg.seed, model_id=model_id)
    base = BASES["cosmos3" if video else "bagel-mot"]
    card = card.replace(**{name: cards.load(base)[name] for name in BASE_COMPONENTS})
    trainer = MoTTrainer(card["transformer"], eos_id(card), cfg, understand=not video)
    state, history = fit(
        trainer.step,
        trainer.init(),
        array_batches(training_arrays(card, cfg), cfg.batch(video), seed=cfg.seed + 1),
        steps=cfg.steps,
        key=jax.random.key(cfg.seed + 1),
        metrics_path=None if out is None else out / "metrics.jsonl",
        desc=model_id,
        progress=progress,
    )
    card = card.replace(transformer=trainer.model(state))
    if out is not None:
        save_card(card, out, base=base, base_components=BASE_COMPONENTS)
        last = history[-100:]
        final = {name: float(np.mean([h[name] for h in last])) for name in ("loss", "flow", "think", "understand")}
        write_report(
            out,
            {
                "model_id": model_id,
                "base": base,
                "settings": config_to_dict(cfg),
                "final": final,
                "params": card["transformer"].param_counts(),
                "train_s": time.perf_counter() - start,
            },
        )
    return card


def main(argv=None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``MoTPretrainConfig`` field, ``--model-id``, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    model_id = {
        "default": "bagel-mot",
        "help": "bagel-mot (or another id: a bagel-mot-shaped card under that id) or cosmos3",
    }
    run_recipe(
        MoTPretrainConfig,
        "Pretrain a Mixture-of-Transformers card on the digits world.",
        pretrain_mot,
        argv,
        options={"--model-id": model_id},
    )


if __name__ == "__main__":
    main()
