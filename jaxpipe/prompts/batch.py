"""``Prompts``: a batch of prompts that crosses ``jit`` (token ids, UTF-8 bytes, numeric metadata), its
checks, and the token ids a card serves each prompt with (``tokenize``)."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.program import Program
from jaxpipe.prompts.text import decode_text, encode_text, host_array, text_width, utf8
from jaxpipe.request import Request

__all__ = ["Prompts", "check", "tokenize"]

INT32 = np.iinfo(np.int32)


def canonical_metadata(name: str, value: Any, rows: int) -> np.ndarray:
    """A read-only numeric ``(rows, ...)`` metadata array (64-bit values narrowed to 32 bits, as JAX stores them)."""
    array = np.array(value)
    if not is_numeric(array.dtype):
        raise ValueError(f"metadata {name!r} must be numeric (got {array.dtype})")
    if array.ndim == 0 or array.shape[0] != rows:
        raise ValueError(f"metadata {name!r} must have one row per prompt, ({rows}, ...) (got {array.shape})")
    if array.dtype.kind in "iu" and array.dtype.itemsize == 8:
        if array.size and (array.min() < INT32.min or array.max() > INT32.max):
            raise ValueError(f"metadata {name!r} has integers outside int32")
        array = array.astype(np.int32)
    elif array.dtype == np.float64:
        array = array.astype(np.float32)
    array.flags.writeable = False
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class Prompts:
    """A batch of P prompts as arrays (a pytree: every field is data, so it crosses ``jax.jit``).

    Attributes:
      ids: ``(P, L)`` int32, the card's token ids (``tokenize``).
      text: ``(P, W)`` uint8, each prompt's UTF-8 bytes zero-padded to W (``encode_text``).
      metadata: ``{name: (P, ...)}`` numeric per-prompt values (possibly empty).

    Construction does not validate (JAX rebuilds pytrees with placeholder leaves); ``check``
    does. ``len``, ``repeat`` and ``take`` only read shapes, so they also work on traced prompts;
    ``strings`` reads values and is host-side only.
    """

    ids: Any
    text: Any
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_texts(
        cls,
        card: Card,
        texts: Sequence[str],
        metadata: Mapping[str, Any] | None = None,
        *,
        width: int | None = None,
        program: Program | None = None,
    ) -> Prompts:
        """Checked ``Prompts`` of ``texts`` for ``card``: ids ``tokenize(card, texts)``, text
        ``encode_text(texts, width)`` (default ``text_width(texts)``) and numpy ``metadata``."""
        texts = list(texts)
        width = text_width(texts) if width is None else width
        meta = {k: canonical_metadata(k, v, len(texts)) for k, v in (metadata or {}).items()}
        return check(cls(tokenize(card, texts, program=program), encode_text(texts, width), meta))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def strings(self) -> list[str]:
        """The P prompt strings, exactly as given (host-side)."""
        return decode_text(host_array(self.text, "Prompts.strings()"))

    def repeat(self, k: int) -> Prompts:
        """Each prompt ``k`` times in a row: row ``p·k + j`` is copy ``j`` of prompt ``p`` (RL's group layout)."""
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k <= 0:
            raise ValueError(f"repeat takes a positive int (got {k!r})")
        return jax.tree.map(lambda a: _xp(a).repeat(a, int(k), axis=0), self)

    def take(self, rows: Any) -> Prompts:
        """The prompts at ``rows`` (int indices, ``(R,)``), in that order."""
        return jax.tree.map(lambda a: _xp(a).take(a, rows, axis=0), self)


jax.tree_util.register_dataclass(Prompts, data_fields=["ids", "text", "metadata"], meta_fields=[])


def _xp(array: Any):
    """numpy for host numpy arrays (no device round trip), jax.numpy otherwise."""
    return np if isinstance(array, np.ndarray) else jnp


def is_numeric(dtype) -> bool:
    return np.dtype(dtype).kind in "biuf"


def check(prompts: Prompts) -> Prompts:
    """Check the ranks, dtypes and row counts of ``prompts`` (shapes only: works on tracers too).

    Args:
      prompts: the ``Prompts`` to check.

    Returns:
      ``prompts`` unchanged.

    Raises:
      TypeError: not a ``Prompts``.
      ValueError: naming the field: ids not ``(P, L)`` int32, text not ``(P, W)`` uint8, or a
        metadata value that is not numeric ``(P, ...)``.
    """
    if not isinstance(prompts, Prompts):
        raise TypeError(f"expected jaxpipe.prompts.Prompts (got {type(prompts).__name__})")
    ids, text = prompts.ids, prompts.text
    if np.ndim(ids) != 2 or np.dtype(ids.dtype) != np.int32:
        raise ValueError(f"Prompts.ids must be (P, L) int32 (got {ids.dtype}{tuple(np.shape(ids))})")
    rows = ids.shape[0]
    if np.ndim(text) != 2 or np.dtype(text.dtype) != np.uint8:
        raise ValueError(f"Prompts.text must be (P, W) uint8 (got {text.dtype}{tuple(np.shape(text))})")
    if text.shape[0] != rows:
        raise ValueError(f"Prompts.text has {text.shape[0]} rows but ids has {rows}")
    if not isinstance(prompts.metadata, Mapping):
        kind = type(prompts.metadata).__name__
        raise ValueError(f"Prompts.metadata must be a mapping name -> (P, ...) array (got {kind})")
    for name, value in prompts.metadata.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"Prompts.metadata names must be non-empty strings (got {name!r})")
        shape = tuple(np.shape(value))
        if not hasattr(value, "dtype") or not is_numeric(value.dtype):
            kind = getattr(value, "dtype", type(value).__name__)
            raise ValueError(f"Prompts.metadata[{name!r}] must be a numeric array (got {kind})")
        if not shape or shape[0] != rows:
            raise ValueError(f"Prompts.metadata[{name!r}] must have one row per prompt, ({rows}, ...) (got {shape})")
    return prompts


def tokenize(card: Card, texts: Sequence[str], *, program: Program | None = None) -> np.ndarray:
    """The token ids ``card`` serves each prompt with: its program's ``bind`` of ``Request(prompt=t)``.

    Args:
      card: a text-conditioned card.
      texts: P prompts.
      program: the program to bind with (default: the card's default program).

    Returns:
      ``(P, L)`` int32, the rows of ``bound.slots["ids"]`` concatenated.

    Raises:
      ValueError: the card's own errors (an unknown word, a missing input ...); a program with
        no ``"ids"`` input; no prompts.
    """
    if program is None:
        from jaxpipe.cards import registry

        program = registry.default_program(card)
    if "ids" not in program.inputs:
        raise ValueError(
            f"card {card.model_id!r}: program {program.name!r} takes no token ids (its inputs are "
            f"{list(program.inputs)}); prompts need a text-conditioned card"
        )
    texts = list(texts)
    utf8(texts)
    if not texts:
        raise ValueError("tokenize needs at least one prompt")
    rows = []
    for text in texts:
        ids = np.asarray(program.bind(card, Request(card.model_id, prompt=text)).slots["ids"])
        if ids.ndim != 2 or ids.shape[0] != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"card {card.model_id!r}: program {program.name!r} bound ids {ids.dtype}{ids.shape}, expected (1, L) ints"
            )
        if rows and ids.shape != rows[0].shape:
            raise ValueError(
                f"card {card.model_id!r} gave prompts ids of different lengths ({rows[0].shape[1]} and {ids.shape[1]} for "
                f"{text!r}); a batch needs one length"
            )
        rows.append(ids)
    return np.concatenate(rows, axis=0).astype(np.int32)
