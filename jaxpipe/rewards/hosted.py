"""Host rewards: plain Python reward code (PyTorch, OCR, an HTTP server) called from inside ``jax.jit``.

``host(fn)`` wraps ``fn(artifacts, prompts) -> (B,)``, where ``artifacts`` are NumPy arrays and
``prompts`` a ``HostPrompts`` (a ``list[str]`` with ``.metadata``), into a JAX reward that runs
``fn`` through ``jax.pure_callback``: the step that calls it stays one jitted function.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.prompts import Prompts, check, decode_text

__all__ = ["HostPrompts", "HostReward", "host", "VMAP_METHODS"]

VMAP_METHODS = ("broadcast_all", "expand_dims", "sequential")
"""How a host reward behaves under ``jax.vmap`` (``jax.pure_callback``'s ``vmap_method``)."""


class HostPrompts(list):
    """The B prompt strings a host reward scores (a ``list[str]``), plus ``metadata``
    ``{name: (B, ...) np.ndarray}``, row-aligned with the strings."""

    def __init__(self, texts, metadata: Mapping[str, np.ndarray] | None = None):
        super().__init__(texts)
        self.metadata = dict(metadata or {})


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _to_host(leaf: jax.Array) -> jax.Array:
    """What the host sees of one artifact leaf: low-precision floats (bfloat16, float16) as float32."""
    leaf = jnp.asarray(leaf)
    if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype.itemsize < 4:
        return leaf.astype(jnp.float32)
    return leaf


def _flatten_rows(arrays: list[np.ndarray], ndims: list[int]) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """Under ``vmap`` the callback gets extra leading axes: broadcast them to one shape ``lead`` and fold
    them into the rows, ``(*lead, B, ...) -> (prod(lead)·B, ...)``. Returns ``(lead, arrays)``."""
    leads = [a.shape[: a.ndim - n] for a, n in zip(arrays, ndims)]
    lead = np.broadcast_shapes(*leads) if leads else ()
    out = []
    for a, n in zip(arrays, ndims):
        a = np.broadcast_to(a, lead + a.shape[a.ndim - n :])
        out.append(a.reshape((math.prod(lead) * a.shape[len(lead)], *a.shape[len(lead) + 1 :])))
    return lead, out


class HostReward:
    """A host reward as a JAX reward: ``reward(artifacts, prompts) -> (B,)`` float32, via ``jax.pure_callback``.

    Under ``jax.jit`` the wrapped ``fn`` runs once per call of the compiled step. Under ``jax.vmap``
    (e.g. N stacked experts scored at once), ``vmap_method`` decides:

    * ``"broadcast_all"`` (default) and ``"expand_dims"``: ``fn`` runs ONCE with every mapped row
      folded into its batch (``V`` maps of B rows: one call with V·B rows, prompts repeated to match);
    * ``"sequential"``: ``fn`` runs once per mapped element, each with its B rows.

    ``jax.pure_callback`` assumes ``fn`` is pure: JAX may skip a call whose result is unused or
    repeat one, and it cannot differentiate through it (rewards are not differentiated in RL).
    ``fn`` returning another shape than one value per row raises a ``ValueError`` naming it on the
    host, which JAX re-raises from the compiled call as a ``jax.errors.JaxRuntimeError`` carrying it.
    """

    def __init__(
        self, fn: Callable[[Mapping[str, np.ndarray], HostPrompts], Any], *, vmap_method: str = "broadcast_all"
    ):
        if not callable(fn):
            raise TypeError(f"host() wraps a function fn(artifacts, prompts) -> (B,) (got {type(fn).__name__})")
        if vmap_method not in VMAP_METHODS:
            raise ValueError(f"vmap_method must be one of {VMAP_METHODS} (got {vmap_method!r})")
        self.fn = fn
        self.vmap_method = vmap_method
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"host({_name(self.fn)})"

    def __call__(self, artifacts: Mapping[str, Any], prompts: Prompts) -> jax.Array:
        check(prompts)
        flat, treedef = jax.tree_util.tree_flatten_with_path(dict(artifacts))
        rows = len(prompts)
        bad = {
            jax.tree_util.keystr(path): tuple(np.shape(leaf))
            for path, leaf in flat
            if np.ndim(leaf) == 0 or np.shape(leaf)[0] != rows
        }
        if not flat or bad:
            raise ValueError(
                f"host reward {_name(self.fn)}: every artifact needs one row per prompt row ({rows}); "
                f"got {bad or 'no artifacts'}"
            )
        leaves = [_to_host(leaf) for _, leaf in flat]
        names = sorted(prompts.metadata)
        arrays = [*leaves, prompts.text, *(prompts.metadata[k] for k in names)]
        ndims = [np.ndim(a) for a in arrays]
        on_host = functools.partial(self._on_host, treedef, names, ndims, rows)
        return jax.pure_callback(
            on_host, jax.ShapeDtypeStruct((rows,), jnp.float32), *arrays, vmap_method=self.vmap_method
        )

    def _on_host(self, treedef, names: list[str], ndims: list[int], rows: int, *arrays: np.ndarray) -> np.ndarray:
        lead, arrays = _flatten_rows([np.asarray(a) for a in arrays], ndims)
        count = len(arrays) - len(names) - 1
        artifacts = jax.tree.unflatten(treedef, arrays[:count])
        prompts = HostPrompts(decode_text(arrays[count]), dict(zip(names, arrays[count + 1 :])))
        out = self.fn(artifacts, prompts)
        total = math.prod(lead) * rows
        if isinstance(out, Mapping):
            raise ValueError(
                f"host reward {_name(self.fn)} returned parts {sorted(out)}; a host reward returns one ({total},) array "
                "(name several with jaxpipe.rewards.combine)"
            )
        out = np.asarray(out, np.float32)
        if out.shape != (total,):
            raise ValueError(
                f"host reward {_name(self.fn)} returned shape {out.shape}; it must return one reward per rendered row, "
                f"shape ({total},)"
            )
        return out.reshape(*lead, rows)


def host(
    fn: Callable | None = None, *, vmap_method: str = "broadcast_all"
) -> HostReward | Callable[[Callable], HostReward]:
    """Mark ``fn(artifacts, prompts) -> (B,)`` as a host reward (``@host``, ``host(fn)`` or ``@host(vmap_method=...)``).

    Args:
      fn: plain Python; gets NumPy ``artifacts`` (floats of less than 32 bits as float32) and the
        prompts as a ``HostPrompts`` (``list[str]`` with ``.metadata``); returns B rewards.
      vmap_method: behaviour under ``jax.vmap`` (see ``HostReward``).

    Returns:
      a ``HostReward``: a JAX reward, callable inside ``jax.jit``, giving ``(B,)`` float32.
    """
    if fn is None:
        return functools.partial(host, vmap_method=vmap_method)
    return HostReward(fn, vmap_method=vmap_method)
