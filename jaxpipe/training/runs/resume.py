"""Resuming a run: whether its folder holds the same run (and names each setting that differs), whether
that run already finished, and making the folder ready (refusing a non-empty one unless resuming or
overwriting). ``reports.execute`` calls these; ``reports`` re-exports ``OUTPUTS`` and ``finished``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from jaxpipe.training.runs.run import Run

__all__ = ["OUTPUTS", "finished", "leaves", "prepare"]

OUTPUTS = (
    "metrics.jsonl",
    "report.json",
    "before.json",
    "progress.json",
    "gradient_snr.json",
    "evaluations.jsonl",
    "config.json",
    "weights.safetensors",
    "checkpoints",
)
"""What a run writes into its folder (plus its curve PNGs)."""


def leaves(tree, prefix: str = "") -> Iterator[tuple[str, object]]:
    """The leaves of a nested dict by dotted name (``{"a": {"b": 1}}`` gives ``("a.b", 1)``).

    Args:
      tree: a value; a non-empty dict is walked into.
      prefix: the dotted name of ``tree``.

    Yields:
      ``(dotted name, leaf)`` pairs.
    """
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, tree


def _differences(saved: Mapping, ours: Mapping) -> list[str]:
    """``"NAME: OLD (saved) vs NEW (now)"`` for each setting that differs: the recorded flags when both runs
    have them (as the user typed them), else the settings' own fields (``config.sampling.sde_window``)."""

    def side(then: Mapping, now: Mapping, shown=str) -> list[str]:
        names = [*now, *(k for k in then if k not in now)]
        return [
            f"{k}: {shown(then[k]) if k in then else '(not set)'} (saved) vs {shown(now[k]) if k in now else '(not set)'} (now)"
            for k in names
            if then.get(k, object) != now.get(k, object)
        ]

    lines = side({"method": saved.get("method")}, {"method": ours["method"]})
    typed = side(saved.get("flags") or {}, ours.get("flags") or {}) if saved.get("flags") and ours.get("flags") else []
    if typed:
        return lines + typed
    fields = lambda record: dict(leaves({"seed": record.get("seed"), **(record.get("settings") or {})}))
    return lines + side(fields(saved), fields(ours), shown=json.dumps)


def _same_run(out: Path, run: Run, *, seed: int, flags: Mapping[str, str] | None) -> dict:
    """The saved progress of the run in ``out`` (``{}``: none there). Raises ValueError, naming each setting
    that differs with its saved and its current value, when it is a run of another method, settings or seed."""
    progress_path = out / "progress.json"
    saved = json.loads(progress_path.read_text()) if progress_path.is_file() else {}
    if saved:
        ours = {"method": run.name, "seed": seed, "settings": json.loads(json.dumps(run.settings))}
        if {k: saved.get(k) for k in ours} != ours:
            differ = "; ".join(_differences(saved, {**ours, "flags": dict(flags or {})}))
            raise ValueError(
                f"{out} holds a run with other settings: {differ}. Resume it with the saved ones, "
                "or pass --overwrite to start it again"
            )
    return saved


def finished(
    out: str | os.PathLike, run: Run, *, steps: int, seed: int = 0, flags: Mapping[str, str] | None = None
) -> dict | None:
    """The report of the run in ``out`` when it already finished ``steps`` steps of ``run`` (its card saved),
    else ``None``.

    Args:
        out: the run's folder.
        run: the run it should hold (its method and settings).
        steps: the steps asked for; a finished run of fewer steps is not finished (a resume extends it).
        seed: the run's seed.
        flags: the command-line flags of this run (``execute``'s), to name the settings that differ.

    Returns:
        The saved report (``status == "done"``), or ``None``.

    Raises:
        ValueError: ``out`` holds a run of another method, settings or seed (each difference named).
    """
    out = Path(out)
    _same_run(out, run, seed=seed, flags=flags)
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    done = report.get("status") == "done" and report.get("steps") == steps and report.get("completed_steps") == steps
    done = done and all((out / name).is_file() for name in ("config.json", "weights.safetensors"))
    return report if done else None


def prepare(
    out: Path, run: Run, *, steps: int, seed: int, resume: bool, overwrite: bool, flags: Mapping[str, str] | None = None
) -> dict:
    """Make ``out`` ready: refuse a non-empty folder unless resuming or overwriting; on resume, check
    that it holds a run of the same method, settings and seed.

    Args:
      out: the run's folder.
      run: the run it should hold.
      steps: the steps asked for.
      seed: the run's seed.
      resume: continue the run in ``out``.
      overwrite: replace what a run wrote into ``out``.
      flags: the command-line flags of this run, to name the settings that differ.

    Returns:
      The saved progress (or ``{}``).

    Raises:
      ValueError: ``out`` is not empty (neither resuming nor overwriting), or holds another run.
    """
    if resume:
        return _same_run(out, run, seed=seed, flags=flags)
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(
                f"{out} is not empty: pass --resume to continue the run in it, or --overwrite to replace it"
            )
        for name in OUTPUTS:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        for png in out.glob("*.png"):
            png.unlink()
    return {}
