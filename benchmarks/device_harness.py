"""The harness of ``benchmarks/device.py``: it measures nothing itself, it runs the sections within a lease.

A section is a ``Section`` (its runner, time estimates, plan, renderer, summary); ``run_sections`` runs a list of
them under one ``Budget`` (a wall-clock deadline), recording each in a ``Run`` (the JSON, saved after every
change), and each contender inside a section through ``attempt`` (done / skipped / failed, never raising).
``render`` and ``summary`` turn a run's JSON into the markdown section and the end of the log; ``plan`` is what
``--dry-run`` prints of the time budget.

``device.py`` imports this module before JAX: its clock starts the budget, so the slow imports count too.
"""

from __future__ import annotations

import time

PROCESS_START = time.perf_counter()  # before the other imports: the budget should see as much of the start-up as it can

import dataclasses
import datetime
import importlib.util
import json
import math
import os
import pathlib
import statistics
import traceback
from collections.abc import Callable, Sequence

import numpy as np


def log(message: str) -> None:
    """Print ``message`` with the wall-clock time and the seconds since the process started."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - PROCESS_START:6.1f}s] {message}", flush=True)


def optional_module(name: str):
    """The module ``name`` if it is installed, else None (torch and diffusers are optional)."""
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


@dataclasses.dataclass
class Budget:
    """The run's wall-clock deadline; ``estimates`` are each piece's expected seconds."""

    seconds: float
    estimates: dict
    start: float = PROCESS_START

    def left(self) -> float:
        """Seconds left before the deadline (negative past it)."""
        return self.seconds - (time.perf_counter() - self.start)

    def refuse(self, piece: str, reserve: float = 0.0) -> str | None:
        """Why ``piece`` may not start (its estimate + ``reserve`` exceed the time left), or None."""
        need = self.estimates.get(piece, 0.0)
        if self.left() >= need + reserve:
            return None
        return (
            f"budget: {self.left():.0f} s left, {piece} needs ~{need:.0f} s + {reserve:.0f} s kept for later sections"
        )


class Run:
    """The run's JSON record, saved to ``path`` (if any) after every change."""

    def __init__(self, path: pathlib.Path | None, data: dict):
        self.path, self.data = path, data

    def save(self) -> None:
        """Write the record to ``path`` (through a temporary file, so a killed run never leaves half a JSON)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_jsonable))
        tmp.replace(self.path)

    @property
    def failed(self) -> list[str]:
        """The failed sections and contenders, as ``section`` or ``section/contender``."""
        out = []
        for name, sec in self.data["sections"].items():
            out += [name] if sec.get("status") == "failed" else []
            out += [f"{name}/{k}" for k, c in sec.get("contenders", {}).items() if c.get("status") == "failed"]
        return out


def _jsonable(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def attempt(
    into: dict, name: str, fn: Callable[[], dict], save: Callable[[], None], refused: str | None = None
) -> dict | None:
    """Run ``fn() -> dict`` as contender ``name``, recording done / skipped (``refused``) / failed in ``into``.

    Returns:
      ``fn``'s result, or None when it was skipped or raised.
    """
    if refused:
        into[name] = {"status": "skipped", "reason": refused}
        log(f"{name}: skipped ({refused})")
        save()
        return None
    log(f"{name}: start")
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - one broken contender must not cost the rest of the lease
        into[name] = {
            "status": "failed",
            "error": f"{type(err).__name__}: {err}"[:1500],
            "traceback": traceback.format_exc()[-3000:],
            "elapsed_s": time.perf_counter() - start,
        }
        log(f"{name}: FAILED {type(err).__name__}: {str(err)[:300]}")
        save()
        return None
    into[name] = {"status": "done", "elapsed_s": time.perf_counter() - start, **out}
    log(f"{name}: done in {into[name]['elapsed_s']:.1f} s " + _brief(out))
    save()
    return out


def _brief(out: dict) -> str:
    keys = ("compile_s", "ms_per_step", "s_per_image", "max_abs_err")
    return " ".join(f"{k}={out[k]:.4g}" for k in keys if isinstance(out.get(k), (int, float)))


def timings(fn: Callable[[], object], repeats: int) -> dict:
    """``fn`` (which waits for its result) run ``repeats`` times: median and best seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "best_s": min(times), "repeats": repeats}


def num(value, fmt: str = ".2f") -> str:
    """``value`` formatted with ``fmt``, or an en dash where it is missing or not finite (a table cell)."""
    return format(value, fmt) if isinstance(value, (int, float)) and math.isfinite(value) else "–"


class Plan:
    """The dry run's time plan: pieces taken in order, each started only if it fits, as a GPU run would."""

    def __init__(self, budget_s: float, estimates: dict):
        self.budget_s, self.estimates, self.t, self.lines = budget_s, estimates, 0.0, []

    def piece(self, name: str, reserve: float, label: str) -> bool:
        """Start ``name`` (its ``estimates`` seconds) if it fits with ``reserve`` kept; whether it did."""
        need = self.estimates[name]
        fits = self.budget_s - self.t >= need + reserve
        self.t += need if fits else 0.0
        self.lines.append(
            f"{label}: " + (f"ends ~{self.t:.0f} s" if fits else f"SKIPPED ({self.budget_s - self.t:.0f} s left)")
        )
        return fits

    def wait(self, seconds: float, label: str) -> None:
        """A piece that always runs, for ``seconds`` (one that sizes itself to the time left)."""
        self.t += seconds
        self.lines.append(f"{label}: end ~{self.t:.0f} s")


Runner = Callable[..., None]
"""``run(args, budget, sec, save, reserve)``: fills ``sec`` (the section's JSON record), calls ``save`` after each
piece and starts no optional piece that ``budget.refuse(piece, reserve)`` refuses; raising marks it failed."""


@dataclasses.dataclass(frozen=True)
class Section:
    """One section of the device benchmark: what the harness needs to budget, run, plan and report it.

    Attributes:
      name: its key in ``--sections``, the JSON and the report.
      run: its ``Runner``.
      estimates: expected seconds on one H200 of its pieces, compiles included (``name``: its start-up).
      expected_s: ``(estimates, quick) -> seconds`` of the whole section, which the sections before it keep
        for it; None: ``estimates[name]``.
      plan: ``(plan, reserve)``: the dry run's plan of its pieces after its start-up (``Plan.piece``).
      plan_note: what its start-up piece covers, in the plan's label.
      unavailable: ``args -> reason`` it cannot run on this backend at all, or None.
      render: ``sections -> markdown lines`` (every section's record: one may report another's numbers).
      summary: ``sections -> lines`` for the end of the log.
      dry_run: ``args -> facts`` checked abstractly at full size under ``--dry-run``.
      optional: it runs only in what time is left: no earlier section keeps time for it.
    """

    name: str
    run: Runner
    estimates: dict
    expected_s: Callable[[dict, bool], float] | None = None
    plan: Callable[[Plan, float], None] | None = None
    plan_note: str = ""
    unavailable: Callable[[object], str | None] | None = None
    render: Callable[[dict], list[str]] | None = None
    summary: Callable[[dict], list[str]] | None = None
    dry_run: Callable[[object], dict] | None = None
    optional: bool = False

    def expected(self, estimates: dict, quick: bool) -> float:
        """The section's whole expected seconds under ``estimates``."""
        return self.expected_s(estimates, quick) if self.expected_s else estimates[self.name]


def estimates_of(sections: Sequence[Section]) -> dict:
    """Every piece's expected seconds, over ``sections``."""
    return {k: v for s in sections for k, v in s.estimates.items()}


def _reserve(sections: Sequence[Section], i: int, estimates: dict, quick: bool) -> float:
    return sum(s.expected(estimates, quick) for s in sections[i + 1 :] if not s.optional)


def run_sections(sections: Sequence[Section], args, run: Run, budget: Budget) -> None:
    """Run ``sections`` in order into ``run``, each only if it fits ``budget`` with the later ones' time kept.

    A section that does not fit, or cannot run here, is recorded as skipped; one that raises, as failed.
    """
    for i, section in enumerate(sections):
        name = section.name
        reserve = _reserve(sections, i, budget.estimates, args.quick)
        sec = run.data["sections"].setdefault(name, {})
        sec["start_s"] = budget.seconds - budget.left()
        sec["start_utc"] = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
        refused = budget.refuse(name, reserve) or (section.unavailable(args) if section.unavailable else None)
        if refused:
            sec.update(status="skipped", reason=refused)
            log(f"section {name}: skipped ({refused})")
            run.save()
            continue
        log(f"section {name}: start ({budget.left():.0f} s left, {reserve:.0f} s kept for later sections)")
        try:
            section.run(args, budget, sec, run.save, reserve)
            sec["status"] = "done"
        except Exception as err:  # noqa: BLE001 - a broken section must not cost the others
            sec.update(
                status="failed", error=f"{type(err).__name__}: {err}"[:1500], traceback=traceback.format_exc()[-3000:]
            )
            log(f"section {name}: FAILED {type(err).__name__}: {str(err)[:300]}")
        sec["elapsed_s"] = budget.seconds - budget.left() - sec["start_s"]
        log(f"section {name}: {sec['status']} in {sec['elapsed_s']:.1f} s")
        run.save()
    run.data["elapsed_s"] = time.perf_counter() - PROCESS_START
    run.save()


def plan(sections: Sequence[Section], budget_s: float) -> list[str]:
    """What a GPU run of ``sections`` would start or skip if every piece took its estimate (the run's own rules)."""
    estimates = estimates_of(sections)
    p = Plan(budget_s, estimates)
    for i, section in enumerate(sections):
        reserve = _reserve(sections, i, estimates, False)
        if p.piece(section.name, reserve, f"{section.name} (start{section.plan_note})") and section.plan:
            section.plan(p, reserve)
    return p.lines


def render(data: dict, sections: Sequence[Section], intro: Sequence[str]) -> str:
    """The markdown section of a run's ``data``: ``intro``, the machine, the sections' status, their tables."""
    quick = data["args"].get("quick")
    lines = [
        "## device",
        "",
        *intro,
        "",
        *[f"- {k}: {v}" for k, v in data["machine"].items()],
        f"- budget: {data['args']['budget_s']:.0f} s; whole run: {data.get('elapsed_s', float('nan')):.0f} s"
        + (" (--quick: CPU-sized)" if quick else ""),
        "",
        "| section | status | started at s | took s | note |",
        "|---|---|---:|---:|---|",
    ]
    for name, sec in data["sections"].items():
        note = sec.get("reason") or sec.get("error", "")
        lines.append(
            f"| {name} | {sec.get('status')} | {num(sec.get('start_s'), '.0f')} | {num(sec.get('elapsed_s'), '.0f')} "
            f"| {note[:200]} |"
        )
    for section in sections:
        part = section.render(data["sections"]) if section.render else []
        if part:
            lines += ["", *part]
    return "\n".join(lines) + "\n"


def summary(data: dict, sections: Sequence[Section]) -> str:
    """The few numbers that matter, for the end of the log, and what failed."""
    out = [line for s in sections if s.summary for line in s.summary(data["sections"])]
    out.append("failed: " + (", ".join(Run(None, data).failed) or "none"))
    return "\n".join(out)


def machine() -> dict:
    """``report.machine_info`` plus the accelerator, the flax / torch / diffusers versions and ``XLA_FLAGS``."""
    from importlib import metadata

    import jax
    from report import machine_info

    extra = {"device": jax.devices()[0].device_kind, "devices": jax.device_count()}
    for name in ("flax", "torch", "diffusers"):
        try:
            extra[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            extra[name] = "not installed"
    extra["XLA_FLAGS"] = os.environ.get("XLA_FLAGS") or "(unset)"
    return machine_info(**extra)
