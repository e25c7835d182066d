"""Meshes and shardings: the ``(data, expert, model)`` mesh, the replicated / expert / batch shardings, a
network's parameter shardings through ``Rules``, optimiser states mirroring their params, and whole trainer
states (``state_sharding``, ``joint_state_sharding``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxpipe.distributed.rules import AXES, REPLICATE, Rules, Table, logical_axes, mesh_spec, param_state

__all__ = [
    "batch_sharding",
    "expert_sharding",
    "joint_state_sharding",
    "make_mesh",
    "opt_state_shardings",
    "param_shardings",
    "replicated",
    "state_sharding",
]


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


def tree_of(sharding: NamedSharding, tree: Any) -> Any:
    """``sharding`` for every leaf of ``tree``."""
    return jax.tree.map(lambda _: sharding, tree)


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
    state = param_state(state)
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
            params[part] = tree_of(expert_sharding(mesh), value)
            opt_state[part] = tree_of(expert_sharding(mesh), state.opt_state[part])
        else:
            params[part] = param_shardings(mesh, value, table, rules, skip=skip)
            opt_state[part] = opt_state_shardings(mesh, state.opt_state[part], value, params[part])
    by_structure = {jax.tree.structure(value): params[part] for part, value in state.params.items()}
    copies = {
        name: by_structure.get(jax.tree.structure(value), tree_of(rest, value)) for name, value in state.copies.items()
    }
    frozen = tree_of(rest, state.frozen)
    if frozen_tables and state.frozen is not None:
        frozen = type(state.frozen)(
            {
                name: param_shardings(mesh, value, frozen_tables[name], rules)
                if name in frozen_tables
                else tree_of(rest, value)
                for name, value in dict(state.frozen).items()
            }
        )
    return type(state)(params, opt_state, frozen, copies, tree_of(rest, state.step))


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
