"""Executing an RL run: train with ``fit`` and write metrics, curves, the report and the trained card.

``execute`` writes ``DIR/metrics.jsonl`` (one JSON object per step), ``DIR/*.png`` (curves),
``DIR/report.json`` and the trained card (``DIR/config.json`` + ``DIR/weights.safetensors``, so
``jp.cards.load(DIR)`` loads it back).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from jaxpipe.cards.checkpoint import save_card
from jaxpipe.io import plot_curves
from jaxpipe.training.fit import fit
from jaxpipe.training.runs.builders import Run
from jaxpipe.training.runs.evaluation import DIVERSITY_COLLAPSE

__all__ = ["execute", "summary_lines"]


def _reward_summary(history: list[dict]) -> dict:
    n = max(1, len(history) // 10)
    out = {"window": n}
    for key in ("reward_mean", "reward_refined", "reward_original"):
        values = np.array([row[key] for row in history if key in row], np.float64)
        if len(values):
            out[key] = {"first": float(np.mean(values[:n])), "last": float(np.mean(values[-n:]))}
    return out


def execute(
    run: Run,
    *,
    steps: int,
    out: str | os.PathLike,
    seed: int = 0,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Train ``run`` for ``steps`` steps and write everything to ``out``; returns the report.

    Writes ``out/metrics.jsonl`` (one JSON object per step; replaced, not appended to), the curve
    PNGs, ``out/report.json`` and the trained card (``jp.cards.load(out)``). With an evaluation,
    the card is judged before and after; a diversity drop of more than ``DIVERSITY_COLLAPSE``
    makes the verdict a failure.
    """
    if steps <= 0:
        raise ValueError(f"steps must be > 0 (got {steps})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = run.method.init(jax.random.key(seed))
    before = after = None
    if run.evaluate is not None:
        log(f"{run.name}: evaluating the starting card ...")
        before = run.evaluate(run.method.card(state))
    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    start = time.perf_counter()
    state, history = fit(
        run.method.step, state, run.batches, steps=steps, key=jax.random.key(seed), metrics_path=metrics_path,
        desc=run.name, progress=progress,
    )
    jax.block_until_ready(state)
    train_seconds = time.perf_counter() - start
    trained = run.method.card(state)
    if run.evaluate is not None:
        log(f"{run.name}: evaluating the trained card ...")
        after = run.evaluate(trained)
    curves = [plot_curves(history, keys, out / name, title=f"{run.name}, {steps} steps") for name, keys in run.curves.items()
              if any(k in history[0] for k in keys)]
    report = {
        "method": run.name,
        "steps": steps,
        "seed": seed,
        "settings": run.settings,
        "train_seconds": train_seconds,
        "seconds_per_step": train_seconds / steps,
        "rewards": _reward_summary(history),
        "skipped_updates": int(sum(row.get("skipped", 0.0) > 0 for row in history)),
        "curves": curves,
        "metrics": str(metrics_path),
        "card": str(out),
    }
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
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    save_card(trained, out)
    for line in summary_lines(report):
        log(line)
    return report


def summary_lines(report: dict) -> list[str]:
    """The report's headline numbers as console lines."""
    lines = []
    for key, value in report["rewards"].items():
        if isinstance(value, dict):
            lines.append(f"{key:32s} first {report['rewards']['window']} steps {value['first']:.3f} -> last {value['last']:.3f}")
    for key, value in report.get("summary", {}).items():
        if isinstance(value, dict) and "before" in value and value["before"] is not None:
            after = value["after"]
            delta = value.get("change", value.get("relative_change"))
            unit = "%" if "relative_change" in value else ""
            scale = 100.0 if unit else 1.0
            lines.append(f"{key:32s} {value['before']:.3f} -> {after:.3f} ({scale * delta:+.3f}{unit})")
        elif isinstance(value, float):
            lines.append(f"{key:32s} {value:+.3f}")
        elif isinstance(value, str):
            lines.append(value)
    lines.append(
        f"training: {report['train_seconds']:.1f} s for {report['steps']} steps "
        f"({report['seconds_per_step']:.2f} s/step incl. compile); skipped updates: {report['skipped_updates']}"
    )
    lines.append(f"wrote {report['metrics']}, {', '.join(report['curves'])}, report.json and the card in {report['card']}")
    return lines
