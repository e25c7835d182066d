"""Fast checks of the benchmark scripts (their timings are never tests)."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def test_denoise_torch_port_matches_jax():
    """The PyTorch DiT the denoise benchmark times against is the same network as jaxpipe's."""
    pytest.importorskip("torch")
    bench = _load("denoise")
    errors = bench.parity_check(tol=1e-4, layer_tol=2e-5)  # raises AssertionError on a mismatch
    assert max(errors["velocity"], errors["trajectory"]) < 1e-4
    assert max(errors["mlp"], errors["norm"], errors["cross"]) < 2e-5
    assert errors["velocity_scale"] > 0.1  # the zero-initialised output layers really were filled


def test_rl_step_parity_check_catches_a_different_rollout():
    """The RL-step benchmark refuses to time a Python-driven rollout that is not the jitted one."""
    bench = _load("rl_step")
    ref = {"log_prob": np.zeros((2, 3), np.float32), "tokens": np.arange(4)}
    assert bench.check_same_rollout(ref, {"log_prob": np.full((2, 3), 5e-6, np.float32), "tokens": np.arange(4)})[
        "['log_prob']"
    ] == pytest.approx(5e-6)
    with pytest.raises(AssertionError, match="log_prob"):
        bench.check_same_rollout(ref, {"log_prob": np.full((2, 3), 1e-4, np.float32), "tokens": np.arange(4)})
    with pytest.raises(AssertionError, match="tokens"):
        bench.check_same_rollout(ref, {"log_prob": ref["log_prob"], "tokens": np.arange(4)[::-1]})


@pytest.mark.slow  # the RL steps it times are compiled and tested in test_flow_grpo.py and test_unified_rl.py
def test_rl_step_quick_smoke(tmp_path):
    """``rl_step.py --quick`` end to end for FlowGRPO and joint UnifiedRL, in one fresh process compiling at XLA
    optimisation level 0 (the smoke test times nothing, and compiling the RL steps is most of its cost): driven
    rollout == jitted rollout for both (or it exits non-zero), section written with both rows."""
    out = tmp_path / "RESULTS.md"
    fast_compile = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {fast_compile}".strip()}
    cmd = [sys.executable, str(BENCHMARKS / "rl_step.py"), "--quick", "--methods", "flowgrpo", "unified"]
    done = subprocess.run([*cmd, "--results", str(out)], env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]  # fails if driven != jitted rollout
    text = out.read_text()
    assert "<!-- BEGIN rl_step -->" in text and "<!-- END rl_step -->" in text
    for row in ("FlowGRPO", "UnifiedRL (joint)"):
        assert f"| {row} | 1 × 2 (2) | 2 |" in text, text


def test_joint_rl_check_catches_a_different_update():
    """The N-way benchmark refuses to time a per-expert loop whose update is not the vmapped one."""
    bench = _load("joint_rl")
    stacked = {"w": np.zeros((2, 3), np.float32), "loss": np.zeros(2, np.float32)}
    same = [{"w": np.full(3, 5e-7, np.float32), "loss": np.float32(0)} for _ in range(2)]
    assert bench.check_same_update(stacked, same) == pytest.approx(5e-7)
    off = [same[0], {"w": np.zeros(3, np.float32), "loss": np.float32(1e-5)}]
    with pytest.raises(AssertionError, match=r"expert 1 \['loss'\]"):
        bench.check_same_update(stacked, off)


@pytest.mark.slow
def test_joint_rl_quick_smoke(tmp_path):
    """``joint_rl.py --quick`` end to end (N = 1, 2) in a fresh process compiling at XLA optimisation level 0:
    vmapped update == per-expert loop within 1e-6 (or it exits non-zero), section written. Slow (~26 s of
    CPU): the property it enforces is tested in-process by test_joint_rl.py, and its check by the test above."""
    out = tmp_path / "RESULTS.md"
    fast_compile = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {fast_compile}".strip()}
    cmd = [sys.executable, str(BENCHMARKS / "joint_rl.py"), "--quick", "--results", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    text = out.read_text()
    assert "<!-- BEGIN joint_rl -->" in text and "<!-- END joint_rl -->" in text
    assert "| 1 × 2 (2) | 1 |" in text and "| 1 × 2 (2) | 2 |" in text


@pytest.mark.slow  # ~18 s; run it before spending device time (the script only runs on device sessions)
def test_device_quick_smoke(tmp_path):
    """``device.py`` on the CPU in fresh processes compiling at XLA optimisation level 0. With no time left every
    section is recorded as skipped for the budget; ``--quick --sections flux`` runs the FLUX section end to end
    (tiny config): the torch contender is checked to be jaxpipe's network (or skipped: not installed), the JAX
    step / driven / fused contenders and torch eager run, torch.compile and the cuDNN-attention section are
    skipped with a reason, and the JSON and the markdown section go to tmp_path, leaving benchmarks/RESULTS.md
    alone."""
    import json

    fast_compile = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {fast_compile}".strip()}
    results_before = (BENCHMARKS / "RESULTS.md").read_bytes()
    script = [sys.executable, str(BENCHMARKS / "device.py"), "--quick"]

    out = tmp_path / "none.json"
    done = subprocess.run(
        [*script, "--budget-s", "0", "--out", str(out)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    sections = json.loads(out.read_text())["sections"]
    assert list(sections) == ["flux", "experts", "engine", "attention"]
    assert all(s["status"] == "skipped" and s["reason"].startswith("budget") for s in sections.values())

    # every section in one process ("train" is a second run's on a device only for its minutes there)
    out, results = tmp_path / "device.json", tmp_path / "RESULTS.md"
    cmd = [*script, "--sections", "flux", "attention", "train", "--out", str(out), "--results", str(results)]
    done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]  # fails if torch's FLUX != jaxpipe's
    sections = json.loads(out.read_text())["sections"]
    flux, runs = sections["flux"], sections["flux"]["contenders"]
    assert flux["status"] == "done" and flux["setup"]["steps"] == 4
    assert all(runs[k]["status"] == "done" for k in ("jax_init", "jax_step", "jax_driven", "jax_fused"))
    assert runs["jax_fused"]["finite"] and runs["jax_fused"]["ms_per_step"] > 0
    for k in ("parity", "torch_eager"):
        assert runs[k]["status"] == "done" or "not installed" in runs[k]["reason"]
    assert "--compile" in runs["torch_compile"]["reason"] and "GPU" in sections["attention"]["reason"]
    text = results.read_text()
    assert "<!-- BEGIN device -->" in text and "<!-- END device -->" in text and "| JAX fused `lax.scan`" in text
    assert (BENCHMARKS / "RESULTS.md").read_bytes() == results_before
    rows = sections["train"]["rows"]
    assert [r["job"] for r in rows] == ["flux-grpo-lora64-full", "flux-nft-lora64-full"]
    assert all("error" not in r and r["xla_estimate_gb"] > 0 and r["median_s"] > 0 for r in rows), rows


@pytest.mark.slow  # three training-step compiles for 8 simulated devices (~1 min each on 2 cores)
def test_fit_quick_compiles_sharded_lora_and_video_jobs(tmp_path):
    """``fit.py --quick``: FlowGRPO with LoRA on one device, NFT under FSDP over 8 and FlowGRPO on Wan under
    FSDP x TP compile at test sizes; remat shrinks the temporaries, and the section renders every row."""
    import json

    out, results = tmp_path / "fit.json", tmp_path / "RESULTS.md"
    only = "flux-grpo-lora64-none,flux-grpo-lora64-full,flux-nft-fsdp8-full,wan-grpo-fsdp2tp4-full"
    cmd = [
        sys.executable,
        str(BENCHMARKS / "fit.py"),
        "--quick",
        "--only",
        only,
        "--out",
        str(out),
        "--results",
        str(results),
    ]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())}
    assert sorted(rows) == sorted(only.split(","))
    lora = rows["flux-grpo-lora64-full"]
    assert 0 < lora["trained_parameters"] < lora["parameters"] / 10  # adapters only
    assert lora["temporaries_gb"] < rows["flux-grpo-lora64-none"]["temporaries_gb"]
    assert rows["wan-grpo-fsdp2tp4-full"]["data"] * rows["wan-grpo-fsdp2tp4-full"]["tp"] == 8
    assert all(r["total_gb"] > 0 and r["compile_s"] > 0 for r in rows.values())
    text = results.read_text()
    assert "<!-- BEGIN fit -->" in text and all(f"| {name} |" in text for name in rows)


@pytest.mark.slow  # builds and saves a transformers CLIPModel, then four JAX compiles (~30 s on 2 cores)
def test_rewards_quick_compares_jax_and_torch_on_the_same_scores():
    """``rewards.py --quick``: CLIPScore and PickScore from one random CLIP folder, jitted JAX vs transformers eager,
    every row timed and the two agreeing on the scores."""
    pytest.importorskip("transformers", reason="the torch reference needs the parity extra")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "rewards.py"), "--quick", "--batch", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = [
        line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| clipscore", "| pickscore"))
    ]
    assert [r[0].strip() for r in rows] == ["clipscore", "pickscore"]
    for row in rows:
        assert float(row[2]) > 0 and float(row[3]) > 0
        assert float(row[5]) < 1e-4  # the same score from both


@pytest.mark.slow  # ~1 min: three `jaxpipe serve` processes; the server's endpoints are tested in test_serve*.py
def test_serve_quick_loses_nothing_and_matches_offline_rendering():
    """``serve.py --quick``: a mixed stream and both serving modes against real `jaxpipe serve` processes; it exits
    non-zero on any lost request or any image off its offline rendering (C1 one at a time, C3 batched)."""
    pytest.importorskip("fastapi", reason="the server needs the serve extra")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "serve.py"), "--quick"],
        check=False,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "**lost: 0**" in done.stdout and "bit for bit" in done.stdout
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| 2 ", "| 4 "))]
    assert len(rows) == 2 and all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)


@pytest.mark.slow  # ~4 min: the four RL contenders compile once (and their gradient-noise twins) and take 2 steps
def test_geneval_quick_prints_the_table_for_every_method():
    """``geneval.py --quick``: the base card over two seed sets and the four contenders (the presets and joint RL),
    judged at the card's guidance and 1 on both splits, each with its gradient signal-to-noise and curve point."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "geneval.py"), "--quick"],
        check=False,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = ("| base shapes-t2i", "| flow-grpo", "| nft", "| unified-rl")
    rows = [line for line in done.stdout.splitlines() if line.startswith(names)]
    # five cards × two splits × two guidances, then the four contenders' preset / SNR / reward rows
    assert len(rows) == 5 * 2 * 2 + 4, rows
    assert "held-out colour-shape pairs, guidance 1.0" in done.stdout
    assert done.stdout.count("gradient signal-to-noise") == 4 and "| base shapes-t2i (2 seed sets) |" in done.stdout
