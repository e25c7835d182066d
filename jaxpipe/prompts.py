"""Prompts as data: a batch that crosses ``jax.jit`` (``Prompts``) and the set it is drawn from (``PromptSet``).

An RL step renders K samples per prompt inside one jitted function, so its prompts travel as
arrays: ``Prompts`` holds a batch of P prompts as the card's token ids ``(P, L)`` int32, the
prompts' UTF-8 bytes ``(P, W)`` uint8 (zero-padded, so host code recovers the exact strings) and
optional numeric ``metadata`` ``{name: (P, ...)}`` (a world's labels, a target score ...).

A ``PromptSet`` is the user's N prompts (``read("prompts.txt")``, ``.jsonl`` with metadata, or a
list), split into train / held-out parts and cut into endless batches of fixed shape::

    train, heldout = prompts.read("prompts.jsonl").split(0.1, seed=0)
    for batch in train.batches(card, prompts_per_step=8, seed=0):   # Prompts, P = 8 rows
        state, metrics = step(state, batch.repeat(K))               # B = 8·K rows, one compile

``tokenize`` gives the ids the card's own serving path gives (its default program's ``bind``), so
the vocabulary and length checks a card serves with apply to training prompts too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.program import Program
from jaxpipe.request import Request

__all__ = [
    "Prompts",
    "PromptSet",
    "check",
    "encode_text",
    "decode_text",
    "text_width",
    "tokenize",
    "read",
    "load",
    "WIDTH_MULTIPLE",
]

WIDTH_MULTIPLE = 64
"""Text widths are rounded up to a multiple of this many bytes (few distinct shapes, few compiles)."""

_INT32 = np.iinfo(np.int32)


# --------------------------------------------------------------------------------------------
# Text <-> bytes
# --------------------------------------------------------------------------------------------


def _utf8(texts: Sequence[str]) -> list[bytes]:
    if isinstance(texts, str):
        raise TypeError(f"expected a sequence of prompt strings, got one string {texts!r}; wrap it in a list")
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"prompt {i} must be a str (got {type(text).__name__})")
        if "\x00" in text:
            raise ValueError(f"prompt {i} ({text!r}) contains a NUL character; prompts are stored zero-padded")
        out.append(text.encode("utf-8"))
    return out


def text_width(texts: Sequence[str]) -> int:
    """The text width for ``texts``: the longest prompt's UTF-8 length rounded up to ``WIDTH_MULTIPLE``.

    Args:
      texts: prompt strings (no NUL characters).

    Returns:
      The width in bytes, a positive multiple of ``WIDTH_MULTIPLE``.

    Raises:
      TypeError: ``texts`` is one string, or holds a non-string.
      ValueError: a prompt contains a NUL.
    """
    longest = max((len(b) for b in _utf8(texts)), default=0)
    return max(1, math.ceil(longest / WIDTH_MULTIPLE)) * WIDTH_MULTIPLE


def encode_text(texts: Sequence[str], width: int) -> np.ndarray:
    """Prompts as their UTF-8 bytes, zero-padded to ``width``.

    Args:
      texts: P prompt strings (no NUL characters).
      width: the row width W in bytes.

    Returns:
      ``(P, width)`` uint8.

    Raises:
      ValueError: a prompt is longer than ``width`` bytes (never truncated) or contains a NUL.
    """
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width <= 0:
        raise ValueError(f"width must be a positive int (got {width!r})")
    encoded = _utf8(texts)
    out = np.zeros((len(encoded), int(width)), np.uint8)
    for i, raw in enumerate(encoded):
        if len(raw) > width:
            raise ValueError(
                f"prompt {i} is {len(raw)} UTF-8 bytes, longer than the text width {width} "
                f"({texts[i][:40]!r}...); prompts are never truncated: use a wider width"
            )
        out[i, : len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_text(array: Any) -> list[str]:
    """The strings of ``(P, W)`` uint8 zero-padded UTF-8 rows (``encode_text``'s inverse).

    Args:
      array: ``(P, W)`` uint8, a host or (concrete) device array.

    Returns:
      P strings, trailing zero bytes dropped.

    Raises:
      TypeError: ``array`` is a tracer (decode on the host).
      ValueError: not a 2-D uint8 array, or a row is not valid UTF-8.
    """
    rows = _host(array, "decode_text")
    if rows.ndim != 2 or rows.dtype != np.uint8:
        raise ValueError(f"decode_text takes (P, W) uint8 rows (got {rows.dtype}{rows.shape})")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(row.tobytes().rstrip(b"\x00").decode("utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"text row {i} is not valid UTF-8: {err}") from None
    return out


def _host(value: Any, what: str) -> np.ndarray:
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{what} reads prompt values and runs on the host, not inside jax.jit / vmap / grad; "
            "call it outside the traced function (or use a host reward: jaxpipe.rewards.host)"
        )
    return np.asarray(value)


# --------------------------------------------------------------------------------------------
# Prompts: a batch that crosses jit
# --------------------------------------------------------------------------------------------


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
        meta = {k: _canonical(k, v, len(texts)) for k, v in (metadata or {}).items()}
        return check(cls(tokenize(card, texts, program=program), encode_text(texts, width), meta))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def strings(self) -> list[str]:
        """The P prompt strings, exactly as given (host-side)."""
        return decode_text(_host(self.text, "Prompts.strings()"))

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


def _is_numeric(dtype) -> bool:
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
        if not hasattr(value, "dtype") or not _is_numeric(value.dtype):
            kind = getattr(value, "dtype", type(value).__name__)
            raise ValueError(f"Prompts.metadata[{name!r}] must be a numeric array (got {kind})")
        if not shape or shape[0] != rows:
            raise ValueError(f"Prompts.metadata[{name!r}] must have one row per prompt, ({rows}, ...) (got {shape})")
    return prompts


# --------------------------------------------------------------------------------------------
# Tokenizing through the card's serving path
# --------------------------------------------------------------------------------------------


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
    _utf8(texts)
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


# --------------------------------------------------------------------------------------------
# PromptSet: the user's prompts
# --------------------------------------------------------------------------------------------


def _canonical(name: str, value: Any, rows: int) -> np.ndarray:
    """A read-only numeric ``(rows, ...)`` metadata array (64-bit values narrowed to 32 bits, as JAX stores them)."""
    array = np.array(value)
    if not _is_numeric(array.dtype):
        raise ValueError(f"metadata {name!r} must be numeric (got {array.dtype})")
    if array.ndim == 0 or array.shape[0] != rows:
        raise ValueError(f"metadata {name!r} must have one row per prompt, ({rows}, ...) (got {array.shape})")
    if array.dtype.kind in "iu" and array.dtype.itemsize == 8:
        if array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
            raise ValueError(f"metadata {name!r} has integers outside int32")
        array = array.astype(np.int32)
    elif array.dtype == np.float64:
        array = array.astype(np.float32)
    array.flags.writeable = False
    return array


class PromptSet:
    """An immutable set of N prompts and their numeric metadata ``{name: (N, ...)}``.

    Build one with ``PromptSet.from_list``, ``PromptSet.read`` (``.txt`` / ``.jsonl``) or ``load``.
    Its text width (``width``) is fixed from its longest prompt, so every batch it gives has
    the same shapes.
    """

    __slots__ = ("_texts", "_metadata", "_width", "source")

    def __init__(self, texts: Sequence[str], metadata: Mapping[str, Any] | None = None, *, source: str = "<list>"):
        texts = tuple(texts)
        _utf8(texts)
        if not texts:
            raise ValueError(f"a prompt set needs at least one prompt ({source} has none)")
        meta = {}
        for name, value in (metadata or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"metadata names must be non-empty strings (got {name!r})")
            meta[name] = _canonical(name, value, len(texts))
        self._texts = texts
        self._metadata = MappingProxyType(meta)
        self._width = text_width(texts)
        self.source = source

    @classmethod
    def from_list(cls, texts: Sequence[str], metadata: Mapping[str, Any] | None = None) -> PromptSet:
        """A set of ``texts`` with optional numeric ``metadata`` ``{name: (N, ...)}``."""
        return cls(texts, metadata)

    @classmethod
    def read(cls, path: str | os.PathLike) -> PromptSet:
        """The prompts of a ``.txt`` or ``.jsonl`` file (see ``jaxpipe.prompts.read``)."""
        return read(path)

    @property
    def texts(self) -> tuple[str, ...]:
        """The N prompt strings, in order."""
        return self._texts

    @property
    def metadata(self) -> Mapping[str, np.ndarray]:
        """Per-prompt numeric metadata, ``{name: (N, ...)}``."""
        return self._metadata

    @property
    def width(self) -> int:
        """The text width W of every batch: the longest prompt's bytes rounded up to ``WIDTH_MULTIPLE``."""
        return self._width

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return f"PromptSet({len(self)} prompts from {self.source}, metadata={sorted(self._metadata)})"

    def take(self, rows: Sequence[int]) -> PromptSet:
        """The prompts at ``rows``, in that order (a new set)."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        return PromptSet(
            [self._texts[i] for i in rows], {k: v[rows] for k, v in self._metadata.items()}, source=self.source
        )

    def split(self, heldout: float | int = 0.1, *, seed: int = 0) -> tuple[PromptSet, PromptSet]:
        """A deterministic ``(train, heldout)`` split.

        Args:
          heldout: a fraction in (0, 1) of the prompts (rounded to the nearest count) or a count.
          seed: ``np.random.default_rng(seed).permutation(N)``'s first ``count`` rows are held out;
            both parts keep the set's order.

        Raises:
          ValueError: a part would be empty, or ``heldout`` is not a fraction or count.
        """
        n = len(self)
        if isinstance(heldout, bool) or not isinstance(heldout, numbers.Real):
            raise ValueError(f"heldout must be a fraction in (0, 1) or a count (got {heldout!r})")
        if isinstance(heldout, numbers.Integral):
            count = int(heldout)
        elif 0 < heldout < 1:
            count = int(math.floor(heldout * n + 0.5))
        else:
            raise ValueError(f"heldout must be a fraction in (0, 1) or an int count (got {heldout!r})")
        if not 1 <= count <= n - 1:
            raise ValueError(
                f"heldout={heldout!r} of {n} prompts holds out {count}; both the train and held-out parts must be "
                f"non-empty (hold out 1..{n - 1} prompts)"
            )
        order = np.random.default_rng(seed).permutation(n)
        return self.take(np.sort(order[count:])), self.take(np.sort(order[:count]))

    def prompts(self, card: Card, *, program: Program | None = None) -> Prompts:
        """All N prompts, in order, as ``Prompts`` for ``card`` (width ``self.width``; each distinct text tokenized once)."""
        distinct = list(dict.fromkeys(self._texts))
        ids = tokenize(card, distinct, program=program)
        row = {text: i for i, text in enumerate(distinct)}
        ids = ids[[row[t] for t in self._texts]]
        return check(Prompts(ids, encode_text(self._texts, self._width), dict(self._metadata)))

    def batches(
        self, card: Card, prompts_per_step: int, *, seed: int = 0, program: Program | None = None
    ) -> Iterator[Prompts]:
        """Endless batches of ``prompts_per_step`` = P prompts for ``card``, each of fixed shapes.

        Epoch ``e`` visits the set in the order ``np.random.default_rng([seed, e]).permutation(N)``;
        the epochs are concatenated and cut into consecutive batches of P, so a last partial batch
        wraps into the next epoch (no prompt is ever dropped; P may exceed N; a batch spanning an
        epoch boundary may hold a prompt twice). Every distinct prompt is
        tokenized once, here, before the first batch (an unknown word raises now).

        Returns:
          an iterator of host ``Prompts``: ids ``(P, L)`` int32, text ``(P, self.width)`` uint8,
          metadata ``{name: (P, ...)}``.
        """
        if (
            isinstance(prompts_per_step, bool)
            or not isinstance(prompts_per_step, numbers.Integral)
            or prompts_per_step <= 0
        ):
            raise ValueError(f"prompts_per_step must be a positive int (got {prompts_per_step!r})")
        every = self.prompts(card, program=program)
        return _batches(every, len(self), int(prompts_per_step), seed)


def _batches(every: Prompts, n: int, size: int, seed: int) -> Iterator[Prompts]:
    pending, epoch = np.zeros((0,), np.int64), 0
    while True:
        while pending.size < size:
            pending = np.concatenate([pending, np.random.default_rng([seed, epoch]).permutation(n)])
            epoch += 1
        rows, pending = pending[:size], pending[size:]
        yield every.take(rows)


# --------------------------------------------------------------------------------------------
# Reading prompt files
# --------------------------------------------------------------------------------------------


def _json_numeric(value: Any, where: str, key: str) -> np.ndarray:
    bad = isinstance(value, (str, dict)) or value is None
    if not bad:
        try:
            array = np.array(value)
        except ValueError:  # ragged lists
            raise ValueError(
                f"{where}: {key!r} must be a number or a fixed-length list of numbers (got a ragged list)"
            ) from None
        bad = array.dtype.kind not in "biuf"
    if bad:
        raise ValueError(f"{where}: {key!r} must be a number or a fixed-length list of numbers (got {value!r})")
    return array


def _read_txt(path: Path) -> PromptSet:
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            texts.append(line)
    if not texts:
        raise ValueError(f"{path}: no prompts (one per line; blank lines and lines starting with '#' are skipped)")
    return PromptSet(texts, source=str(path))


def _read_jsonl(path: Path) -> PromptSet:
    texts, columns, keys, first = [], {}, None, 0
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f'{where}: each line must be a JSON object with a "prompt" (got {type(record).__name__})')
        if "prompt" not in record:
            raise ValueError(f'{where}: no "prompt" key (keys: {sorted(record)})')
        if not isinstance(record["prompt"], str):
            raise ValueError(f'{where}: "prompt" must be a string (got {record["prompt"]!r})')
        names = set(record) - {"prompt"}
        if keys is None:
            keys, first, columns = names, lineno, {k: [] for k in sorted(names)}
        elif names != keys:
            missing, extra = sorted(keys - names), sorted(names - keys)
            detail = "; ".join(
                part
                for part in (f"missing {missing}" if missing else "", f"unexpected {extra}" if extra else "")
                if part
            )
            raise ValueError(f"{where}: metadata keys differ from line {first}'s {sorted(keys)}: {detail}")
        for key in columns:
            value = _json_numeric(record[key], where, key)
            if columns[key] and value.shape != columns[key][0][1].shape:
                raise ValueError(
                    f"{where}: {key!r} has shape {value.shape}, but line {columns[key][0][0]} has {columns[key][0][1].shape}"
                )
            columns[key].append((lineno, value))
        texts.append(record["prompt"])
    if not texts:
        raise ValueError(f'{path}: no prompts (one JSON object with a "prompt" per line)')
    metadata = {}
    for key, values in columns.items():
        kinds = {v.dtype.kind for _, v in values}
        dtype = np.float32 if "f" in kinds else (np.bool_ if kinds == {"b"} else np.int64)
        array = np.stack([v for _, v in values]).astype(dtype)
        if dtype is np.int64 and array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
            raise ValueError(f"{path}: {key!r} has integers outside int32")
        metadata[key] = array
    return PromptSet(texts, metadata, source=str(path))


def read(path: str | os.PathLike) -> PromptSet:
    """The prompts of a file.

    ``.txt``: one prompt per line (stripped); blank lines and lines starting with ``#`` are skipped.
    ``.jsonl``: one JSON object per line with a ``"prompt"`` string; every other key is numeric
    metadata (a number or a fixed-length list of numbers; the same keys on every line): floats
    become float32, ints int32, booleans bool. Blank lines are skipped.

    Args:
      path: a ``.txt`` or ``.jsonl`` file.

    Returns:
      The file's ``PromptSet``.

    Raises:
      FileNotFoundError: no such file.
      ValueError: another suffix, no prompts, or a bad line (naming the file and line number).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".txt", ".jsonl"):
        raise ValueError(
            f"{path}: unsupported prompt file suffix {path.suffix!r}; use .txt (one prompt per line) or .jsonl"
        )
    if not path.is_file():
        raise FileNotFoundError(f"no prompt file {path}")
    return _read_txt(path) if suffix == ".txt" else _read_jsonl(path)


def load(source: str | os.PathLike | Sequence[str] | PromptSet) -> PromptSet:
    """A ``PromptSet`` from a file path (``read``), a list of prompt strings, or a ``PromptSet`` (returned as is).

    Args:
      source: a ``.txt`` / ``.jsonl`` path, a list of prompt strings, or a ``PromptSet``.

    Returns:
      The ``PromptSet``.

    Raises:
      FileNotFoundError: a path that does not exist (a suffix-less string that names no file is
        taken for a mistaken single prompt and says so).
      ValueError: as ``read``.
      TypeError: any other kind of source.
    """
    if isinstance(source, PromptSet):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if isinstance(source, str) and not path.suffix and not path.exists():
            raise FileNotFoundError(f"no prompt file {source!r} (to use a single prompt, pass a list: [{source!r}])")
        return read(path)
    if isinstance(source, Sequence) and all(isinstance(t, str) for t in source):
        return PromptSet.from_list(list(source))
    raise TypeError(f"prompts must be a file path, a list of strings or a PromptSet (got {type(source).__name__})")
