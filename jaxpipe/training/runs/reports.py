"""Executing an RL run: train with ``fit`` and write metrics, curves, the report and the trained card.

``execute`` writes ``DIR/metrics.jsonl`` (one JSON object per step), ``DIR/*.png`` (curves),
``DIR/report.json`` and the trained card (``DIR/config.json`` + ``DIR/weights.safetensors``, so
``jp.cards.load(DIR)`` loads it back), and keeps orbax checkpoints of the training state in
``DIR/checkpoints`` so a stopped run can be resumed (``resume=True``) to the same result.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import save_card
from jaxpipe.io import plot_curves
from jaxpipe.stopping import Stopped
from jaxpipe.training import gradient_noise
from jaxpipe.training.fit import fit, read_metrics
from jaxpipe.training.runs.resume import OUTPUTS, finished, leaves, prepare
from jaxpipe.training.runs.run import Run

__all__ = ["DIVERSITY_COLLAPSE", "OUTPUTS", "TIMING", "execute", "finished", "summary_lines"]


def _reward_summary(history: list[dict], keys: tuple[str, ...]) -> dict:
    n = max(1, len(history) // 10)
    out = {"window": n}
    for key in keys:
        values = np.array([row[key] for row in history if key in row], np.float64)
        if len(values):
            out[key] = {"first": float(np.mean(values[:n])), "last": float(np.mean(values[-n:]))}
    return out


DIVERSITY_COLLAPSE = 0.30
"""A relative drop in sample diversity larger than this is collapse (reward hacking): the run failed."""

TIMING = ("train_seconds", "seconds_per_step", "eval_seconds", "wall_seconds", "sitting")
"""Report fields that measure time: the only ones a resumed run may not reproduce."""

SNR_KEY = 2**31 - 1
"""``fold_in(key(seed), SNR_KEY)`` keys the rollouts of the gradient signal-to-noise (step ``i``'s key is
``fold_in(key(seed), i)``: no run gets this far)."""


def _signal_to_noise(out: Path, run: Run, batch, *, seed: int, rollouts: int, resume: bool, log) -> dict:
    """The run's gradient signal-to-noise (``gradient_noise.measure``), measured once (kept for a resume)."""
    path = out / "gradient_snr.json"
    if resume and path.is_file():
        return json.loads(path.read_text())
    log(f"{run.name}: measuring the gradient signal-to-noise over {rollouts} rollouts ...")
    noise = gradient_noise.measure(
        run.method, batch, jax.random.fold_in(jax.random.key(seed), SNR_KEY), rollouts=rollouts
    )
    log(f"{run.name}: {noise.message()}")
    record = noise.to_json()
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


_NOT_CURVES = {"samples", "num_steps", "guidance", "seed", "prompts", *TIMING}


def _numbers(evaluation: Mapping) -> dict[str, float]:
    """An evaluation's numbers two levels deep, by dotted name (``"independent.all_right"``): its curve's points
    (its settings and timings left out)."""
    return {
        name: float(value)
        for name, value in leaves(dict(evaluation))
        if name.count(".") <= 1
        and name.split(".")[-1] not in _NOT_CURVES
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }


def trained_id(out: Path) -> str:
    """The model id a run's trained card is saved under: its folder's name (so it serves next to its base)."""
    return Path(out).resolve().name


def _report(out: Path, run: Run, steps: int, seed: int, history: list[dict], train_seconds: float, status: str) -> dict:
    """The report's record of the training part (and its curves, drawn now)."""
    curves = [
        plot_curves(history, keys, out / name, title=f"{run.name}, {len(history)} of {steps} steps")
        for name, keys in run.curves.items()
        if history and any(k in history[0] for k in keys)
    ]
    return {
        "method": run.name,
        "status": status,
        "steps": steps,
        "completed_steps": len(history),
        "seed": seed,
        "settings": run.settings,
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / max(len(history), 1),
        "rewards": _reward_summary(history, run.summary_keys) if history else {},
        "skipped_updates": int(sum(row.get("skipped", 0.0) > 0 for row in history)),
        "curves": curves,
        "metrics": str(out / "metrics.jsonl"),
        "checkpoints": str(out / "checkpoints"),
        "card": str(out) if status == "done" else None,
    }


def _stopped(
    out: Path, run: Run, steps: int, seed: int, history: list[dict], train_seconds: float, during: str
) -> dict:
    """Write and return the report of a run stopped while ``during``: the curves and rewards so far."""
    report = {**_report(out, run, steps, seed, history, train_seconds, "stopped"), "stopped_during": during}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def served_card(method, state) -> Card:
    """The card a run judges and saves: the method's evaluation average (``eval_card``, e.g. a preset's
    ``eval_ema``) where it keeps one, else its trained weights (``card``)."""
    return method.eval_card(state) if hasattr(method, "eval_card") else method.card(state)


def execute(
    run: Run,
    *,
    steps: int,
    out: str | os.PathLike,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
    save_every: int | None = 50,
    resume: bool = False,
    overwrite: bool = False,
    should_stop: Callable[[], bool] | None = None,
    flags: Mapping[str, str] | None = None,
    gradient_snr: int = 0,
    eval_every: int | None = None,
    started: float | None = None,
) -> dict:
    """Train ``run`` for ``steps`` steps and write everything to ``out``; returns the report.

    Writes ``out/metrics.jsonl`` (one JSON object per step), the curve PNGs, ``out/report.json`` and
    the trained card (``jp.cards.load(out)``; ``served_card``: the evaluation average where the method keeps one); with an evaluation, the card is judged before and
    after, and a diversity drop of more than ``DIVERSITY_COLLAPSE`` makes the verdict a failure.

    The training state is checkpointed (orbax, ``out/checkpoints``) every ``save_every`` steps and
    when ``should_stop()`` turns true between steps: the run then returns a report with
    ``status == "stopped"`` (its curves and rewards so far, ``completed_steps``) and no card.
    The trained card is saved under its own id, the folder's name (``trained_id``), so an engine
    serves it next to the card it was trained from. ``resume=True`` continues the run in ``out`` from its
    newest readable checkpoint (a damaged one is skipped with a ``log`` line naming it: ``fit``): the same
    metrics rows, report (but its ``TIMING`` fields) and final card as a run that was never stopped. A
    run that already ``finished`` is left as it is: one ``log`` line, and its report comes back. A
    non-empty ``out`` is refused unless resuming or ``overwrite`` (which deletes the previous run's outputs).
    ``flags`` (the command line's, as typed) are recorded in ``out/progress.json``, so that resuming with
    other settings names each flag that differs.

    Diagnostics: with ``gradient_snr = n`` the gradient signal-to-noise of the configured batch is measured
    first over ``n`` rollouts at the initial weights (``jaxpipe.training.gradient_noise``; a warning with the
    batch that would do when it is low), into ``out/gradient_snr.json`` and the report. With ``eval_every``
    the card is judged every that many steps as well as before and after: ``out/evaluations.jsonl`` (one row
    per judged step, step 0 the starting card), ``evaluation.png`` and the report's ``curve``.

    Args:
      run: the run: method, batches, settings, evaluation, curves and headline.
      steps: the total number of training steps, > 0 (on ``resume``, counted from step 0).
      out: the run's folder (created if missing).
      seed: the seed of the initial state (``method.init``) and of the per-step keys.
      progress: whether to show the progress bar.
      log: where the console lines go (evaluation notices, damaged checkpoints, the summary).
      save_every: checkpoint every this many steps, or ``None`` to checkpoint only on a stop and at the end.
      resume: continue the run in ``out`` (its method, settings and seed must match).
      overwrite: delete the previous run's outputs in a non-empty ``out`` and start again.
      should_stop: checked between steps and between evaluation batches; when it returns true the run is
        checkpointed and stops.
      flags: the command-line flags as the user typed them, recorded in ``out/progress.json``.
      gradient_snr: rollouts of the gradient signal-to-noise measured before training (0: none; else >= 2).
      eval_every: judge the card every this many steps (``None``: before and after only; needs an evaluation).
      started: the ``time.perf_counter()`` reading when the command started (default: now), for the report's
        ``wall_seconds`` (loading, measuring, evaluating and compiling included).

    Returns:
      The report (also written to ``out/report.json``): ``status`` (``"done"`` or ``"stopped"``),
      ``steps``, ``completed_steps``, ``seed``, ``settings``, timings, ``rewards`` (first/last window of
      ``run.summary_keys``), ``skipped_updates``, ``curves`` and paths; when done with an evaluation,
      ``before``, ``after`` and ``summary`` (the headline, diversity change and ``verdict``); ``gradient_snr``
      and ``curve`` (the judged rows) when asked for.

    Raises:
      ValueError: if ``steps <= 0``, ``gradient_snr`` is 1 or negative, ``eval_every <= 0`` or without an
        evaluation; if ``out`` is non-empty without ``resume`` or ``overwrite``; on
        ``resume`` if ``out`` holds a run of another method, settings or seed (each difference named), or
        from ``fit`` (e.g. no readable checkpoint, or one past ``steps``). A batch the method cannot
        train on fails (``method.check_batch``) before anything is written.
    """
    started = time.perf_counter() if started is None else started
    if steps <= 0:
        raise ValueError(f"steps must be > 0 (got {steps})")
    if gradient_snr < 0 or gradient_snr == 1:
        raise ValueError(f"gradient_snr is a number of rollouts, 0 (none) or >= 2 (got {gradient_snr})")
    if eval_every is not None and (eval_every <= 0 or run.evaluate is None):
        raise ValueError(f"eval_every must be > 0 and needs the run's evaluation (got {eval_every})")
    out = Path(out)
    if resume and (done := finished(out, run, steps=steps, seed=seed, flags=flags)) is not None:
        log(
            f"{run.name}: the run in {out} already finished ({steps} steps), nothing to resume; its report: {out / 'report.json'}"
        )
        return done
    first = next(run.batches)
    run.method.check_batch(first)  # a batch the method cannot train on fails now, before anything is written
    batches = itertools.chain([first], run.batches)
    saved = prepare(out, run, steps=steps, seed=seed, resume=resume, overwrite=overwrite, flags=flags)
    out.mkdir(parents=True, exist_ok=True)
    (out / "progress.json").write_text(
        json.dumps(
            {
                "method": run.name,
                "seed": seed,
                "settings": run.settings,
                "train_seconds": saved.get("train_seconds", 0.0),
                **({"flags": dict(flags)} if flags else {}),
            },
            indent=2,
        )
        + "\n"
    )
    snr = (
        _signal_to_noise(out, run, first, seed=seed, rollouts=gradient_snr, resume=resume, log=log)
        if gradient_snr
        else None
    )
    state = run.method.init(jax.random.key(seed))
    metrics_path = out / "metrics.jsonl"
    evaluations_path = out / "evaluations.jsonl"
    if not resume:
        metrics_path.unlink(missing_ok=True)
        evaluations_path.unlink(missing_ok=True)
    before = after = None
    if run.evaluate is not None:
        before_path = out / "before.json"
        if resume and before_path.is_file():
            before = json.loads(before_path.read_text())
        else:
            log(f"{run.name}: evaluating the starting card ...")
            try:
                before = run.evaluate(served_card(run.method, state), should_stop)
            except Stopped:
                return _stopped(
                    out,
                    run,
                    steps,
                    seed,
                    read_metrics(metrics_path),
                    saved.get("train_seconds", 0.0),
                    "evaluating the starting card",
                )
            before_path.write_text(json.dumps(before, indent=2) + "\n")
    judged: dict[int, dict] = {}
    if eval_every is not None:
        judged = {row["step"]: row for row in read_metrics(evaluations_path)} if resume else {}
        judged[0] = {"step": 0, **_numbers(before)}

    def judge_every(i: int, state) -> None:
        if (i + 1) % eval_every or i + 1 >= steps:  # the last step is judged as ``after``
            return
        # judged whole (no should_stop): a stop asked for meanwhile ends the run after it, at a checkpointed step
        judged[i + 1] = {"step": i + 1, **_numbers(run.evaluate(served_card(run.method, state)))}
        with open(evaluations_path, "a") as sink:
            sink.write(json.dumps(judged[i + 1]) + "\n")

    ran = []  # the steps of this sitting (on resume, fit restores the earlier ones without running them)

    def step(*args):
        ran.append(None)
        return run.method.step(*args)

    start = time.perf_counter()
    state, history = fit(
        step,
        state,
        batches,
        steps=steps,
        key=jax.random.key(seed),
        metrics_path=metrics_path,
        desc=run.name,
        progress=progress,
        checkpoint_dir=out / "checkpoints",
        save_every=save_every,
        resume=resume,
        should_stop=should_stop,
        log=log,
        on_step=judge_every if eval_every is not None else None,
    )
    jax.block_until_ready(state)
    train_seconds = saved.get("train_seconds", 0.0) + time.perf_counter() - start
    progress_record = json.loads((out / "progress.json").read_text())
    (out / "progress.json").write_text(json.dumps({**progress_record, "train_seconds": train_seconds}, indent=2) + "\n")
    if len(history) < steps:
        return _stopped(out, run, steps, seed, history, train_seconds, "training")
    report = _report(out, run, steps, seed, history, train_seconds, "done")
    report["sitting"] = {"first_step": len(history) - len(ran), "steps": len(ran)}
    trained = served_card(run.method, state)
    if run.evaluate is not None:
        log(f"{run.name}: evaluating the trained card ...")
        try:
            after = run.evaluate(trained, should_stop)
        except Stopped:
            return _stopped(out, run, steps, seed, history, train_seconds, "evaluating the trained card")
    if snr is not None:
        report["gradient_snr"] = snr
    if eval_every is not None and after is not None:
        judged[steps] = {"step": steps, **_numbers(after)}
        rows = [judged[k] for k in sorted(judged) if k <= steps]
        evaluations_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        keys = sorted({k for row in rows for k in row if k != "step"})
        report["curve"] = rows
        if keys:
            report["curves"].append(
                plot_curves(rows, keys, out / "evaluation.png", title=f"{run.name}: judged every {eval_every} steps")
            )
    if before is not None and after is not None:
        change = (after["diversity"] - before["diversity"]) / max(before["diversity"], 1e-12)
        collapsed = change < -DIVERSITY_COLLAPSE
        report["summary"] = {
            **(run.headline(before, after) if run.headline else {}),
            "diversity": {"before": before["diversity"], "after": after["diversity"], "relative_change": change},
            "diversity_collapse": bool(collapsed),
            "verdict": (
                f"FAILED: sample diversity fell {-100 * change:.1f}% (> {100 * DIVERSITY_COLLAPSE:.0f}%): mode collapse, "
                "the reward gain is reward hacking"
                if collapsed
                else "ok: no diversity collapse"
            ),
        }
        report["before"], report["after"] = before, after
    save_card(trained.with_id(trained_id(out)), out)  # first: a report that says done has its card
    report["wall_seconds"] = time.perf_counter() - started
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for line in summary_lines(report):
        log(line)
    return report


def summary_lines(report: dict) -> list[str]:
    """The report's headline numbers as console lines.

    Args:
      report: a report of ``execute`` with ``status == "done"``.

    Returns:
      One line per compared reward metric (first -> last window), per headline / diversity number
      (before -> after, with the change), the verdict, the training time and the files written.
    """
    lines = []
    width = max([32, *map(len, report["rewards"]), *map(len, report.get("summary", {}))])
    for key, value in report["rewards"].items():
        if isinstance(value, dict):
            lines.append(
                f"{key:{width}s} first {report['rewards']['window']} steps {value['first']:.3f} -> last {value['last']:.3f}"
            )
    for key, value in report.get("summary", {}).items():
        if isinstance(value, dict) and "before" in value and value["before"] is not None:
            after = value["after"]
            delta = value.get("change", value.get("relative_change"))
            unit = "%" if "relative_change" in value else ""
            scale = 100.0 if unit else 1.0
            lines.append(f"{key:{width}s} {value['before']:.3f} -> {after:.3f} ({scale * delta:+.3f}{unit})")
        elif isinstance(value, float):
            lines.append(f"{key:{width}s} {value:+.3f}")
        elif isinstance(value, str):
            lines.append(value)
    sitting = report.get("sitting", {"first_step": 0, "steps": report["steps"]})
    resumed = (
        f", this sitting steps {sitting['first_step'] + 1}-{sitting['first_step'] + sitting['steps']}"
        if sitting["first_step"]
        else ""
    )
    lines.append(
        f"training: {report['train_seconds']:.1f} s for {report['steps']} steps{resumed} "
        f"({report['seconds_per_step']:.2f} s/step incl. compile); skipped updates: {report['skipped_updates']}"
    )
    if "wall_seconds" in report:
        lines.append(
            f"wall clock: {report['wall_seconds']:.1f} s from the start (loading, measuring, evaluating, compiling)"
        )
    lines.append(
        f"wrote {report['metrics']}, {', '.join(report['curves'])}, report.json and the card in {report['card']}"
    )
    return lines
