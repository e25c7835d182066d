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

from jaxpipe.distributed.placement import (
    abstract_sharded,
    feed,
    init_sharded,
    memory_per_device,
    place,
    shard_module,
    sharded_step,
)
from jaxpipe.distributed.rules import AXES, FSDP, FSDP_TP, LOGICAL_NAMES, REPLICATE, TP, Rules, logical_axes, mesh_spec
from jaxpipe.distributed.shardings import (
    batch_sharding,
    expert_sharding,
    joint_state_sharding,
    make_mesh,
    opt_state_shardings,
    param_shardings,
    replicated,
    state_sharding,
)

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
