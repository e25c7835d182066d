"""Word-level tokenizer and a small bidirectional transformer text encoder."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn.layers import MLP, Attention, compute_dtype

__all__ = ["PAD", "UNK", "Tokenizer", "TextEncoderConfig", "TextEncoder", "unknown_words"]

PAD, UNK = "<pad>", "<unk>"
"""The tokenizer's two reserved words: ``<pad>`` (id 0) and ``<unk>`` (id 1)."""


def unknown_words(words, vocabulary) -> str:
    """Every unknown word, with its closest known words, for an error message.

    E.g. ``'rigth' (did you mean 'right'?), 'purpel'``.

    Args:
      words: the unknown words (repeats are listed once).
      vocabulary: the known words.

    Returns:
      One comma-separated string.
    """
    parts = []
    for word in dict.fromkeys(words):
        close = difflib.get_close_matches(word, vocabulary, n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        parts.append(f"{word!r}{hint}")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """Whitespace word tokenizer over a fixed vocabulary; id 0 is ``<pad>``, id 1 is ``<unk>``.

    Hashable, so it can live in a card's static spec.

    Attributes:
      words: the vocabulary; ``<pad>`` and ``<unk>`` are put first if missing.

    Raises:
      ValueError: on duplicate words.
    """

    words: tuple[str, ...]

    def __post_init__(self):
        words = tuple(self.words)
        if words[:2] != (PAD, UNK):
            words = (PAD, UNK) + tuple(w for w in words if w not in (PAD, UNK))
        validate.rule(len(set(words)) == len(words), "tokenizer vocabulary has duplicate words")
        object.__setattr__(self, "words", words)

    @property
    def vocab_size(self) -> int:
        """The number of ids: the words plus ``<pad>`` and ``<unk>``."""
        return len(self.words)

    def _index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def encode(self, texts: str | Sequence[str], max_len: int, *, unknown: str = "error") -> np.ndarray:
        """Token ids ``(B, max_len)`` int32, right-padded with ``<pad>`` (0).

        ``unknown="error"`` raises on a word outside the vocabulary (listing it);
        ``unknown="unk"`` maps such words to ``<unk>``.
        """
        if unknown not in ("error", "unk"):
            raise ValueError(f"unknown must be 'error' or 'unk' (got {unknown!r})")
        texts = [texts] if isinstance(texts, str) else list(texts)
        index = self._index()
        ids = np.zeros((len(texts), max_len), np.int32)
        for row, text in enumerate(texts):
            words = text.lower().split()
            if len(words) > max_len:
                raise ValueError(f"prompt {text!r} has {len(words)} words; max_len is {max_len}")
            missing = [w for w in words if w not in index]
            if missing and unknown == "error":
                vocab = ", ".join(self.words[2:])
                raise ValueError(
                    f"unknown word(s) {unknown_words(missing, self.words[2:])} in prompt {text!r}; the vocabulary is: {vocab}"
                )
            ids[row, : len(words)] = [index.get(w, 1) for w in words]
        return ids

    def decode(self, ids) -> list[str]:
        """Text of each row of ``ids`` (B, L), stopping at nothing and dropping ``<pad>``."""
        return [" ".join(self.words[i] for i in row if i != 0) for row in np.asarray(ids).tolist()]


@dataclasses.dataclass(frozen=True)
class TextEncoderConfig:
    """Sizes of the text encoder.

    Attributes:
      vocab_size: the number of token ids; must match the card's tokenizer.
      dim: the model width (the context width a DiT cross-attends to).
      depth: the number of blocks.
      heads: attention heads.
      max_len: the longest prompt in tokens.
      mlp_ratio: the MLP hidden width as a multiple of ``dim``.
      dtype: the compute dtype's name.
    """

    vocab_size: int
    dim: int = 32
    depth: int = 2
    heads: int = 4
    max_len: int = 8
    mlp_ratio: float = 4.0
    dtype: str = "float32"

    @classmethod
    def tiny(cls, vocab_size: int) -> TextEncoderConfig:
        """The CPU-test size (the defaults) over ``vocab_size`` ids."""
        return cls(vocab_size=vocab_size)

    @classmethod
    def large(cls, vocab_size: int) -> TextEncoderConfig:
        """Width 1024, 12 blocks, 16 heads, 128 tokens, over ``vocab_size`` ids."""
        return cls(vocab_size=vocab_size, dim=1024, depth=12, heads=16, max_len=128)


class _EncoderBlock(nnx.Module):
    def __init__(self, cfg: TextEncoderConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.norm1 = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.attn = Attention(cfg.dim, cfg.heads, dtype=dtype, rngs=rngs)
        self.norm2 = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.mlp = MLP(cfg.dim, int(cfg.dim * cfg.mlp_ratio), dtype=dtype, rngs=rngs)

    def __call__(self, h, mask):
        h = h + self.attn(self.norm1(h), key_mask=mask)
        return h + self.mlp(self.norm2(h))


class TextEncoder(nnx.Module):
    """Token ids ``(B, L)`` -> contextual embeddings ``(B, L, dim)`` (padding masked out of attention)."""

    def __init__(self, cfg: TextEncoderConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = compute_dtype(cfg.dtype)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.dim, dtype=dtype, rngs=rngs)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (cfg.max_len, cfg.dim)) * 0.02)
        self.blocks = nnx.List([_EncoderBlock(cfg, rngs) for _ in range(cfg.depth)])
        self.norm = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """Encodes right-padded token ids.

        Args:
          ids: ``(B, L)`` int ids, ``L <= max_len``; 0 is padding.

        Returns:
          ``(B, L, dim)`` float32.

        Raises:
          ValueError: if ``L > max_len``.
        """
        chex.assert_rank(ids, 2)
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"ids has length {ids.shape[1]}; the encoder's max_len is {self.cfg.max_len}")
        mask = ids != 0
        h = self.embed(ids) + self.pos[: ids.shape[1]].astype(compute_dtype(self.cfg.dtype))
        for block in self.blocks:
            h = block(h, mask)
        return self.norm(h).astype(jnp.float32)
