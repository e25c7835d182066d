"""Safe stopping and resuming: signals in real subprocesses, checkpoints, bit-for-bit resumed runs.

A SIGINT / SIGTERM during `jaxpipe train` ends at a safe point with exit 130 / 143, a checkpoint of
the last completed step, the metrics, curves and a report so far; `--resume` then gives the same
metrics rows, final card and report (but timings) as the uninterrupted run. `jaxpipe generate`
stops at a step boundary with exit 130 and writes nothing. `fit` offers the same to scripts.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe.cli import app
from jaxpipe.training.fit import fit, read_metrics
from jaxpipe.training.runs import TIMING

runner = CliRunner()
needs_cards = pytest.mark.skipif(
    not {"flux-t2i", "wan-i2v", "digit-scorer"} <= set(jp.cards.available()), reason="bundled cards missing"
)
STEPS = 24  # enough that the stopped run is still training when the signal lands (~0.1 s a step after its compile)
TRAIN = [
    "train",
    "flow-grpo",
    "--steps",
    str(STEPS),
    "-P",
    "2",
    "-K",
    "2",
    "--num-steps",
    "2",
    "--sde-window",
    "0,1",
    "--eval-samples",
    "4",
    "--diversity-prompts",
    "2",
    "--diversity-seeds",
    "2",
    "--save-every",
    "8",
]


# ------------------------------------------------------------------------------------------ the library


@jax.jit
def _sgd(state, batch, key):
    w, step = state
    noise = jax.random.normal(key, w.shape)
    grad = 2.0 * (w - batch) + 0.01 * noise
    return (w - 0.1 * grad, step + 1), {"loss": jnp.sum((w - batch) ** 2)}


def _batches():
    i = 0
    while True:
        yield jnp.full((3,), float(i % 5))
        i += 1


def test_fit_stops_between_steps_checkpoints_and_resumes_bit_for_bit(tmp_path):
    start, key = (jnp.zeros(3), jnp.zeros((), jnp.int32)), jax.random.key(0)
    full, rows = fit(_sgd, start, _batches(), steps=9, key=key, progress=False)
    metrics, ckpt = tmp_path / "metrics.jsonl", tmp_path / "checkpoints"
    calls = []
    stop_after_4 = lambda: calls.append(1) or len(calls) > 4
    part, part_rows = fit(
        _sgd,
        start,
        _batches(),
        steps=9,
        key=key,
        progress=False,
        metrics_path=metrics,
        checkpoint_dir=ckpt,
        save_every=3,
        should_stop=stop_after_4,
    )
    assert len(part_rows) == 4 and [r["step"] for r in read_metrics(metrics)] == [0, 1, 2, 3]
    assert sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) == [3, 4]  # every 3 and at the stop
    with metrics.open("a") as f:  # a row written after the last checkpoint (a hard kill) is dropped on resume
        f.write(json.dumps({"step": 4, "loss": -1.0}) + "\n")
    resumed, resumed_rows = fit(
        _sgd,
        start,
        _batches(),
        steps=9,
        key=key,
        progress=False,
        metrics_path=metrics,
        checkpoint_dir=ckpt,
        resume=True,
    )
    assert resumed_rows == rows and read_metrics(metrics) == rows
    np.testing.assert_array_equal(resumed[0], full[0])
    assert int(resumed[1]) == 9
    with pytest.raises(ValueError, match="need checkpoint_dir"):
        fit(_sgd, start, _batches(), steps=2, key=key, resume=True)


# ------------------------------------------------------------------------------------------ the command line


class _Command:
    """``jaxpipe ARGS`` in a subprocess, its output collected line by line as it comes."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jaxpipe.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, predicate, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, "timed out waiting for the command"
            time.sleep(0.05)

    def stop(self, signum: int) -> tuple[int, str]:
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        return code, self.output()

    def output(self) -> str:
        return "".join(self.lines)

    def __enter__(self) -> "_Command":
        return self

    def __exit__(self, *exc) -> None:
        """Whatever the test did, the process is gone afterwards (killed if still running)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _rows(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _portable(report: dict, out: Path):
    """The report without its timings, with paths made relative to the run folder."""
    if isinstance(report, dict):
        return {k: _portable(v, out) for k, v in report.items() if k not in TIMING}
    if isinstance(report, list):
        return [_portable(v, out) for v in report]
    return report.replace(str(out), "OUT") if isinstance(report, str) else report


@pytest.mark.slow  # ~80 s (three runs); by default: fit stops, checkpoints and resumes bit for bit (above), a real SIGTERM
# ends a run cleanly (below); a CLI resume past a damaged checkpoint gives the uninterrupted run (test_train_errors.py, slow)
@needs_cards
def test_ctrl_c_checkpoints_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    result = runner.invoke(app, [*TRAIN, "--out", str(full)])
    assert result.exit_code == 0, result.output
    rows = read_metrics(full / "metrics.jsonl")
    assert [row["step"] for row in rows] == list(range(STEPS)) and all(np.isfinite(row["reward_mean"]) for row in rows)
    assert Image.open(full / "reward.png").format == "PNG" and (full / "kl.png").is_file()
    summary = json.loads((full / "report.json").read_text())["summary"]
    assert set(summary["all_attributes_correct"]) == {"before", "after", "change"}
    assert summary["diversity"]["before"] > 0 and isinstance(summary["diversity_collapse"], bool)
    trained = jp.cards.load(full)
    assert trained.model_id == "full"  # its own id (the folder's name): it serves next to the card it came from
    assert not all(
        bool(jnp.array_equal(a, b))
        for a, b in zip(  # the trained weights were saved
            jax.tree.leaves(trained["transformer"]), jax.tree.leaves(jp.cards.load("flux-t2i")["transformer"])
        )
    )
    engine = jp.Engine.default()
    engine.register(trained)
    assert {"flux-t2i", "full"} <= set(engine.cards())
    engine.register(trained, model_id="flux-t2i-rl")
    assert engine.card("flux-t2i-rl").spec.loops == trained.spec.loops

    with _Command(*TRAIN, "--out", str(part)) as command:
        command.wait_for(lambda: _rows(part / "metrics.jsonl") >= 3)
        code, output = command.stop(signal.SIGINT)
    assert code == 130, output[-3000:]
    assert "resume with: jaxpipe train flow-grpo" in output and "--resume" in output.splitlines()[-1]
    report = json.loads((part / "report.json").read_text())
    done = report["completed_steps"]
    assert report["status"] == "stopped" and 3 <= done < STEPS and report["card"] is None
    assert _rows(part / "metrics.jsonl") == done and (part / "reward.png").is_file()
    assert str(done) in {p.name for p in (part / "checkpoints").iterdir()}  # the last completed step
    assert not (part / "weights.safetensors").exists()

    result = runner.invoke(app, [*TRAIN, "--out", str(part)])
    assert result.exit_code == 2 and "--resume" in result.output  # a run is there: refused, nothing touched
    result = runner.invoke(app, [*TRAIN, "--out", str(part), "--resume"])
    assert result.exit_code == 0, result.output
    assert f"for {STEPS} steps, this sitting steps {done + 1}-{STEPS} (" in result.output  # not the restored ones
    assert json.loads((part / "report.json").read_text())["sitting"] == {"first_step": done, "steps": STEPS - done}
    assert (part / "metrics.jsonl").read_text() == (full / "metrics.jsonl").read_text()
    resumed = jp.cards.load(part)
    assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(trained)))
    assert _portable(json.loads((part / "report.json").read_text()), part) == _portable(
        json.loads((full / "report.json").read_text()), full
    )

    other = [a if a != "0,1" else "0,2" for a in TRAIN]
    result = runner.invoke(app, [*other, "--out", str(part), "--resume"])
    assert (
        result.exit_code == 2
        and "holds a run with other settings: --sde-window: 0,1 (saved) vs 0,2 (now)." in result.output
    )
    result = runner.invoke(app, [*TRAIN[:3], "2", *TRAIN[4:], "--out", str(part), "--overwrite", "--no-eval"])
    assert result.exit_code == 0 and _rows(part / "metrics.jsonl") == 2 and not (part / "before.json").exists()


@pytest.mark.slow  # ~20 s: two real CLI processes signalled; by default fit stops, checkpoints and resumes bit for bit
@needs_cards
def test_sigterm_during_evaluation_and_ctrl_c_during_generate_end_cleanly(tmp_path):
    out = tmp_path / "early"
    with _Command(*TRAIN, "--out", str(out)) as command:
        command.wait_for(lambda: "evaluating the starting card" in command.output())  # compiling and evaluating
        code, output = command.stop(signal.SIGTERM)
    assert code == 143, output[-3000:]  # never a crash
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "stopped" and report["completed_steps"] == 0
    assert report["stopped_during"] == "evaluating the starting card" and "resume with:" in output

    gif = tmp_path / "x.gif"
    with _Command("generate", "seven thick moving right", "-o", str(gif)) as command:
        command.wait_for(lambda: "[1/2] flux-t2i" in command.output())  # the first stage is stepping
        code, output = command.stop(signal.SIGINT)
    assert code == 130 and "stopped (SIGINT) at step" in output and not gif.exists(), output[-2000:]
