"""Meshes and sharding rules: JAX's own SPMD, no home-made cluster code.

A mesh has the named axes ``("data", "expert", "model")``. The rules:

- network params carry *logical* axis names, given per network by its file's ``LOGICAL_AXES`` table
  (``(regex fullmatched on the "/"-joined param path, one name per dim)``, first match wins,
  unmatched params replicated). ``Rules`` maps the names to mesh axes: ``FSDP`` splits the model
  width (``embed``) along ``data``; ``TP`` splits attention heads, FFN hidden and vocabulary rows
  along ``model``; ``FSDP_TP`` does both. A mesh axis is used for a dim only when its size divides
  that dim (otherwise the dim is replicated: a 4-way ``model`` axis leaves a 6-row matrix whole),
  and never twice in one array (an ``(embed, embed)`` matrix is split on its first dim only);
- optimiser states mirror their params (Adam's ``mu``/``nu``), their scalars are replicated;
- stacked experts (any array whose leading axis is the expert axis: the ``multi-expert`` card's
  refiner params, their references and their stacked optimiser states) are split along ``expert``;
- rollout batches (prompt ids and labels, leading axis = prompts) are split along ``data``;
- everything else (the frozen components, scalars, PRNG keys) is replicated.

The trainers' steps are unchanged: ``jit`` with these input and output shardings
(``sharded_step``) lets XLA's partitioner gather each FSDP shard where it is used, place the
``vmap`` over experts on the ``expert`` devices and the per-sample work on the ``data`` devices.

The documented path to many hosts; no cluster code of our own. The same code runs on one CPU (a
1×1×1 mesh), on simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``) and
on many processes or hosts:

1. every process calls ``jax.distributed.initialize(coordinator_address, num_processes,
   process_id)`` before anything else touches JAX (on CPU, cross-process collectives go through
   gloo, jax's default ``jax_cpu_collectives_implementation``; GPU/TPU need nothing more);
2. every process builds the same mesh over ``jax.devices()`` (all processes' devices, process 0's
   first) and the same state, placed with ``place(state, state_sharding(...))`` — each process
   keeps only its own shards (a model too big for one host: ``init_sharded``, or fill
   ``abstract_sharded``'s shapes shard by shard);
3. every process feeds its own rows of the batch, ``feed(mesh, local_rows)``
   (``jax.make_array_from_process_local_data`` along ``data``);
4. every process calls the same ``sharded_step``; replicated outputs (metrics) are readable
   everywhere, sharded ones once copied whole (a ``jit`` with replicated ``out_shardings``, or
   ``jax.experimental.multihost_utils.process_allgather``).

``tests/scripts/two_process.py`` does exactly this with two CPU processes on loopback (one
``JointMultiExpertRL`` and one ``FlowGRPO`` step; the results equal a one-process 8-device run's).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxpipe.nn.lora import BASE_LAYER
from jaxpipe.nn.stacked import STACKED

__all__ = [
    "AXES",
    "LOGICAL_NAMES",
    "Rules",
    "REPLICATE",
    "FSDP",
    "TP",
    "FSDP_TP",
    "make_mesh",
    "replicated",
    "expert_sharding",
    "batch_sharding",
    "logical_axes",
    "mesh_spec",
    "param_shardings",
    "opt_state_shardings",
    "state_sharding",
    "joint_state_sharding",
    "shard_module",
    "abstract_sharded",
    "init_sharded",
    "memory_per_device",
    "place",
    "feed",
    "sharded_step",
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
            if axis is not None and axis not in AXES:
                raise ValueError(f"Rules.{name} must be a mesh axis {AXES} or None (got {axis!r})")

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


def make_mesh(
    data: int | None = None, expert: int = 1, model: int = 1, *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A ``(data, expert, model)`` mesh over ``devices``.

    Args:
      data: the ``data`` axis size; ``None``: whatever ``expert`` and ``model`` leave of the devices.
      expert: the ``expert`` axis size, a positive int.
      model: the ``model`` axis size, a positive int.
      devices: the devices, in mesh order (default: ``jax.devices()``, every process's).

    Returns:
      A ``Mesh`` of shape ``(data, expert, model)`` with axis names ``AXES``.

    Raises:
      ValueError: if ``expert`` or ``model`` is not a positive int, or the sizes do not multiply to the
        device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    for name, size in (("expert", expert), ("model", model)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int (got {size!r})")
    if data is None:
        if len(devices) % (expert * model):
            raise ValueError(f"{len(devices)} devices do not split into expert={expert} × model={model}")
        data = len(devices) // (expert * model)
    if data * expert * model != len(devices):
        raise ValueError(
            f"mesh data={data} × expert={expert} × model={model} needs {data * expert * model} devices; have {len(devices)}"
        )
    return Mesh(np.asarray(devices).reshape(data, expert, model), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding where every device holds the whole array.

    Args:
      mesh: the device mesh.

    Returns:
      ``NamedSharding(mesh, PartitionSpec())``.
    """
    return NamedSharding(mesh, PartitionSpec())


def expert_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of stacked experts: the leading (expert) axis split along ``expert``, the rest replicated.

    Args:
      mesh: the device mesh.

    Returns:
      ``NamedSharding(mesh, PartitionSpec("expert"))``.
    """
    return NamedSharding(mesh, PartitionSpec("expert"))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding of a batch: the leading (prompt) axis split along ``data``, the rest replicated.

    Args:
      mesh: the device mesh.

    Returns:
      ``NamedSharding(mesh, PartitionSpec("data"))``.
    """
    return NamedSharding(mesh, PartitionSpec("data"))


def _tree_of(sharding: NamedSharding, tree: Any) -> Any:
    return jax.tree.map(lambda _: sharding, tree)


# ------------------------------------------------------------------------------------ logical axes
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


def _param_state(module_or_state: Any) -> Any:
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

    return jax.tree_util.tree_map_with_path(axes, _param_state(module_or_state))


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


def param_shardings(mesh: Mesh, state: Any, table: Table, rules: Rules, *, skip: int = 0) -> Any:
    """A ``NamedSharding`` per param: ``table``'s logical axes (``logical_axes``) through ``rules`` (``mesh_spec``).

    Args:
      mesh: the device mesh.
      state: an ``nnx.Param`` state, a module (its params), or any pytree of arrays or ``ShapeDtypeStruct``s.
      table: the network's ``LOGICAL_AXES``.
      rules: the logical name -> mesh axis map (``FSDP``, ``TP``, ...).
      skip: leading path keys left out of the matched path (see ``logical_axes``).

    Returns:
      A pytree of ``state``'s (param) structure with one ``NamedSharding`` per leaf.

    Raises:
      ValueError: as ``logical_axes``.
    """
    state = _param_state(state)
    axes = logical_axes(state, table, skip=skip)
    return jax.tree.map(lambda leaf, ax: NamedSharding(mesh, mesh_spec(ax, leaf.shape, mesh, rules)), state, axes)


def opt_state_shardings(mesh: Mesh, opt_state: Any, params: Any, shardings: Any) -> Any:
    """Shardings for an optax state of ``params``, mirroring the params' shardings.

    Every subtree shaped like ``params`` (same tree structure and leaf shapes: Adam's ``mu`` and ``nu``,
    momentum traces) takes ``shardings``; every other leaf (step counts, scalars) is replicated. Works on
    arrays and ``ShapeDtypeStruct``s alike.

    Args:
      mesh: the device mesh.
      opt_state: the optax state (or its ``jax.eval_shape``).
      params: the params the state was initialised from.
      shardings: the params' shardings, a tree matching ``params``.

    Returns:
      A pytree of ``opt_state``'s structure with subtrees of ``shardings`` and replicated leaves.
    """
    structure = jax.tree.structure(params)
    shapes = [tuple(leaf.shape) for leaf in jax.tree.leaves(params)]

    def like_params(node) -> bool:
        if jax.tree.structure(node) != structure:
            return False
        return [tuple(getattr(leaf, "shape", ())) for leaf in jax.tree.leaves(node)] == shapes

    rest = replicated(mesh)
    return jax.tree.map(lambda node: shardings if like_params(node) else rest, opt_state, is_leaf=like_params)


# ----------------------------------------------------------------------------------- train states
def state_sharding(
    mesh: Mesh,
    state: Any,
    table: Table = (),
    rules: Rules = REPLICATE,
    *,
    stacked: tuple[str, ...] = (),
    skip: int = 1,
    frozen_tables: Mapping[str, Table] | None = None,
) -> Any:
    """Shardings for a trainer's ``TrainState`` (``jaxpipe.training.trainer``), same structure.

    Every trained part's params by ``table``/``rules`` (``param_shardings``; ``skip=1``: a part's params
    are ``{component: network params}`` and ``table``, the network's ``LOGICAL_AXES``, matches paths
    inside the component), its optimiser state mirroring them (``opt_state_shardings``); the parts named
    in ``stacked`` (stacked experts, leading axis N: e.g. ``JointMultiExpertRL.stacked``) along
    ``expert``, their optimiser states too; each copy (a reference, an EMA, a teacher) as the trained part
    of its structure (replicated when none has it); ``frozen`` replicated, or by ``frozen_tables``
    (component name -> its network's ``LOGICAL_AXES``: a real card's 4.8 B T5-XXL text encoder); the
    step replicated. The default (no table) replicates the params.

    Args:
      mesh: the device mesh.
      state: a ``TrainState`` (arrays or ``ShapeDtypeStruct``s).
      table: the trained network's ``LOGICAL_AXES`` (default: none, params replicated).
      rules: the logical name -> mesh axis map.
      stacked: names of the parts whose params stack experts on the leading axis.
      skip: leading path keys left out of the matched param path.
      frozen_tables: component name -> ``LOGICAL_AXES`` for frozen components to shard.

    Returns:
      A ``TrainState`` of ``NamedSharding``s, structured like ``state``.

    Raises:
      TypeError: if ``state`` is not a ``TrainState``.
    """
    if not all(hasattr(state, name) for name in ("params", "opt_state", "frozen", "copies", "step")):
        raise TypeError(f"state_sharding expects a jaxpipe.training TrainState (got {type(state).__name__})")
    rest = replicated(mesh)
    params, opt_state = {}, {}
    for part, value in state.params.items():
        if part in stacked:
            params[part] = _tree_of(expert_sharding(mesh), value)
            opt_state[part] = _tree_of(expert_sharding(mesh), state.opt_state[part])
        else:
            params[part] = param_shardings(mesh, value, table, rules, skip=skip)
            opt_state[part] = opt_state_shardings(mesh, state.opt_state[part], value, params[part])
    by_structure = {jax.tree.structure(value): params[part] for part, value in state.params.items()}
    copies = {
        name: by_structure.get(jax.tree.structure(value), _tree_of(rest, value)) for name, value in state.copies.items()
    }
    frozen = _tree_of(rest, state.frozen)
    if frozen_tables and state.frozen is not None:
        frozen = type(state.frozen)(
            {
                name: param_shardings(mesh, value, frozen_tables[name], rules)
                if name in frozen_tables
                else _tree_of(rest, value)
                for name, value in dict(state.frozen).items()
            }
        )
    return type(state)(params, opt_state, frozen, copies, _tree_of(rest, state.step))


def joint_state_sharding(mesh: Mesh, state, table: Table = (), rules: Rules = REPLICATE) -> Any:
    """Shardings for ``JointMultiExpertRL``'s state.

    The stacked refiners (params, references, optimiser states) along ``expert``; the generator (and its
    reference and Adam state) by ``table``/``rules`` (default: replicated); everything else replicated.

    Args:
      mesh: the device mesh.
      state: the trainer's ``TrainState``, with a ``"refiner"`` part of stacked experts.
      table: the generator network's ``LOGICAL_AXES``.
      rules: the logical name -> mesh axis map.

    Returns:
      A ``TrainState`` of ``NamedSharding``s (``state_sharding`` with ``stacked=("refiner",)``).
    """
    return state_sharding(mesh, state, table, rules, stacked=("refiner",))


# ------------------------------------------------------------------------------------- placement
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
        shardings = _tree_of(shardings, tree)
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
    params, rest = jax.jit(build, out_shardings=(shardings, _tree_of(replicated(mesh), rest)))()
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
    data = _tree_of(batch_sharding(mesh), batch)
    return jax.jit(
        step, in_shardings=(state_shardings, data, replicated(mesh)), out_shardings=(state_shardings, replicated(mesh))
    )
