"""The outer training loop shared by every method: progress bar, per-step keys, metrics log."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm


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
) -> tuple[Any, list[dict[str, float]]]:
    """Run ``steps`` calls of a jitted ``step(state, batch, key)``; key ``i`` is ``fold_in(key, i)``.

    Returns the final state and one metrics dict per step (also appended as JSON lines to
    ``metrics_path`` when given). Non-finite metrics are reported, never hidden; a step whose
    metrics say ``skipped`` is announced on the console.
    """
    if steps <= 0:
        raise ValueError(f"steps must be > 0 (got {steps})")
    history: list[dict[str, float]] = []
    sink = None
    if metrics_path is not None:
        Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
        sink = open(metrics_path, "a")
    bar = tqdm(range(steps), desc=desc, disable=not progress, dynamic_ncols=True)
    try:
        for i in bar:
            state, metrics = step(state, next(batches), jax.random.fold_in(key, i))
            row = {"step": i, **{k: float(np.asarray(v)) for k, v in metrics.items()}}
            history.append(row)
            if row.get("skipped", 0.0) > 0:
                bar.write(f"{desc} step {i}: non-finite loss or gradient; update skipped, weights unchanged")
            if sink is not None:
                sink.write(json.dumps(row) + "\n")
            if i % 10 == 0 or i == steps - 1:
                bar.set_postfix({k: f"{v:.4g}" for k, v in row.items() if k != "step" and math.isfinite(v)}, refresh=False)
    finally:
        if sink is not None:
            sink.close()
    return state, history
