"""Scale-out on simulated CPU devices. One subprocess with 8 devices runs every
single-process check (``scripts/eight_devices.py``): a ``JointMultiExpertRL`` step (refiners along
``expert``, generator by FSDP rules), a ``FlowGRPO`` step (DiT by FSDP + tensor-parallel rules) and the forward + backward of
the digits DiT, a FLUX-shaped and a Wan-shaped transformer, each equal to one device, with the params
placed as the rules say. Two more processes × 4 devices (``scripts/two_process.py``) run the same two
steps through ``jax.distributed`` on loopback and must reproduce the 8-device numbers. Both runs are one test
with ``-m slow`` (~2 min of compiles; run it when touching ``distributed.py``). The rule logic itself is checked
here by default on abstract meshes and shapes (no devices, no compile)."""

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
import xla_flags
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from jaxpipe import distributed
from jaxpipe.nn import dit

SCRIPTS = Path(__file__).parent / "scripts"


def cpu_env(devices: int) -> dict:
    """The suite's XLA flags (tests/xla_flags.py) and ``devices`` CPU devices. These programs are tiny: LLVM's
    optimisation passes cost far more than running them, and every equality checked holds at any optimisation
    level, within its stated tolerance under any emitter."""
    flags = f"{xla_flags.apply()} --xla_llvm_disable_expensive_passes=true"
    return {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {flags}",
        "JAX_PLATFORMS": "cpu",
    }


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eight_devices(tmp_path: Path) -> dict:
    """The 8-device run, checked: the JointMultiExpertRL and FlowGRPO steps, the digits DiT and the FLUX- /
    Wan-shaped networks; it leaves ``reference.npz`` in ``tmp_path``."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "eight_devices.py"), str(tmp_path), "--all"],
        env=cpu_env(8),
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = last_json(done.stdout)
    check_joint_step(report["joint"])
    check_flow_grpo_step(report["flow"])
    networks = ("dit", "flux", "wan")
    assert sorted(report["networks"]) == sorted(networks)
    for name in networks:
        check_forward_backward(name, report["networks"][name])
    check_abstract_model_memory_and_sharded_init(report["networks"]["dit"])
    return report


# ~2 min; the sharding plans (specs, logical axes, state shardings) are checked by default below
@pytest.mark.slow
def test_sharded_runs_match_one_device_and_two_processes_match_eight_devices(tmp_path):
    """ONE test, so the 8-device run is made once (it is the two processes' reference): every step and network
    sharded on 8 devices equals one device, then the two processes must reproduce its numbers."""
    eight_devices(tmp_path)
    check_two_processes(tmp_path, np.load(tmp_path / "reference.npz"))


def check_joint_step(result: dict) -> None:
    """N = 4 JointMultiExpertRL on a 2×4 (data × expert) mesh == one device."""
    # the refiners are split along `expert`: 4 experts over 4 expert devices, one each; the generator's
    # DiT by FSDP rules (width along data), its Adam moments alike, its small vectors replicated
    assert result["refiner_spec"] == "P('expert',)"
    assert result["refiner_shard_shape"][0] == 1 and result["refiner_shape"][0] == 4
    assert "expert" in result["opt_spec"]
    assert set(result["generator_specs"].values()) == {"P('data',)", "P()"} and len(result["generator_specs"]) == 4
    assert result["generator_specs"]["transformer/time_out/bias"] == "P()"
    assert result["devices"] == 8
    # same step: metrics and the gradient moments to float precision; weights within Adam's first-step
    # sensitivity (lr = 1e-5 times the sign of near-zero gradients)
    assert max(result["metric_diffs"].values()) < 1e-5, result["metric_diffs"]
    assert result["refiner_opt_diff"] < 1e-6 and result["generator_opt_diff"] < 1e-6, result
    assert result["refiners_diff"] < 1e-5 and result["generator_diff"] < 1e-6, result
    assert result["moved"] > 5e-6  # the step did update the refiners


def check_flow_grpo_step(result: dict) -> None:
    """FlowGRPO on a 2×1×4 (data × model) mesh, DiT by FSDP_TP rules == one device."""
    q = "transformer/blocks/0/attn/q/kernel"
    # FSDP over data (the DiT's width) and tensor parallel over model (its heads), for the params, the
    # frozen reference and both Adam moments; the step count and the frozen components replicated
    assert result["params_specs"][q] == result["reference_specs"][q] == "P('data', 'model')", result
    assert result["params_specs"]["transformer/blocks/0/mlp/fc2/kernel"] == "P('model', 'data')"
    assert result["params_specs"]["transformer/blocks/0/attn/out/bias"] == "P()"
    assert {v for k, v in result["opt_specs"].items() if k.endswith(q)} == {"P('data', 'model')"}, result["opt_specs"]
    assert [v for k, v in result["opt_specs"].items() if k.endswith("count")] == ["P()"]
    assert result["frozen_specs"] == ["P()"]
    assert result["q_shape"] == [64, 64] and result["q_shard_shapes"] == [[32, 16]] * 3  # params, Adam mu, nu
    assert max(result["metric_diffs"].values()) < 1e-5, result["metric_diffs"]
    assert result["opt_diff"] < 1e-6 and result["params_diff"] < 1e-5, result
    assert result["moved"] > 5e-6


EXPECTED_PLACEMENTS = {
    "dit": {
        "blocks/0/attn/q/kernel": ("P('data', 'model')", [32, 16]),
        "blocks/0/mlp/fc2/kernel": ("P('model', 'data')", [64, 32]),
        "time_out/kernel": ("P('data',)", [32, 64]),
        "blocks/0/attn/out/bias": ("P()", [64]),
    },
    # scanned blocks (the default): the layer axis stays whole, each layer shards as it would unrolled
    "flux": {"transformer_blocks/stacked/attn/to_q/kernel": ("P(None, 'data', 'model')", [1, 16, 8])},
    "wan": {
        "blocks/stacked/attn1/to_q/kernel": ("P(None, 'data', 'model')", [1, 16, 8]),
        "blocks/stacked/ffn/net/2/kernel": ("P(None, 'model', 'data')", [1, 16, 16]),
    },
}


def check_forward_backward(name: str, result: dict) -> None:
    """value_and_grad through the network on a 2×1×4 mesh under FSDP_TP == one device."""
    assert result["loss_diff"] <= 1e-5 * max(1.0, result["loss"]), (name, result)
    assert result["grad_diff"] <= 1e-5 * max(1.0, result["grad_scale"]), (name, result)
    # every param sits where its table entry and the rules put it, shards = global shape / mesh sizes
    assert result["wrong_placements"] == [] and result["params"] > 20, (name, result["wrong_placements"])
    assert result["sharded_fraction"] > 0.9, name  # the tables cover the big matrices
    for path, (spec, shard) in EXPECTED_PLACEMENTS[name].items():
        assert result["specs"][path] == spec and result["shard_shapes"][path][1] == shard, (name, path, result["specs"])


def check_abstract_model_memory_and_sharded_init(result: dict) -> None:
    assert result["abstract_specs_match"] and result["init_sharded_specs_match"]
    assert result["memory_per_device"] == result["real_bytes_per_device"] < result["whole_bytes"] / 4, result
    assert result["init_sharded_diff"] == 0.0


def check_two_processes(tmp_path: Path, reference) -> None:
    """jax.distributed on loopback: 2 processes × 4 CPU devices (gloo collectives), global 8-device meshes,
    each process feeding its own rows; both steps' metrics, weights and Adam states equal the
    single-process 8-device run's."""
    port = free_port()
    with contextlib.ExitStack() as files:
        procs = []
        for i in range(2):
            out, err = (files.enter_context(open(tmp_path / f"{kind}{i}", "w")) for kind in ("out", "err"))
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(SCRIPTS / "two_process.py"), str(i), str(port), str(tmp_path)],
                    env=cpu_env(4),
                    stdout=out,
                    stderr=err,
                )
            )
        try:
            codes = [p.wait(timeout=2400) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    for i, code in enumerate(codes):
        assert code == 0, (tmp_path / f"err{i}").read_text()[-3000:]
    reports = [last_json((tmp_path / f"out{i}").read_text()) for i in range(2)]
    assert [r["process"] for r in reports] == [0, 1]
    assert all(r["devices"] == 8 and r["local_devices"] == 4 for r in reports)
    # each process holds 4 of the 8 shards of an FSDP_TP matrix, never the whole
    assert all(r["q_local_shards"] == 4 and not r["q_fully_addressable"] for r in reports)
    assert len(reference.files) > 100
    for i in range(2):
        got = np.load(tmp_path / f"process{i}.npz")
        assert sorted(got.files) == sorted(reference.files)
        diffs = {k: float(np.max(np.abs(got[k] - reference[k]), initial=0.0)) for k in reference.files}
        worst = max(diffs, key=diffs.get)
        assert diffs[worst] < 1e-6, (i, worst, diffs[worst])


# ------------------------------------------------------------------ the rules on abstract meshes and shapes
MESH = AbstractMesh((2, 1, 4), distributed.AXES)


def test_mesh_spec_divides_or_replicates_and_never_reuses_an_axis():
    rules = distributed.FSDP_TP
    assert distributed.mesh_spec(P("embed", "heads"), (64, 32), MESH, rules) == P("data", "model")
    assert distributed.mesh_spec(P("embed", "embed"), (64, 64), MESH, rules) == P("data")  # never twice
    assert distributed.mesh_spec(P("heads", "embed"), (6, 64), MESH, rules) == P(None, "data")  # 4 ∤ 6
    assert distributed.mesh_spec(P(None, "mlp"), (3, 8), MESH, distributed.FSDP) == P()
    assert distributed.mesh_spec(P("vocab", "embed"), (8, 4), MESH, distributed.TP) == P("model")
    with pytest.raises(ValueError, match="unknown logical axis"):
        distributed.mesh_spec(P("width"), (8,), MESH, rules)
    with pytest.raises(ValueError, match="mesh axis"):
        distributed.Rules(embed="fsdp")


def test_logical_axes_and_shardings_of_an_abstract_dit_and_its_adam_state():
    model = nnx.eval_shape(lambda: dit.DiT(dit.DiTConfig(depth=1), rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    axes = distributed.logical_axes(model, dit.LOGICAL_AXES)
    assert jax.tree.structure(axes) == jax.tree.structure(params)
    assert axes["blocks"][0]["mlp"]["fc1"]["kernel"].get_value() == P("embed", "mlp")
    assert axes["blocks"][0]["norm_cross"]["scale"].get_value() == P(None)  # unmatched: replicated
    shardings = distributed.param_shardings(MESH, params, dit.LOGICAL_AXES, distributed.FSDP)
    assert shardings["blocks"][0]["attn"]["out"]["kernel"].get_value().spec == P(None, "data")
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    opt = distributed.opt_state_shardings(MESH, jax.eval_shape(tx.init, params), params, shardings)
    adam = opt[1][0]
    assert adam.mu is shardings and adam.nu is shardings and adam.count.spec == P()
    with pytest.raises(ValueError, match="gives 1 axes"):
        distributed.logical_axes(model, ((r"blocks/0/attn/q/kernel", ("embed",)),))
    with pytest.raises(ValueError, match="unknown logical axis"):
        distributed.logical_axes(model, ((r"time_in/kernel", ("embed", "width")),))
    with pytest.raises(TypeError, match="TrainState"):
        distributed.state_sharding(MESH, {"params": params})


def test_state_sharding_of_an_abstract_flow_grpo_state():
    from jaxpipe.training import TrainState

    net = nnx.state(nnx.eval_shape(lambda: dit.DiT(dit.DiTConfig(depth=1), rngs=nnx.Rngs(0))), nnx.Param)
    params, frozen = nnx.State({"transformer": net}), nnx.State({"text": net, "vae": net})
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    state = TrainState(
        {"generator": params},
        {"generator": jax.eval_shape(tx.init, params)},
        frozen,
        {"reference": params},
        jax.ShapeDtypeStruct((), np.int32),
    )
    out = distributed.state_sharding(
        MESH, state, dit.LOGICAL_AXES, distributed.FSDP_TP, frozen_tables={"text": dit.LOGICAL_AXES}
    )
    q = lambda tree: tree["blocks"][0]["attn"]["q"]["kernel"].get_value().spec
    generator = out.params["generator"]
    assert (
        q(generator["transformer"]) == P("data", "model") and out.copies["reference"] is generator
    )  # the copy as its part
    adam = out.opt_state["generator"][1][0]
    assert adam.mu is generator and adam.count.spec == P() and out.step.spec == P()
    assert q(out.frozen["text"]) == P("data", "model") and q(out.frozen["vae"]) == P()  # frozen: only by its own table
    # bytes per device: the FSDP_TP-sharded params a quarter or less of the whole
    whole = distributed.memory_per_device(net)
    assert distributed.memory_per_device(net, generator["transformer"]) < whole / 4


def test_make_mesh_checks_sizes():
    mesh = distributed.make_mesh()
    assert mesh.axis_names == distributed.AXES and mesh.devices.size == len(jax.devices())
    with pytest.raises(ValueError, match="devices"):
        distributed.make_mesh(data=len(jax.devices()) + 1)
    with pytest.raises(ValueError, match="expert"):
        distributed.make_mesh(expert=0)
