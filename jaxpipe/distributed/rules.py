"""Logical axis names -> mesh axes: ``Rules`` (and the ``FSDP`` / ``TP`` / ``FSDP_TP`` presets), a network's
``LOGICAL_AXES`` table read per parameter (``logical_axes``) and one array's mesh ``PartitionSpec``
(``mesh_spec``); ``jaxpipe.distributed`` tells the whole story."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from jaxpipe import validate
from jaxpipe.nn.lora import BASE_LAYER
from jaxpipe.nn.stacked import STACKED

__all__ = [
    "AXES",
    "FSDP",
    "FSDP_TP",
    "LOGICAL_NAMES",
    "REPLICATE",
    "TP",
    "Rules",
    "Table",
    "logical_axes",
    "mesh_spec",
]

AXES = ("data", "expert", "model")
LOGICAL_NAMES = ("embed", "heads", "mlp", "vocab")

Table = tuple[tuple[str, tuple[str | None, ...]], ...]


@dataclasses.dataclass(frozen=True)
class Rules:
    """Logical axis name -> mesh axis (``None``: replicated).

    Attributes:
      embed: the mesh axis of the model width.
      heads: the mesh axis of the attention features (heads·head_dim).
      mlp: the mesh axis of the FFN hidden features.
      vocab: the mesh axis of the token embedding rows.

    Raises:
      ValueError: if a field is neither a mesh axis of ``AXES`` nor None.
    """

    embed: str | None = None
    heads: str | None = None
    mlp: str | None = None
    vocab: str | None = None

    def __post_init__(self):
        for name in LOGICAL_NAMES:
            axis = getattr(self, name)
            validate.rule(
                axis is None or axis in AXES, f"Rules.{name} must be a mesh axis {AXES} or None (got {axis!r})"
            )

    def mesh_axis(self, logical: str | None) -> str | None:
        """The mesh axis a logical name maps to; ``ValueError`` for a name outside ``LOGICAL_NAMES``."""
        if logical is None:
            return None
        if logical not in LOGICAL_NAMES:
            raise ValueError(f"unknown logical axis {logical!r}; choose from {LOGICAL_NAMES} or None")
        return getattr(self, logical)


REPLICATE = Rules()
FSDP = Rules(embed="data")
TP = Rules(heads="model", mlp="model", vocab="model")
FSDP_TP = Rules(embed="data", heads="model", mlp="model", vocab="model")


@functools.lru_cache(maxsize=64)
def _compiled(table: Table) -> tuple[tuple[re.Pattern, tuple[str | None, ...]], ...]:
    compiled = []
    for pattern, names in table:
        for name in names:
            if name is not None and name not in LOGICAL_NAMES:
                raise ValueError(
                    f"LOGICAL_AXES entry {pattern!r} names unknown logical axis {name!r}; choose from {LOGICAL_NAMES} or None"
                )
        compiled.append((re.compile(pattern), tuple(names)))
    return tuple(compiled)


def _path_str(path: tuple) -> str:
    # an nnx.Variable flattens to its `.value`: the param's path is the variable's
    return jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")


def param_state(module_or_state: Any) -> Any:
    """A module's ``nnx.Param`` state; anything else (a state, a pytree of arrays) as it is."""
    if isinstance(module_or_state, nnx.Module):
        return nnx.state(module_or_state, nnx.Param)
    return module_or_state


def logical_axes(module_or_state: Any, table: Table, *, skip: int = 0) -> Any:
    """Per param, its logical axis names as a ``PartitionSpec`` (one name or None per dim).

    A param takes the names of the first ``table`` entry whose regex fullmatches its "/"-joined path,
    else all None (replicated).

    Args:
      module_or_state: an ``nnx.Module`` (its ``nnx.Param`` state is used), or a state or pytree of arrays
        or ``ShapeDtypeStruct``s.
      table: a network's ``LOGICAL_AXES``: ``((regex, (name or None per dim)), ...)``, first match wins.
      skip: leading path keys left out of the matched path (1 for a card-level ``{component: params}`` state).

    Returns:
      A pytree of the param state's structure with a ``PartitionSpec`` of logical names per leaf.

    Raises:
      ValueError: if an entry names an unknown logical axis, or a different number of axes than the
        param it matches has dims.
    """
    patterns = _compiled(tuple((p, tuple(n)) for p, n in table))

    def axes(path, leaf):
        name, ndim = _path_str(path[skip:]), len(leaf.shape)
        # a LoRA-wrapped layer shards as it did unwrapped; its adapters match no entry (replicated: they are small)
        name = "/".join(part for part in name.split("/") if part != BASE_LAYER)
        if f"/{STACKED}/" in f"/{name}/":
            # a scanned stack's param is its per-layer param with a leading layer axis, which stays whole
            layer = "/".join("0" if part == STACKED else part for part in name.split("/"))
            return PartitionSpec(None, *axes_of(layer, ndim - 1))
        return PartitionSpec(*axes_of(name, ndim))

    def axes_of(name: str, ndim: int) -> tuple[str | None, ...]:
        for pattern, names in patterns:
            if pattern.fullmatch(name):
                if len(names) != ndim:
                    raise ValueError(
                        f"LOGICAL_AXES entry {pattern.pattern!r} gives {len(names)} axes {names} for param {name!r} of {ndim} dims"
                    )
                return names
        return (None,) * ndim

    return jax.tree_util.tree_map_with_path(axes, param_state(module_or_state))


def mesh_spec(axes: PartitionSpec, shape: Sequence[int], mesh: Mesh, rules: Rules) -> PartitionSpec:
    """The mesh ``PartitionSpec`` of an array of ``shape`` whose dims carry the logical names ``axes``.

    Each dim takes its name's mesh axis when that axis divides the dim and no earlier dim uses it, else
    None (replicated); trailing Nones are dropped.

    Args:
      axes: one logical name (or None) per dim, e.g. from ``logical_axes``.
      shape: the array's shape.
      mesh: the device mesh (its axis sizes decide divisibility).
      rules: the logical name -> mesh axis map.

    Returns:
      A ``PartitionSpec`` over mesh axis names.

    Raises:
      ValueError: if ``axes`` holds a name outside ``LOGICAL_NAMES``.
    """
    used, spec = set(), []
    for logical, size in zip(axes, shape):
        axis = rules.mesh_axis(logical)
        if axis is None or axis in used or size % mesh.shape[axis]:
            spec.append(None)
        else:
            used.add(axis)
            spec.append(axis)
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)
