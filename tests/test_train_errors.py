"""`jaxpipe train` when things go wrong: an --out that cannot be written, a damaged checkpoint, a resume with
other settings, a resume of a run that already finished. Each says so in one line; none prints a traceback.

One real run (`finished_run`, module-scoped: 4 steps, a checkpoint every 2) serves every case that needs one;
each case works on its own copy of it.
"""

import dataclasses
import io
import json
import logging
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import pytest
from conftest import leaves_equal
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe.cli import app
from jaxpipe.training.checkpoints import DamagedCheckpoint
from jaxpipe.training.fit import fit, read_metrics
from jaxpipe.training.runs import Run, finished

runner = CliRunner()
needs_cards = pytest.mark.skipif(
    not {"flux-t2i", "digit-scorer"} <= set(jp.cards.available()), reason="bundled cards missing"
)
TRAIN = [
    "train",
    "flow-grpo",
    "--steps",
    "4",
    "-P",
    "2",
    "-K",
    "2",
    "--num-steps",
    "2",
    "--sde-window",
    "0,1",
    "--no-eval",
    "--save-every",
    "2",
]  # no before/after evaluation: it would double the run's cost


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def _damage(step_dir) -> None:
    """Truncate a checkpoint's array data files to half, as a full disk or a copy cut short would (the
    top-level ones: orbax then fails with many reads in flight, the noisiest case)."""
    for path in (step_dir / "default" / "d").iterdir():
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)


def _unraisable(error: BaseException) -> None:
    """Report ``error`` as orbax's abandoned reads do: unraisable (here, raised in a ``__del__``)."""

    class Raises:
        def __del__(self):
            raise error

    Raises()


# ------------------------------------------------------------------------------------------ --out


@pytest.mark.parametrize("case", ["under a file", "read-only folder"])
def test_an_out_that_cannot_be_written_fails_in_one_line_before_any_work(case, tmp_path):
    if case == "under a file":
        (tmp_path / "a-file").write_text("")
        out, message = tmp_path / "a-file" / "run", "cannot create --out"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder")
        out, message = tmp_path / "locked" / "run", "cannot write to --out"
        out.mkdir(parents=True)
        out.chmod(0o500)
    try:
        result = runner.invoke(app, [*TRAIN, "--out", str(out)])
    finally:
        if case == "read-only folder":
            out.chmod(0o700)
    assert result.exit_code == 2, result.output
    (line,) = _lines(result.output)
    assert line.startswith(f"error: {message} {out}: "), line
    assert "Traceback" not in result.output and "steps ->" not in result.output  # no card loaded, nothing run


def test_the_help_says_a_missing_out_is_created():
    result = runner.invoke(app, ["train", "flow-grpo", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0 and "Output directory (created if missing)" in result.output


# ------------------------------------------------------------------------------------------ damaged checkpoints (fit)


@jax.jit
def _sgd(state, batch, key):
    w, step = state
    return (w - 0.1 * (2.0 * (w - batch) + 0.01 * jax.random.normal(key, w.shape)), step + 1), {
        "loss": jnp.sum((w - batch) ** 2)
    }


def _batches():
    i = 0
    while True:
        yield jnp.full((3,), float(i % 5))
        i += 1


def test_fit_resumes_from_the_newest_good_checkpoint_when_the_newest_is_damaged(tmp_path, caplog):
    start, key = (jnp.zeros(3), jnp.zeros((), jnp.int32)), jax.random.key(0)
    metrics, ckpt = tmp_path / "metrics.jsonl", tmp_path / "checkpoints"
    full, rows = fit(
        _sgd,
        start,
        _batches(),
        steps=9,
        key=key,
        progress=False,
        metrics_path=metrics,
        checkpoint_dir=ckpt,
        save_every=3,
    )
    assert sorted(p.name for p in ckpt.iterdir()) == ["6", "9"]  # keep=2: the one before the newest is still there
    _damage(ckpt / "9")
    (ckpt / "9" / "_CHECKPOINT_METADATA").write_text("{")  # orbax logs an absl error as soon as it lists the steps
    said = []
    with caplog.at_level(logging.WARNING, logger="absl"):
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
            log=said.append,
        )
    assert not [r for r in caplog.records if r.name == "absl"]  # the damage is said once, in our words
    assert len(said) == 1 and f"checkpoint {ckpt / '9'} is damaged" in said[0] and "resuming from step 6" in said[0]
    assert resumed_rows == rows and read_metrics(metrics) == rows and leaves_equal(resumed, full)  # steps 6-8 redone
    assert sorted(p.name for p in ckpt.iterdir()) == ["6", "9", "9.damaged"]  # kept aside; 9 saved afresh

    for step in ("6", "9"):
        _damage(ckpt / step)
    with pytest.raises(DamagedCheckpoint, match=r"checkpoint .*9 is damaged .* no earlier one can be read") as err:
        fit(
            _sgd,
            start,
            _batches(),
            steps=9,
            key=key,
            progress=False,
            metrics_path=metrics,
            checkpoint_dir=ckpt,
            resume=True,
            log=said.append,
        )
    assert "\n" not in str(err.value) and len(said) == 1
    assert sorted(p.name for p in ckpt.iterdir()) == ["6", "9", "9.damaged"]  # nothing moved: the user decides


def test_a_resume_with_other_settings_names_the_fields_when_no_flags_were_recorded(tmp_path):
    run = Run(
        name="toy", method=None, batches=iter(()), settings={"config": {"lr": 0.2, "sampling": {"sde_window": [0, 2]}}}
    )
    (tmp_path / "progress.json").write_text(
        json.dumps(
            {"method": "toy", "seed": 0, "settings": {"config": {"lr": 0.2, "sampling": {"sde_window": [0, 1]}}}}
        )
    )
    with pytest.raises(
        ValueError, match=r"other settings: config\.sampling\.sde_window: \[0, 1\] \(saved\) vs \[0, 2\] \(now\)\."
    ):
        finished(tmp_path, run, steps=4)
    same = dataclasses.replace(run, settings={"config": {"lr": 0.2, "sampling": {"sde_window": [0, 1]}}})
    assert finished(tmp_path, same, steps=4) is None  # the same run, not finished


# ------------------------------------------------------------------------------------------ the command line


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished `train flow-grpo` run in a folder that did not exist (checkpoints at steps 2 and 4): ~6 s of
    CPU (its step compiles as test_stop_resume's do, the same shapes), ~8 s on a busy machine."""
    out = tmp_path_factory.mktemp("train") / "missing" / "run"
    result = runner.invoke(app, [*TRAIN, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2", "4"]
    return out


def _copy(run, tmp_path):
    return shutil.copytree(run, tmp_path / "run")


@pytest.mark.slow  # the module's 4-step run (~20 s) serves only these resume cases; test_stop_resume resumes in the default tier
@needs_cards
def test_resuming_a_finished_run_says_so_and_changes_nothing(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    result = runner.invoke(app, [*TRAIN, "--out", str(out), "--resume"])
    assert result.exit_code == 0, result.output
    assert _lines(result.output) == [
        f"flow-grpo: the run in {out} already finished (4 steps), nothing to resume; its report: {out / 'report.json'}"
    ]
    assert {
        p.name: p.read_bytes() for p in out.iterdir() if p.is_file()
    } == files  # no report rewritten, no card re-saved


@pytest.mark.slow  # shares the 4-step run above
@needs_cards
def test_resuming_with_other_settings_names_each_flag_with_its_saved_and_current_value(finished_run, tmp_path):
    out = _copy(finished_run, tmp_path)
    progress = (out / "progress.json").read_bytes()
    other = [a if a != "0,1" else "0,2" for a in TRAIN]
    result = runner.invoke(app, [*other, "--seed", "1", "--out", str(out), "--resume"])
    assert result.exit_code == 2, result.output
    (line,) = _lines(result.output)
    assert line.startswith(f"error: {out} holds a run with other settings: ")
    assert "--seed: 0 (saved) vs 1 (now)" in line and "--sde-window: 0,1 (saved) vs 0,2 (now)" in line
    assert "--eval-samples" not in line and "--steps" not in line  # only what differs; --steps may change
    assert (out / "progress.json").read_bytes() == progress


@pytest.mark.slow  # ~25 s: a resumed run redoing two steps; shares the 4-step run above
@needs_cards
def test_resuming_past_a_damaged_checkpoint_warns_once_and_gives_the_same_run(
    finished_run, tmp_path, monkeypatch, caplog
):
    out = _copy(finished_run, tmp_path)
    for name in ("report.json", "config.json", "weights.safetensors"):  # as if killed after its last checkpoint
        (out / name).unlink()
    _damage(out / "checkpoints" / "4")
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # where orbax's abandoned reads report
    with caplog.at_level(logging.WARNING, logger="absl"):
        result = runner.invoke(app, [*TRAIN, "--out", str(out), "--resume"])
        time.sleep(0.2)  # the abandoned reads finish within ~50 ms
    # how many reads a failed restore leaves in flight is a race (none to hundreds); their report, made here,
    # is dropped every time, and nothing else is
    _unraisable(RuntimeError("Event loop is closed"))
    _unraisable(ValueError("something else"))
    assert [str(u.exc_value) for u in unraisable] == ["something else"]
    assert result.exit_code == 0, result.output
    (warning,) = [line for line in _lines(result.output) if "is damaged" in line]
    assert (
        warning.startswith(f"warning: checkpoint {out / 'checkpoints' / '4'} is damaged")
        and "resuming from step 2" in warning
    )
    assert "Traceback" not in result.output and "Event loop" not in result.output
    assert not [r for r in caplog.records if r.name == "absl"]
    assert (out / "metrics.jsonl").read_text() == (finished_run / "metrics.jsonl").read_text()  # steps 2-3 redone
    assert leaves_equal(jp.cards.load(out), jp.cards.load(finished_run))
    assert {"2", "4", "4.damaged"} == {p.name for p in (out / "checkpoints").iterdir()}


def test_a_reward_module_in_the_working_folder_is_found_as_uvicorn_finds_an_app(tmp_path, monkeypatch):
    """`--reward myreward:fn` from the folder holding myreward.py: the console script's path does not hold that folder,
    so the command puts it there. (The run is refused after the reward loads: --out is a file.)"""
    (tmp_path / "jaxpipe_cwd_reward.py").write_text(
        "def bright(artifacts, prompts):\n    return artifacts['image'].mean((1, 2, 3))\n"
    )
    (tmp_path / "p.txt").write_text("seven\nthree\n")
    (tmp_path / "taken").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    args = [
        "train",
        "flow-grpo",
        "--no-eval",
        "--prompts",
        "p.txt",
        "--reward",
        "jaxpipe_cwd_reward:bright",
        "--steps",
        "1",
    ]
    result = runner.invoke(app, [*args, "--out", "taken"])
    assert result.exit_code == 2 and "--out taken is a file, not a directory" in result.output, result.output
    unknown = runner.invoke(app, [*args[:-3], "nowhere_reward:fn", "--steps", "1", "--out", "taken"])
    assert "no module named 'nowhere_reward'" in unknown.output


@needs_cards
def test_a_card_that_does_not_load_leaves_no_out_folder_behind(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "nft", "--model", "./no-such-card", "--steps", "1", "--out", str(out)])
    assert result.exit_code == 2 and "no such card folder: './no-such-card'" in result.output
    assert not out.exists()


def test_the_progress_bar_counts_its_rate_from_the_first_warm_step(monkeypatch):
    """The first step compiles; an ETA from its time would say hours. The bar restarts its clock after it."""
    fit_module = sys.modules[fit.__module__]  # the module (``jaxpipe.training.fit`` is also the function's name)
    bars = []

    def recording_bar(*args, **kwargs):
        from tqdm.std import tqdm

        bars.append(tqdm(*args, **{**kwargs, "disable": False, "file": io.StringIO()}))
        return bars[-1]

    monkeypatch.setattr(fit_module, "progress_bar", recording_bar)
    starts = []

    def step(state, batch, key):
        starts.append(bars[0].start_t)
        return state + 1, {"x": jnp.float32(state)}

    fit(step, 0, iter(range(10)), steps=3, key=jax.random.key(0))
    assert bars[0].n == 3 and bars[0].initial == 1  # counted from the warm steps
    assert starts[1] > starts[0] and starts[1] == starts[2]  # its clock restarted once, after the first step
