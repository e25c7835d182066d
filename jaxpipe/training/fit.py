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
    """The rows of a ``metrics.jsonl`` (one JSON object per step); ``[]`` when it does not exist.

    Args:
      path: the file, e.g. the ``metrics_path`` given to ``fit``; blank lines are skipped.

    Returns:
      One dict per line, in file order (``fit`` writes ``{"step": i, <metric>: float, ...}``).
    """
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _resume(
    checkpoints: Checkpoints,
    state: Any,
    batches: Iterator[Any],
    *,
    steps: int,
    metrics_path: str | os.PathLike | None,
    log: Callable[[str], None],
) -> tuple[Any, list[dict[str, float]]]:
    """The newest readable checkpoint's state and metrics rows, ``batches`` advanced past its steps."""
    done, state = checkpoints.restore_latest(state, log=log)
    if done > steps:
        raise ValueError(
            f"the checkpoint in {checkpoints.directory} is at step {done}, past the {steps} steps asked for"
        )
    history = read_metrics(metrics_path)[:done] if metrics_path is not None else []
    if metrics_path is not None and len(history) < done:
        raise ValueError(f"{metrics_path} has {len(history)} rows but the checkpoint is at step {done}")
    if metrics_path is not None:
        Path(metrics_path).write_text("".join(json.dumps(row) + "\n" for row in history))
    for _ in range(done):
        next(batches)
    return state, history


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
    log: Callable[[str], None] = print,
    on_step: Callable[[int, Any], None] | None = None,
) -> tuple[Any, list[dict[str, float]]]:
    """Run jitted ``step(state, batch, key)`` up to step ``steps``; key ``i`` is ``fold_in(key, i)``.

    Each step's metrics become a row ``{"step": i, <name>: float, ...}`` (also appended as JSON lines
    to ``metrics_path`` when given). Non-finite metrics are reported, never hidden; a step whose
    metrics say ``skipped`` is announced on the console.

    Checkpoints (``checkpoint_dir``, orbax): the state is saved every ``save_every`` steps, when
    ``should_stop()`` turns true (checked between steps: the run then ends early, after saving the
    last completed step; fewer rows than ``steps`` come back) and at the end. ``resume=True``
    restores the newest checkpoint, takes its rows back from ``metrics_path`` (dropping rows
    written after it), skips the batches already used and continues: the same rows, bits and
    final state as a run that was never stopped. A damaged newest checkpoint (truncated or
    overwritten files) is not fatal: the run resumes from the newest good one (``Checkpoints``
    keeps two), the same bits again, after one ``log`` line naming the damaged one
    (``Checkpoints.restore_latest``); it is refused (ValueError, one line) only when none is readable,
    or when the checkpoint is past ``steps``.

    Args:
      step: ``(state, batch, key) -> (state, metrics)``, usually jitted; ``metrics`` maps names to scalars.
      state: the initial training state (any pytree the step takes; the restore target on ``resume``).
      batches: an iterator giving one batch per step (on ``resume``, the batches of the restored steps are
        drawn and dropped, so it must start from the same first batch as the original run).
      steps: the total number of steps of the run, > 0 (on ``resume``, counted from step 0).
      key: a PRNG key; step ``i`` gets ``jax.random.fold_in(key, i)``.
      metrics_path: a ``.jsonl`` file the rows are appended to (its folder is created), or ``None``.
      desc: the progress bar's label, also the prefix of the skipped-step line.
      progress: whether to show the progress bar.
      checkpoint_dir: the folder of the orbax checkpoints, or ``None`` for none.
      save_every: save a checkpoint every this many steps (> 0), or ``None`` to save only on a stop and at the end.
      resume: continue from the newest readable checkpoint in ``checkpoint_dir`` (from step 0 when there is none).
      should_stop: called before each step; when it returns true the run saves and ends early.
      log: where a line about a damaged checkpoint goes on ``resume``.
      on_step: called as ``on_step(i, state)`` after step ``i`` (its row written, before its checkpoint), e.g. to
        judge the card every N steps.

    Returns:
      ``(state, history)``: the final state and one metrics row per completed step (from step 0, restored
      rows included).

    Raises:
      ValueError: if ``steps <= 0``, ``save_every <= 0``, ``resume`` or ``save_every`` is given without
        ``checkpoint_dir``, or on ``resume`` if the checkpoint is past ``steps`` or ``metrics_path`` has fewer
        rows than the checkpoint's step.
      DamagedCheckpoint: on ``resume``, if checkpoints exist but none can be read (a ``ValueError``).
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
        try:
            state, history = _resume(checkpoints, state, batches, steps=steps, metrics_path=metrics_path, log=log)
        except BaseException:
            checkpoints.close()  # orbax's threads end cleanly, the error alone is reported
            raise
    start = len(history)
    sink = None
    if metrics_path is not None:
        Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
        sink = open(metrics_path, "a")
    bar = progress_bar(initial=start, total=steps, desc=desc, disable=not progress, dynamic_ncols=True)
    saved = start
    try:
        for i in range(start, steps):
            if should_stop is not None and should_stop():
                break
            state, metrics = step(state, next(batches), jax.random.fold_in(key, i))
            row = {"step": i, **{k: float(np.asarray(v)) for k, v in metrics.items()}}
            history.append(row)
            if i == start:  # the first step compiled: the rate and ETA count from here, on warm steps only
                bar.reset(total=steps)
                bar.initial = bar.n = bar.last_print_n = i + 1
                bar.refresh()
            else:
                bar.update(1)
            if row.get("skipped", 0.0) > 0:
                bar.write(f"{desc} step {i}: non-finite loss or gradient; update skipped, weights unchanged")
            if sink is not None:
                sink.write(json.dumps(row) + "\n")
                sink.flush()
            if on_step is not None:
                on_step(i, state)
            if i % 10 == 0 or i == steps - 1:
                bar.set_postfix(
                    {k: f"{v:.4g}" for k, v in row.items() if k != "step" and math.isfinite(v)}, refresh=False
                )
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
