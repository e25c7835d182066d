"""Meshes and sharding rules (DESIGN §11): JAX's own SPMD, no home-made cluster code.

A mesh has the named axes ``("data", "expert", "model")``. The rules:

- stacked experts (any array whose leading axis is the expert axis: the ``multi-expert`` card's
  refiner params, their references and their stacked optimiser states) are split along ``expert``;
- rollout batches (prompt ids and labels, leading axis = prompts) are split along ``data``;
- everything else (the generator, the frozen components, scalars, PRNG keys) is replicated.

The trainer's step is unchanged: ``jit`` with these input and output shardings lets XLA's
partitioner place the ``vmap`` over experts on the ``expert`` devices and the per-sample work on
the ``data`` devices. The same code runs on one CPU (a 1×1×1 mesh), on simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``) and on many hosts: call
``jax.distributed.initialize()`` first on every host, build the mesh over ``jax.devices()`` (all
hosts' devices), and feed each host's slice of the batch with
``jax.make_array_from_process_local_data(batch_sharding(mesh), local_batch)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "AXES",
    "make_mesh",
    "replicated",
    "expert_sharding",
    "batch_sharding",
    "joint_state_sharding",
    "place",
    "sharded_step",
]

AXES = ("data", "expert", "model")


def make_mesh(data: int | None = None, expert: int = 1, model: int = 1, *, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(data, expert, model)`` mesh over ``devices`` (default: every device); ``data`` defaults to
    whatever the other axes leave. Raises ``ValueError`` when the sizes do not multiply to the device count."""
    devices = list(jax.devices() if devices is None else devices)
    for name, size in (("expert", expert), ("model", model)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int (got {size!r})")
    if data is None:
        if len(devices) % (expert * model):
            raise ValueError(f"{len(devices)} devices do not split into expert={expert} × model={model}")
        data = len(devices) // (expert * model)
    if data * expert * model != len(devices):
        raise ValueError(f"mesh data={data} × expert={expert} × model={model} needs {data * expert * model} devices; have {len(devices)}")
    return Mesh(np.asarray(devices).reshape(data, expert, model), AXES)


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def expert_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (expert) axis split along ``expert``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec("expert"))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (prompt) axis split along ``data``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec("data"))


def _tree_of(sharding: NamedSharding, tree: Any) -> Any:
    return jax.tree.map(lambda _: sharding, tree)


def joint_state_sharding(mesh: Mesh, state) -> Any:
    """Shardings for a ``JointRLState``: stacked refiner params, references and optimiser states along
    ``expert``; everything else replicated."""
    experts = expert_sharding(mesh)
    rest = replicated(mesh)
    stacked = ("refiners", "refiner_reference", "refiner_opt")
    return type(state)(**{name: _tree_of(experts if name in stacked else rest, value) for name, value in state._asdict().items()})


def place(tree: Any, shardings: Any) -> Any:
    """``tree`` with every leaf moved to its sharding (``shardings`` a matching tree or one sharding)."""
    if isinstance(shardings, NamedSharding):
        shardings = _tree_of(shardings, tree)
    return jax.tree.map(jax.device_put, tree, shardings)


def sharded_step(step: Callable, mesh: Mesh, state, batch) -> Callable:
    """``step(state, batch, key) -> (state, metrics)`` jitted over ``mesh``: the state keeps its
    shardings (``joint_state_sharding``) in and out, the batch is split along ``data``, the key and
    the metrics are replicated. ``step`` is the trainer's unjitted fused step (e.g.
    ``JointMultiExpertRL.step_fn``)."""
    state_sharding = joint_state_sharding(mesh, state)
    data = _tree_of(batch_sharding(mesh), batch)
    return jax.jit(step, in_shardings=(state_sharding, data, replicated(mesh)), out_shardings=(state_sharding, replicated(mesh)))
