"""Putting arrays where their shardings say: ``place`` a tree, ``feed`` each process's rows, shard a module
(``shard_module``, ``abstract_sharded``, ``init_sharded``), the bytes per device, and ``sharded_step``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jaxpipe.distributed.rules import Rules, Table
from jaxpipe.distributed.shardings import batch_sharding, param_shardings, replicated, state_sharding, tree_of

__all__ = ["abstract_sharded", "feed", "init_sharded", "memory_per_device", "place", "shard_module", "sharded_step"]


def _put(x: Any, sharding: NamedSharding) -> jax.Array:
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    # another process holds part of the mesh: each process builds its own shards from its full local
    # copy (no cross-process check or transfer; every process must hold the same value)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(_put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    value = np.asarray(x)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def place(tree: Any, shardings: Any) -> Any:
    """``tree`` with every leaf moved to its sharding.

    Across processes every process passes the same full ``tree`` and keeps only its own shards (PRNG key
    arrays included).

    Args:
      tree: a pytree of arrays.
      shardings: a tree of shardings matching ``tree``, or one ``NamedSharding`` for every leaf.

    Returns:
      ``tree`` of ``jax.Array``s placed by ``shardings``.
    """
    if isinstance(shardings, NamedSharding):
        shardings = tree_of(shardings, tree)
    return jax.tree.map(_put, tree, shardings)


def feed(mesh: Mesh, local_batch: Any) -> Any:
    """A global batch split along ``data``, built from this process's rows.

    The multi-process form of ``place(batch, batch_sharding(mesh))``
    (``jax.make_array_from_process_local_data``).

    Args:
      mesh: the device mesh.
      local_batch: a pytree of this process's rows (every leaf's leading axis is the batch axis).

    Returns:
      The global batch: a pytree of ``jax.Array``s whose leading axes concatenate every process's rows.
    """
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)


def shard_module(module: nnx.Module, mesh: Mesh, table: Table, rules: Rules) -> nnx.Module:
    """Moves ``module``'s ``nnx.Param``s to their shardings (``param_shardings``), in place.

    Args:
      module: the network.
      mesh: the device mesh.
      table: the network's ``LOGICAL_AXES``.
      rules: the logical name -> mesh axis map.

    Returns:
      ``module`` itself, its params now sharded.
    """
    params = nnx.state(module, nnx.Param)
    nnx.update(module, place(params, param_shardings(mesh, params, table, rules)))
    return module


def abstract_sharded(factory: Callable[[], nnx.Module], mesh: Mesh, table: Table, rules: Rules) -> nnx.Module:
    """``nnx.eval_shape(factory)`` whose params are ``ShapeDtypeStruct``s carrying their shardings.

    Nothing is allocated; the result is ready for ``memory_per_device``, checkpoint restore or
    ``hf.load_module``-style fills.

    Args:
      factory: builds the module (called under ``nnx.eval_shape`` only).
      mesh: the device mesh.
      table: the network's ``LOGICAL_AXES``.
      rules: the logical name -> mesh axis map.

    Returns:
      An abstract module whose ``nnx.Param`` values are sharded ``ShapeDtypeStruct``s.
    """
    abstract = nnx.eval_shape(factory)
    params = nnx.state(abstract, nnx.Param)
    shardings = param_shardings(mesh, params, table, rules)
    nnx.update(
        abstract, jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), params, shardings)
    )
    return abstract


def init_sharded(factory: Callable[[], nnx.Module], mesh: Mesh, table: Table, rules: Rules) -> nnx.Module:
    """``factory()`` initialised straight into its shards (one ``jit`` with output shardings).

    No device ever holds a whole sharded param. Non-param state is replicated.

    Args:
      factory: builds the module; called under ``nnx.eval_shape`` and once under ``jax.jit``.
      mesh: the device mesh.
      table: the network's ``LOGICAL_AXES``.
      rules: the logical name -> mesh axis map.

    Returns:
      The initialised module, params sharded by ``param_shardings``.
    """
    graphdef, params, rest = nnx.split(abstract_sharded(factory, mesh, table, rules), nnx.Param, ...)
    shardings = jax.tree.map(lambda s: s.sharding, params)
    build = lambda: nnx.split(factory(), nnx.Param, ...)[1:]
    params, rest = jax.jit(build, out_shardings=(shardings, tree_of(replicated(mesh), rest)))()
    return nnx.merge(graphdef, params, rest)


def memory_per_device(state_shapes: Any, shardings: Any = None) -> int:
    """Bytes one device holds of ``state_shapes``: the sum of each leaf's shard size.

    Shardings from ``param_shardings`` split evenly, so every device of the mesh holds the same.

    Args:
      state_shapes: a pytree or module of arrays or ``ShapeDtypeStruct``s.
      shardings: a tree of shardings matching ``state_shapes``; default each leaf's own ``.sharding``
        (a leaf without one counts whole).

    Returns:
      The byte count, an int.

    Raises:
      ValueError: if ``shardings`` has a different number of leaves than ``state_shapes``.
    """
    if isinstance(state_shapes, nnx.Module):
        state_shapes = nnx.state(state_shapes)
    leaves = jax.tree.leaves(state_shapes)
    if shardings is None:
        sharding_leaves = [getattr(leaf, "sharding", None) for leaf in leaves]
    else:
        sharding_leaves = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        if len(sharding_leaves) != len(leaves):
            raise ValueError(f"shardings has {len(sharding_leaves)} leaves; state_shapes has {len(leaves)}")
    total = 0
    for leaf, sharding in zip(leaves, sharding_leaves):
        shape = tuple(leaf.shape) if sharding is None else sharding.shard_shape(tuple(leaf.shape))
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


def sharded_step(step: Callable, mesh: Mesh, state, batch, *, shardings: Any = None) -> Callable:
    """``step(state, batch, key) -> (state, metrics)`` jitted over ``mesh``.

    The state keeps its shardings in and out, the batch is split along ``data``, the key and the metrics
    are replicated.

    Args:
      step: the trainer's unjitted fused step (e.g. ``JointMultiExpertRL.step_fn``, ``FlowGRPO.step_fn``).
      mesh: the device mesh.
      state: an example state (its structure decides the default shardings).
      batch: an example batch (its structure decides the batch shardings).
      shardings: the state's shardings (default ``state_sharding(mesh, state)``, everything replicated;
        for rules, pass ``state_sharding(mesh, state, table, rules)``).

    Returns:
      The jitted step, called as ``step(state, batch, key)``.
    """
    state_shardings = state_sharding(mesh, state) if shardings is None else shardings
    data = tree_of(batch_sharding(mesh), batch)
    return jax.jit(
        step, in_shardings=(state_shardings, data, replicated(mesh)), out_shardings=(state_shardings, replicated(mesh))
    )
