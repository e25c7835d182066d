"""Scale-out: one JointMultiExpertRL step on a 2×4 (data × expert) mesh of 8 simulated CPU devices equals the
single-device step, with the stacked refiners really sharded along ``expert``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from jaxpipe import distributed

SCRIPT = Path(__file__).parent / "scripts" / "joint_rl_mesh.py"


def test_mesh_step_on_8_simulated_devices_matches_one_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # the refiners are split along `expert`: 4 experts over 4 expert devices, one each; the generator is replicated
    assert result["refiner_spec"] == "PartitionSpec('expert',)" or result["refiner_spec"] == "P('expert',)"
    assert result["refiner_shard_shape"][0] == 1 and result["refiner_shape"][0] == 4
    assert "expert" in result["opt_spec"] and result["generator_spec"] in ("P()", "PartitionSpec()")
    assert result["devices"] == 8
    # same step: metrics and the gradient moments to float precision; weights within Adam's first-step
    # sensitivity (lr = 1e-5 times the sign of near-zero gradients)
    assert max(result["metric_diffs"].values()) < 1e-5, result["metric_diffs"]
    assert result["refiner_opt_diff"] < 1e-6 and result["generator_opt_diff"] < 1e-6
    assert result["refiners_diff"] < 1e-5 and result["generator_diff"] < 1e-6
    assert result["moved"] > 5e-6  # the step did update the refiners


def test_make_mesh_checks_sizes():
    mesh = distributed.make_mesh()
    assert mesh.axis_names == distributed.AXES and mesh.devices.size == len(jax.devices())
    with pytest.raises(ValueError, match="devices"):
        distributed.make_mesh(data=len(jax.devices()) + 1)
    with pytest.raises(ValueError, match="expert"):
        distributed.make_mesh(expert=0)
