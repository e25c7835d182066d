"""LoRA over a whole network: find its linear layers by PyTorch name, wrap the targeted ones (``apply``), fold
the adapters in (``merge``) or drop them (``unload``); a stacked block is adapted in all its layers or none."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn import hf
from jaxpipe.nn.lora.layer import LoRA, LoRAConfig, LoRAParam
from jaxpipe.nn.stacked import STACKED

__all__ = ["adapter_names", "apply", "has_adapters", "merge", "param_count", "unload"]

NodePath = tuple[Any, ...]


def _child(node: Any, part: Any) -> Any:
    return node[part] if isinstance(part, int) or isinstance(node, Mapping) else getattr(node, part)


def _set_child(node: Any, part: Any, value: Any) -> None:
    if isinstance(part, int) or isinstance(node, Mapping):
        node[part] = value
    else:
        setattr(node, part, value)


def _replace(root: Any, path: NodePath, value: Any) -> None:
    node = root
    for part in path[:-1]:
        node = _child(node, part)
    _set_child(node, path[-1], value)


def _wrappers(root: Any) -> list[tuple[NodePath, LoRA]]:
    """The ``LoRA`` modules of ``root`` with their paths, outermost first."""
    return [(tuple(path), node) for path, node in nnx.iter_graph(root) if isinstance(node, LoRA)]


def _linears(root: Any) -> list[tuple[NodePath, nnx.Module]]:
    """Every linear-like module (a ``kernel`` ``nnx.Param``) of ``root`` (which has no adapters), with its path."""
    return [
        (tuple(path), node)
        for path, node in nnx.iter_graph(root)
        if path and isinstance(node, nnx.Module) and isinstance(getattr(node, "kernel", None), nnx.Param)
    ]


def _layers(path: NodePath, kernel_shape: Sequence[int]) -> list[NodePath]:
    """The per-layer paths a module at ``path`` stands for: itself, or one per layer of its stacked block."""
    if STACKED not in path:
        return [path]
    at = path.index(STACKED)
    return [(*path[:at], i, *path[at + 1 :]) for i in range(kernel_shape[0])]


def _name(path: NodePath) -> str:
    return ".".join(map(str, path))


def _matches(targets: tuple[str, ...] | str, name: str) -> bool:
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _check_linear(path: NodePath, module: nnx.Module) -> None:
    expected = 2 + (STACKED in path)
    shape = tuple(module.kernel.shape)
    if len(shape) != expected:
        what = "a stacked linear layer's (n, din, dout)" if STACKED in path else "a linear layer's (din, dout)"
        raise ValueError(
            f"LoRA: {_name(path)} ({type(module).__name__}) has a kernel of shape {shape}, not {what}: only linear "
            "layers take adapters"
        )


def _draw_a(key: jax.Array, names: Sequence[str], din: int, rank: int, dtype, stacked: bool) -> jax.Array:
    """``A`` for each layer named ``names``, each from its own name's key: ``(din, rank)``, or stacked
    ``(L, din, rank)`` for a scanned stack's kernel ``(L, din, dout)`` (also when ``L == 1``)."""
    bound = 1.0 / math.sqrt(din)  # peft: kaiming_uniform_(a=sqrt(5)) on the (rank, din) weight
    draws = [
        jax.random.uniform(jax.random.fold_in(key, zlib.crc32(n.encode())), (din, rank), dtype, -bound, bound)
        for n in names
    ]
    return jnp.stack(draws) if stacked else draws[0]


def _targets_of(module: Any, config: LoRAConfig) -> tuple[str, ...] | str:
    if config.target_modules is not None:
        return config.target_modules
    targets = getattr(module, "LORA_TARGETS", None)
    if targets is None:
        raise ValueError(
            f"LoRAConfig.target_modules is None and {type(module).__name__} declares no LORA_TARGETS: pass "
            "target_modules (module names, e.g. ('to_q', 'to_k', 'to_v'), or a regex)"
        )
    return targets


def _candidates(linears: Sequence[tuple[NodePath, nnx.Module]], limit: int = 10) -> str:
    names = [_name(_layers(path, m.kernel.shape)[0]) for path, m in linears]
    shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
    return shown or "none"


def apply(module: Any, config: LoRAConfig) -> Any:
    """A copy of ``module`` with a fresh ``LoRA`` adapter on every linear layer ``config`` targets.

    Works under ``nnx.eval_shape`` (an abstract FLUX.1-dev with adapters allocates nothing). The copy
    shares no ``Variable`` with ``module``; its base weights are the same arrays.

    Args:
      module: a network (or any ``nnx`` graph node, e.g. a card's components dict).
      config: the targets, rank, alpha and seed.

    Returns:
      The adapted copy: each targeted layer at its old path is a ``LoRA`` whose ``base_layer`` is the layer.

    Raises:
      ValueError: if ``module`` already has adapters, nothing matches the targets (naming them and some
        candidate layers), a matched module is not a linear layer, or a regex matches only some layers of
        a stacked block.
    """
    if has_adapters(module):
        raise ValueError("LoRA.apply: the module already has adapters: merge or unload them first")
    targets = _targets_of(module, config)
    new = nnx.clone(module)
    linears = _linears(new)
    chosen = []
    for path, layer in linears:
        names = [_name(p) for p in _layers(path, layer.kernel.shape)]
        hits = [_matches(targets, n) for n in names]
        if any(hits) and not all(hits):
            raise ValueError(
                f"LoRA: target_modules {targets!r} match only some layers of the stacked block {_name(path)} "
                f"({sum(hits)} of {len(hits)}); a stacked block takes adapters in every layer or none (build the "
                "network unrolled, scan_layers=False, to adapt single layers)"
            )
        if all(hits):
            _check_linear(path, layer)
            chosen.append((path, layer, names))
    if not chosen:
        raise ValueError(
            f"LoRA: target_modules {targets!r} match no linear layer of {type(module).__name__}; its linear layers "
            f"include: {_candidates(linears)}"
        )
    key = jax.random.key(config.seed)
    alpha = config.rank if config.alpha is None else config.alpha
    for path, layer, names in chosen:
        din = layer.kernel.shape[-2]
        a = _draw_a(key, names, din, config.rank, layer.kernel.dtype, stacked=layer.kernel.ndim > 2)
        _replace(new, path, LoRA(layer, config.rank, alpha, a))
    return new


def has_adapters(module: Any) -> bool:
    """Whether ``module`` holds any ``LoRA`` adapter.

    Args:
      module: a network or any ``nnx`` graph node.

    Returns:
      ``True`` if some layer is wrapped.
    """
    return any(isinstance(node, LoRA) for _, node in nnx.iter_graph(module))


def adapter_names(module: Any, *, renames: hf.Renames = ()) -> tuple[str, ...]:
    """The PyTorch names of the adapted layers, one per layer (a stacked block's layers each), sorted.

    Args:
      module: a network with adapters.
      renames: the network's ``hf`` renames (regex -> replacement on the PyTorch key).

    Returns:
      The names, e.g. ``("transformer_blocks.0.attn.to_q", ...)``.
    """
    return tuple(sorted(name for name, _ in _named_wrappers(module, tuple(renames))))


def param_count(module: Any) -> int:
    """The number of adapter elements (``LoRAParam`` s) of ``module``; works on an ``nnx.eval_shape`` build.

    Args:
      module: a network.

    Returns:
      The total element count of its adapters.
    """
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(module, LoRAParam)))


def merge(module: Any) -> Any:
    """peft's ``merge_and_unload``: a copy with every adapter folded into its base kernel and the wrappers gone.

    Each base kernel becomes ``kernel + (alpha / rank)·A @ B`` (computed in float32, stored in the kernel's
    dtype); the result has the parameter paths of the network before ``apply``. A module without
    adapters comes back as a copy.

    Args:
      module: a network (or graph node) with adapters.

    Returns:
      The merged copy.
    """
    new = nnx.clone(module)
    for path, wrapper in _wrappers(new):
        base = wrapper.base_layer
        kernel = base.kernel[...]
        a, b = wrapper.lora_A.kernel[...].astype(jnp.float32), wrapper.lora_B.kernel[...].astype(jnp.float32)
        base.kernel.set_value((kernel.astype(jnp.float32) + wrapper.scale * jnp.matmul(a, b)).astype(kernel.dtype))
        _replace(new, path, base)
    return new


def unload(module: Any) -> Any:
    """peft's ``unload``: a copy with every adapter dropped, the base weights as they were.

    Args:
      module: a network (or graph node) with adapters.

    Returns:
      The copy without adapters.
    """
    new = nnx.clone(module)
    for path, wrapper in _wrappers(new):
        _replace(new, path, wrapper.base_layer)
    return new


def _named_wrappers(module: Any, renames: tuple) -> Iterator[tuple[str, LoRA]]:
    """Per layer of every adapter: its PyTorch name (renames applied) and the wrapper."""
    for path, wrapper in _wrappers(module):
        for layer in _layers(path, wrapper.base_layer.kernel.shape):
            key = hf.torch_key((*layer, "lora_A", "kernel"), 2, renames)
            yield key.removesuffix(".lora_A.weight"), wrapper
