"""``PromptSet``: the user's N prompts (a list, a ``.txt`` file or a ``.jsonl`` file with metadata), split
into train / held-out parts and cut into endless fixed-shape batches; ``read`` and ``load``."""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from jaxpipe.card import Card
from jaxpipe.program import Program
from jaxpipe.prompts.batch import INT32, Prompts, canonical_metadata, check, tokenize
from jaxpipe.prompts.text import encode_text, text_width, utf8

__all__ = ["PromptSet", "load", "read"]


class PromptSet:
    """An immutable set of N prompts and their numeric metadata ``{name: (N, ...)}``.

    Build one with ``PromptSet.from_list``, ``PromptSet.read`` (``.txt`` / ``.jsonl``) or ``load``.
    Its text width (``width``) is fixed from its longest prompt, so every batch it gives has
    the same shapes.
    """

    __slots__ = ("_texts", "_metadata", "_width", "source")

    def __init__(self, texts: Sequence[str], metadata: Mapping[str, Any] | None = None, *, source: str = "<list>"):
        texts = tuple(texts)
        utf8(texts)
        if not texts:
            raise ValueError(f"a prompt set needs at least one prompt ({source} has none)")
        meta = {}
        for name, value in (metadata or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"metadata names must be non-empty strings (got {name!r})")
            meta[name] = canonical_metadata(name, value, len(texts))
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
        if dtype is np.int64 and array.size and (array.min() < INT32.min or array.max() > INT32.max):
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
