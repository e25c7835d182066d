"""Feature cache: component outputs keyed by (model id, component, weight version, content hash).

The engine resolves a program's cached nodes (its text encoders) per request through this cache
before anything else runs, so a group of K samples of one prompt encodes the prompt once, and the
empty prompt of classifier-free guidance is encoded once per text-encoder version.

Weight versions are per component of a resident card and owned by the engine
(``Engine.publish``); bumping one component's version invalidates only the entries computed by
that component, and an entry is never returned for a version other than the one that computed it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

__all__ = ["CacheKey", "CacheStats", "FeatureCache", "content_hash"]


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """Where a cached value came from.

    Attributes:
      model: the card's model id.
      component: the component that computed the value.
      version: that component's weight version.
      digest: the content hash of the node and its inputs (``content_hash``).
    """

    model: str
    component: str
    version: int
    digest: str


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """Counters since the cache was made.

    Attributes:
      hits: lookups that found a value.
      misses: lookups that did not.
      invalidated: entries dropped by ``invalidate``.
      evicted: entries dropped by the size limit.
      entries: the current number of entries.
    """

    hits: int
    misses: int
    invalidated: int
    evicted: int
    entries: int


def content_hash(name: str, arrays: Mapping[str, Any]) -> str:
    """SHA-256 over ``name`` and, per slot, each leaf's path, dtype, shape and bytes (host copy).

    Args:
      name: what computes from the arrays (a node's name).
      arrays: slot name -> a pytree of arrays (PRNG keys are hashed by their key data); slots are
        hashed in sorted order.

    Returns:
      The hex digest.
    """
    h = hashlib.sha256(name.encode())
    for key in sorted(arrays):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arrays[key])[0]:
            dtype = getattr(leaf, "dtype", None)
            if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
                leaf = jax.random.key_data(leaf)
            a = np.ascontiguousarray(np.asarray(leaf))
            h.update(f"|{key}{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


class FeatureCache:
    """A bounded LRU map ``CacheKey -> value`` (any pytree of arrays) with hit/miss counters.

    ``max_entries`` bounds memory; the least recently used entry goes first.
    """

    def __init__(self, max_entries: int = 4096):
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive (got {max_entries})")
        self.max_entries = max_entries
        self._entries: OrderedDict[CacheKey, Any] = OrderedDict()
        self._hits = self._misses = self._invalidated = self._evicted = 0

    def get(self, key: CacheKey) -> Any | None:
        """The value cached under ``key`` (counted as a hit), or ``None`` (a miss)."""
        value = self._entries.get(key)
        if value is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return value

    def put(self, key: CacheKey, value: Any) -> None:
        """Caches ``value`` under ``key`` as the most recently used entry, evicting the least recent past
        ``max_entries``."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self._evicted += 1

    def invalidate(self, model: str, components: Iterable[str] | None = None) -> int:
        """Drop the entries of ``model`` (only those of ``components`` if given); returns how many."""
        components = None if components is None else set(components)
        doomed = [k for k in self._entries if k.model == model and (components is None or k.component in components)]
        for key in doomed:
            del self._entries[key]
        self._invalidated += len(doomed)
        return len(doomed)

    def keys(self) -> list[CacheKey]:
        """The cached keys, least recently used first."""
        return list(self._entries)

    def stats(self) -> CacheStats:
        """The counters so far and the current number of entries."""
        return CacheStats(self._hits, self._misses, self._invalidated, self._evicted, len(self._entries))

    def clear(self) -> None:
        """Drops every entry (the counters are kept)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: CacheKey) -> bool:
        return key in self._entries
