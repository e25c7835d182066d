"""Next-token training of a refiner LM on texts: the rows it reads, its loss, its trainer and what it predicts.

A refiner LM (``jaxpipe.nn.RefinerLM``) speaks a card's tokenizer plus ``<eos>`` (id ``tokenizer.vocab_size``).
A world pretrains one on its own captions: ``sequences`` turns texts into right-padded rows ending in
``<eos>``, ``next_token_loss`` is the cross-entropy of every word after the first (padding masked), and
``NextTokenTrainer`` fits it with ``jaxpipe.training.fit``. ``next_token_probs`` reads what a refiner card's
LM says next after each prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpipe.card import Card
from jaxpipe.nn import RefinerLM, Tokenizer
from jaxpipe.training.loss_trainer import LossTrainer
from jaxpipe.training.optim import Optimizer

__all__ = ["sequences", "text_batches", "next_token_loss", "NextTokenTrainer", "next_token_probs"]


def sequences(tokenizer: Tokenizer, texts: Sequence[str], width: int) -> np.ndarray:
    """LM training rows ``(B, width)`` int32: each text's ids, ``<eos>`` (id ``tokenizer.vocab_size``), then ``<pad>`` (0).

    Args:
        tokenizer: the card's word tokenizer.
        texts: ``B`` texts of its words.
        width: the row length (the text encoder's ``max_len``).

    Returns:
        The token ids, int32 ``(B, width)``.

    Raises:
        ValueError: if a text leaves no room for ``<eos>`` in ``width``.
    """
    ids = tokenizer.encode(list(texts), width)
    lengths = (ids != 0).sum(axis=1)
    if int(lengths.max(initial=0)) >= width:
        raise ValueError(f"a text of {int(lengths.max())} words leaves no room for <eos> in width {width}")
    ids[np.arange(len(ids)), lengths] = tokenizer.vocab_size
    return ids


def text_batches(
    tokenizer: Tokenizer,
    draw: Callable[[int, np.random.Generator], Sequence[str]],
    batch_size: int,
    seed: int,
    width: int,
) -> Iterator[dict[str, jax.Array]]:
    """Endless LM batches ``{"ids": (batch_size, width)}``: batch ``i`` is ``draw(batch_size, default_rng([seed, i]))``.

    Args:
        tokenizer: the card's word tokenizer.
        draw: ``(n, rng) -> n texts``, a world's caption sampler.
        batch_size: texts per batch.
        seed: the run's seed (batch ``i`` depends on ``(seed, i)`` alone, so a resumed run sees the same data).
        width: the row length (the text encoder's ``max_len``).

    Returns:
        An endless iterator of ``{"ids": int32 jax.Array (batch_size, width)}`` (``sequences``).
    """
    i = 0
    while True:
        yield {"ids": jnp.asarray(sequences(tokenizer, draw(batch_size, np.random.default_rng([seed, i])), width))}
        i += 1


def next_token_loss(model: RefinerLM, ids: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross-entropy of right-padded ``ids`` ``(B, L)`` over every non-pad target after the
    first token: ``(loss, {"loss", "accuracy"})``. Pure, differentiable in ``model``.

    Args:
        model: the refiner LM.
        ids: right-padded token ids, int ``(B, L)`` (0: padding).

    Returns:
        The scalar loss and ``{"loss", "accuracy"}`` (accuracy: argmax hits over the same targets).
    """
    mask = ids != 0
    logits = model(ids, mask)[:, :-1]
    targets, weights = ids[:, 1:], mask[:, 1:].astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    count = jnp.maximum(weights.sum(), 1.0)
    loss = jnp.sum(nll * weights) / count
    accuracy = jnp.sum((jnp.argmax(logits, -1) == targets) * weights) / count
    return loss, {"loss": loss, "accuracy": accuracy}


class NextTokenTrainer(LossTrainer):
    """``init(key)``, jitted ``step(state, {"ids": (B, L)}, key)``, ``model(state)``: ``next_token_loss`` training.

    Args:
        model: the refiner LM to train.
        optimizer: its optimiser.
    """

    def __init__(self, model: RefinerLM, optimizer: Optimizer):
        super().__init__(model, lambda m, batch, key: next_token_loss(m, batch["ids"]), optimizer)


@jax.jit
def _last_token_probs(llm: RefinerLM, ids: jax.Array) -> jax.Array:
    lengths = jnp.sum(ids != 0, axis=1)
    logits = llm(ids, ids != 0)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
    return jax.nn.softmax(last, axis=-1)


def next_token_probs(card: Card, prompts: Sequence[str]) -> np.ndarray:
    """``(B, V)`` the card's LM's next-token distribution after each prompt (id ``V - 1`` is ``<eos>``).

    Args:
        card: a refiner card (its ``"llm"``, tokenizer and text encoder's ``max_len``).
        prompts: ``B`` prompts of the card's words.

    Returns:
        The probabilities, float32 NumPy ``(B, V)``.
    """
    ids = jnp.asarray(card.spec.tokenizer.encode(list(prompts), card["text_encoder"].cfg.max_len))
    return np.asarray(_last_token_probs(card["llm"], ids))
