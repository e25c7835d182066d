"""The outer training loop shared by every method: progress bar, per-step keys, metrics log, checkpoints."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxpipe.progress import progress_bar
from jaxpipe.training.checkpoints import Checkpoints

__all__ = ["fit", "read_metrics"]


def read_metrics(path: str | os.PathLike) -> list[dict[str, float]]:
    """The rows of a ``metrics.jsonl`` (one JSON object per step); ``[]`` when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fit(
    step: Callable[[Any, Any, jax.Array], tuple[Any, dict]],
    state: Any,
    batches: Iterator[Any],
    *,
    steps: int,
    key: jax.Array,
    metrics_path: str | os.PathLike | None = None,
    desc: str = "train",
    progress: bool = True,
    checkpoint_dir: str | os.PathLike | None = None,
    save_every: int | None = None,
    resume: bool = False,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[Any, list[dict[str, float]]]:
    """Run jitted ``step(state, batch, key)`` up to step ``steps``; key ``i`` is ``fold_in(key, i)``.

    Returns the final state and one metrics dict per completed step (also appended as JSON lines
    to ``metrics_path`` when given). Non-finite metrics are reported, never hidden; a step whose
    metrics say ``skipped`` is announced on the console.

    Checkpoints (``checkpoint_dir``, orbax): the state is saved every ``save_every`` steps, when
    ``should_stop()`` turns true (checked between steps: the run then ends early, after saving the
    last completed step; fewer rows than ``steps`` come back) and at the end. ``resume=True``
    restores the newest checkpoint, takes its rows back from ``metrics_path`` (dropping rows
    written after it), skips the batches already used and continues: the same rows, bits and
    final state as a run that was never stopped.
    """
    if steps <= 0:
        raise ValueError(f"steps must be > 0 (got {steps})")
    if save_every is not None and save_every <= 0:
        raise ValueError(f"save_every must be a positive number of steps (got {save_every})")
    if (resume or save_every) and checkpoint_dir is None:
        raise ValueError("resume and save_every need checkpoint_dir")
    checkpoints = Checkpoints(checkpoint_dir) if checkpoint_dir is not None else None
    history: list[dict[str, float]] = []
    if resume:
        done = checkpoints.latest_step() or 0
        if done:
            state = checkpoints.restore(done, state)
        history = read_metrics(metrics_path)[:done] if metrics_path is not None else []
        if metrics_path is not None and len(history) < done:
            raise ValueError(f"{metrics_path} has {len(history)} rows but the checkpoint is at step {done}")
        if metrics_path is not None:
            Path(metrics_path).write_text("".join(json.dumps(row) + "\n" for row in history))
        for _ in range(done):
            next(batches)
    start = len(history)
    sink = None
    if metrics_path is not None:
        Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
        sink = open(metrics_path, "a")
    bar = progress_bar(range(start, steps), initial=start, total=steps, desc=desc, disable=not progress, dynamic_ncols=True)
    saved = start
    try:
        for i in bar:
            if should_stop is not None and should_stop():
                break
            state, metrics = step(state, next(batches), jax.random.fold_in(key, i))
            row = {"step": i, **{k: float(np.asarray(v)) for k, v in metrics.items()}}
            history.append(row)
            if row.get("skipped", 0.0) > 0:
                bar.write(f"{desc} step {i}: non-finite loss or gradient; update skipped, weights unchanged")
            if sink is not None:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            if i % 10 == 0 or i == steps - 1:
                bar.set_postfix({k: f"{v:.4g}" for k, v in row.items() if k != "step" and math.isfinite(v)}, refresh=False)
            if checkpoints is not None and save_every and (i + 1) % save_every == 0:
                checkpoints.save(i + 1, state)
                saved = i + 1
        if checkpoints is not None and len(history) > saved:
            checkpoints.save(len(history), state)
    finally:
        bar.close()
        if sink is not None:
            sink.close()
        if checkpoints is not None:
            checkpoints.close()
    return state, history
