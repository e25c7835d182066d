"""Reading diffusers / transformers folders into Flax NNX modules by an explicit key mapping.

A folder holds ``config.json`` and its weights as one ``*.safetensors`` file or several shards
listed by a ``*.safetensors.index.json``. A jaxpipe network mirrors the reference's attribute
names, so a parameter's PyTorch key follows from its NNX path by fixed rules
(``torch_key``): ``.../to_q/kernel`` is ``....to_q.weight`` transposed, a convolution kernel is
``.weight`` with its channel axes moved last, a norm ``scale`` or an ``embedding`` is
``.weight``; a network adds ``renames`` (regex → replacement on the PyTorch key) where its names
differ. ``load_into`` checks the whole mapping before it writes anything: missing, unexpected
and mis-shaped keys are one ``KeyMappingError`` naming them.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from jaxpipe.nn.stacked import STACKED

__all__ = [
    "KeyMappingError",
    "read_config",
    "read_tensors",
    "torch_key",
    "to_jax",
    "to_torch",
    "torch_state",
    "load_into",
    "load_module",
    "count_params",
]

Renames = Iterable[tuple[str, str]]


class KeyMappingError(ValueError):
    """A checkpoint does not fit a module: the missing, unexpected and mis-shaped keys, by name.

    Attributes:
      missing: the module's PyTorch keys the checkpoint lacks, sorted.
      unexpected: the checkpoint's keys no parameter uses, sorted.
      misshaped: one line per key whose tensor has the wrong shape, sorted.
    """

    def __init__(self, where: str, missing=(), unexpected=(), misshaped=()):
        self.missing, self.unexpected, self.misshaped = sorted(missing), sorted(unexpected), sorted(misshaped)
        parts = []
        for label, keys in (("missing", self.missing), ("unexpected", self.unexpected), ("mis-shaped", self.misshaped)):
            if keys:
                shown = ", ".join(keys[:12]) + (f", ... ({len(keys) - 12} more)" if len(keys) > 12 else "")
                parts.append(f"{len(keys)} {label} key(s): {shown}")
        super().__init__(f"{where}: checkpoint does not match the module — " + "; ".join(parts))


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict.

    Args:
      folder: a diffusers / transformers model folder.

    Returns:
      The parsed JSON.

    Raises:
      FileNotFoundError: if the folder has no ``config.json`` (naming the folder).
    """
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (expected a diffusers / transformers model folder)")
    return json.loads(path.read_text())


_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def _map_file(file: Path) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file as read-only views into a memory map (no copy: a 24 GB
    shard costs page cache, not RAM; bfloat16 stays bfloat16 via ml_dtypes)."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    data = np.memmap(file, dtype=np.uint8, mode="r", offset=8 + size)
    tensors = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if entry["dtype"] not in _DTYPES:
            raise ValueError(f"{file}: tensor {key} has dtype {entry['dtype']}, which jaxpipe does not read")
        begin, stop = entry["data_offsets"]
        tensors[key] = data[begin:stop].view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def read_tensors(folder: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors weights (one file, or the shards an index lists).

    Args:
      folder: a model folder with ``*.safetensors`` (and optionally a ``*.safetensors.index.json``).

    Returns:
      ``{PyTorch name: np.ndarray}``: read-only memory-mapped views in their stored dtype (bfloat16 via
      ``ml_dtypes``).

    Raises:
      FileNotFoundError: if there are no weights, or the index names a file the folder lacks.
      ValueError: on a tensor dtype jaxpipe does not read.
    """
    folder = Path(folder)
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = json.loads(indexes[0].read_text())["weight_map"]
        files = sorted({folder / name for name in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{folder}: the index names {file.name}, which is not in the folder")
        tensors.update(_map_file(file))
    return tensors


def torch_key(path: tuple[Any, ...], ndim: int, renames: Renames = ()) -> str:
    """The PyTorch state-dict key of the NNX parameter at ``path``.

    The path's parts are joined by ``.``; a ``kernel``, ``scale`` or ``embedding`` leaf becomes
    ``weight``; then ``renames`` are applied in order.

    Args:
      path: the parameter's NNX path, a tuple of attribute names and list indices.
      ndim: the parameter's number of dims (the rules do not depend on it).
      renames: ``(regex, replacement)`` pairs applied with ``re.sub`` to the key, in order.

    Returns:
      The key, e.g. ``"blocks.0.attn.to_q.weight"``.
    """
    *owner, leaf = (str(p) for p in path)
    suffix = {"kernel": "weight", "scale": "weight", "embedding": "weight"}.get(leaf, leaf)
    key = ".".join([*owner, suffix])
    for pattern, replacement in renames:
        key = re.sub(pattern, replacement, key)
    return key


def to_jax(leaf: str, value: np.ndarray) -> np.ndarray:
    """A PyTorch tensor in the layout of the NNX parameter named ``leaf``.

    A linear ``kernel`` is transposed ``(out, in) -> (in, out)``, a convolution kernel
    ``(out, in, *k) -> (*k, in, out)``; anything else is returned as is.

    Args:
      leaf: the parameter's name (the last part of its NNX path).
      value: the PyTorch tensor.

    Returns:
      The tensor in NNX layout (a view where possible).
    """
    if leaf == "kernel":
        if value.ndim == 2:
            return value.T
        if value.ndim >= 3:
            return np.moveaxis(value, (0, 1), (-1, -2))
    return value


def load_into(
    module: nnx.Module,
    tensors: Mapping[str, np.ndarray],
    *,
    renames: Renames = (),
    transforms: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
    where: str = "checkpoint",
    only: Any = nnx.Param,
) -> nnx.Module:
    """Write ``tensors`` (PyTorch keys) into ``module``'s ``nnx.Param``s (those ``only`` selects), in place; returns it.

    ``transforms`` maps a PyTorch key to an extra function applied after the layout change (for a
    tensor whose meaning differs, e.g. a fused projection split in two). Every parameter must
    find its key with the right shape and every tensor must be used, or nothing is written and a
    ``KeyMappingError`` names the offenders.

    Args:
      module: the module (may be abstract, from ``nnx.eval_shape``).
      tensors: ``{PyTorch key: tensor}``.
      renames: ``(regex, replacement)`` pairs for ``torch_key``.
      transforms: PyTorch key -> a function applied after the layout change.
      where: what the error messages name (the folder).
      only: an ``nnx`` filter of the parameters to write (default every ``nnx.Param``; ``lora.LoRAParam``: a
        LoRA adapter file, whose keys name the adapters only).

    Returns:
      ``module``, its params written (cast to each param's dtype).

    Raises:
      KeyMappingError: on missing, unexpected or mis-shaped keys (nothing written).
    """
    renames = tuple(renames)
    transforms = dict(transforms or {})
    state = nnx.state(module, only)
    flat = nnx.to_flat_state(state)
    missing, misshaped, used, updates = [], [], set(), []
    for path, var in flat:
        current = var.get_value()
        shape, dtype = current.shape, current.dtype
        layers = []
        for layer_path, layer_shape in _layer_paths(path, shape):
            key = torch_key(layer_path, len(layer_shape), renames)
            if key not in tensors:
                missing.append(key)
                continue
            used.add(key)
            value = to_jax(str(path[-1]), np.asarray(tensors[key]))
            if key in transforms:
                value = transforms[key](value)
            if tuple(value.shape) != tuple(layer_shape):
                where_ = "/".join(map(str, layer_path))
                misshaped.append(
                    f"{key} {tuple(np.shape(tensors[key]))} -> {tuple(value.shape)} vs {where_} {tuple(layer_shape)}"
                )
                continue
            layers.append(value)
        if len(layers) == len(_layer_paths(path, shape)):
            value = layers[0] if STACKED not in path else np.stack(layers)
            updates.append((var, jnp.asarray(value, dtype)))
    unexpected = set(tensors) - used
    if missing or misshaped or unexpected:
        raise KeyMappingError(where, missing, unexpected, misshaped)
    for var, value in updates:  # the state's Variables are the module's own: this writes the module
        var.set_value(value)
    return module


def _layer_paths(path: tuple[Any, ...], shape: tuple[int, ...]) -> list[tuple[tuple[Any, ...], tuple[int, ...]]]:
    """The per-layer (path, shape) pairs a parameter stands for: itself, or, inside a ``stacked.Stacked``
    (its path holds ``STACKED``), one per layer with the index in the marker's place and the layer axis dropped."""
    if STACKED not in path:
        return [(tuple(path), tuple(shape))]
    at = path.index(STACKED)
    return [((*path[:at], i, *path[at + 1 :]), tuple(shape[1:])) for i in range(shape[0])]


def to_torch(leaf: str, value: np.ndarray) -> np.ndarray:
    """``to_jax``'s inverse: an NNX parameter named ``leaf`` in PyTorch's layout.

    Args:
      leaf: the parameter's name (the last part of its NNX path).
      value: the NNX array.

    Returns:
      The tensor in PyTorch layout (``kernel`` ``(in, out) -> (out, in)``, a conv kernel ``(*k, in, out) -> (out, in, *k)``).
    """
    if leaf == "kernel":
        if value.ndim == 2:
            return value.T
        if value.ndim >= 3:
            return np.moveaxis(value, (-1, -2), (0, 1))
    return value


def torch_state(module: nnx.Module, *, renames: Renames = (), only: Any = nnx.Param) -> dict[str, np.ndarray]:
    """``module``'s parameters as a PyTorch state dict (the keys ``load_into`` reads; a stacked block split
    back into per-layer keys), for saving in a diffusers / transformers folder.

    Args:
      module: the module.
      renames: ``(regex, replacement)`` pairs for ``torch_key``, as loading uses.
      only: an ``nnx`` filter of the parameters to write (default every ``nnx.Param``).

    Returns:
      ``{PyTorch key: contiguous np.ndarray}`` in each parameter's dtype.
    """
    out: dict[str, np.ndarray] = {}
    for path, var in nnx.to_flat_state(nnx.state(module, only)):
        value = np.asarray(var.get_value())
        for i, (layer_path, layer_shape) in enumerate(_layer_paths(path, value.shape)):
            layer = value[i] if STACKED in path else value
            out[torch_key(layer_path, len(layer_shape), renames)] = np.ascontiguousarray(to_torch(str(path[-1]), layer))
    return out


def load_module(
    folder: str | Path,
    build: Callable[[dict[str, Any]], nnx.Module],
    *,
    prepare: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    **kwargs,
) -> nnx.Module:
    """``build(config_json)`` abstractly (``nnx.eval_shape``: no random init of a 12 B network),
    then ``load_into`` it the folder's weights (``kwargs`` as ``load_into``'s). ``prepare`` maps the
    checkpoint's tensors first (tied copies, a hub prefix, buffers that are not parameters).

    The module's non-parameter state must be empty; every parameter comes from the checkpoint.

    Args:
      folder: the model folder (``config.json`` + safetensors weights).
      build: ``build(config_json) -> module``, called under ``nnx.eval_shape``.
      prepare: maps the checkpoint's tensors before loading, or ``None``.
      **kwargs: ``load_into``'s ``renames`` and ``transforms``.

    Returns:
      The loaded module.

    Raises:
      TypeError: if the module holds non-parameter state.
      FileNotFoundError: as ``read_config`` and ``read_tensors``.
      KeyMappingError: as ``load_into``.
    """
    folder = Path(folder)
    config = read_config(folder)
    module = nnx.eval_shape(lambda: build(config))
    rest = nnx.state(module, nnx.Not(nnx.Param))
    if jax.tree.leaves(rest):
        raise TypeError(
            f"{folder}: {type(module).__name__} holds non-parameter state; load_module fills parameters only"
        )
    tensors = read_tensors(folder)
    return load_into(module, tensors if prepare is None else prepare(tensors), where=str(folder), **kwargs)


def count_params(module: nnx.Module) -> int:
    """The number of parameter elements of ``module``.

    Works on an ``nnx.eval_shape`` build: nothing is allocated.

    Args:
      module: the module.

    Returns:
      The total element count of its ``nnx.Param``s.
    """
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
