"""One ``JointMultiExpertRL`` step and one ``FlowGRPO`` step over two processes × 4 CPU devices: the
documented many-host path of ``jaxpipe.distributed``, on loopback. tests/test_distributed.py starts it
twice, ``two_process.py <process id> <coordinator port> <out dir>``, with
XLA_FLAGS=--xla_force_host_platform_device_count=4. Each process joins the job, builds the global
8-device meshes, places the same state (keeping its own shards), feeds its own rows of the batch,
runs the same sharded steps as ``eight_devices.py`` (``mesh_steps``) and writes the gathered results
to ``<out dir>/process<id>.npz``; prints one JSON line.
"""

import json
import sys
import time
from pathlib import Path

import jax

PROCESS_ID, PORT, OUT = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
# cross-process CPU collectives: gloo (jax 0.10's default, named so a changed default cannot silently
# break this run); timeouts short so a crashed peer fails the test instead of hanging it
jax.config.update("jax_cpu_collectives_implementation", "gloo")
# No persistent compilation cache here: only process 0 writes it and process 1 missed every entry
# (measured: a warm cache spares process 0 alone, which then waits for process 1); and with
# jax_share_binary_between_hosts (process 0 compiles, process 1 loads its executable) the two never met
# in their first collective on CPU (gloo context timed out after 30 s). Each process compiles its own.
jax.distributed.initialize(
    f"127.0.0.1:{PORT}",
    num_processes=2,
    process_id=PROCESS_ID,
    initialization_timeout=120,
    heartbeat_timeout_seconds=60,
    shutdown_timeout_seconds=60,
)

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import mesh_steps

from jaxpipe import distributed


def main():
    assert jax.process_count() == 2 and jax.device_count() == 8 and jax.local_device_count() == 4, jax.devices()
    start = time.perf_counter()
    method, batch = mesh_steps.joint()
    joint_mesh = distributed.make_mesh(**mesh_steps.JOINT_MESH)
    joint, joint_metrics, _ = mesh_steps.run(method, batch, joint_mesh, mesh_steps.joint_shardings, multi_process=True)
    joint_seconds = time.perf_counter() - start
    method, batch = mesh_steps.flow()
    flow_mesh = distributed.make_mesh(**mesh_steps.FLOW_MESH)
    flow, flow_metrics, placed = mesh_steps.run(method, batch, flow_mesh, mesh_steps.flow_shardings, multi_process=True)
    q = placed.params["generator"]["transformer"]["blocks"][0]["attn"]["q"]["kernel"].get_value()
    results = mesh_steps.summary((joint_mesh, joint, joint_metrics), (flow_mesh, flow, flow_metrics))
    np.savez(OUT / f"process{PROCESS_ID}.npz", **results)
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "devices": jax.device_count(),
                "local_devices": jax.local_device_count(),
                # this process holds half the global mesh: its shards of an FSDP_TP matrix, not the matrix
                "q_local_shards": len(q.addressable_shards),
                "q_fully_addressable": q.is_fully_addressable,
                "seconds": {
                    "joint": joint_seconds,
                    "flow": time.perf_counter() - start - joint_seconds,
                    "cpu": time.process_time(),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
