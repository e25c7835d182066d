"""Training-state checkpoints with orbax: atomic saves of a state pytree, restored into its own structure.

``Checkpoints(directory)`` keeps the last ``keep`` saves (``<step>`` folders written atomically by
orbax: a save that did not finish is never read back). Saves run asynchronously while training
goes on; ``close()`` (or leaving the ``with`` block) waits for them. A checkpoint damaged after
it was written (files truncated or overwritten) fails to restore with ``DamagedCheckpoint``;
``restore_latest`` then falls back to the one before it, which ``keep >= 2`` keeps for that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

__all__ = ["Checkpoints", "DamagedCheckpoint"]


class DamagedCheckpoint(ValueError):
    """A checkpoint orbax cannot read back: ``path`` (the ``<step>`` folder), ``step``, and why (the message)."""

    def __init__(self, path: Path, step: int, reason: str, message: str | None = None):
        self.path, self.step, self.reason = path, step, reason
        super().__init__(message or f"{path}: cannot restore the training state: {reason}")


def _loop_closed(unraisable) -> bool:
    return isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"


def _drop_abandoned_reads() -> None:
    """Keep the reads a failed restore abandons from printing a traceback each.

    Orbax gathers one read per array on an event loop it closes as soon as one fails; the others
    finish on the closed loop (within ~50 ms), and each can only report ``Event loop is closed``
    as unraisable: hundreds of tracebacks. Only that report is dropped; anything else reaches the
    hook that was there before. Installed before each restore (once per hook in place), and left
    in place, since those reads land after ``restore`` has returned.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_drops_abandoned_reads", False):
        return

    def hook(unraisable):
        if not _loop_closed(unraisable):
            previous(unraisable)

    hook._drops_abandoned_reads = True
    sys.unraisablehook = hook


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax's absl warnings and errors while it reads a checkpoint that may be damaged: the failure itself is
    reported once, by the caller, in its own words."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _first_line(err: BaseException, limit: int = 100) -> str:
    text = (str(err).strip().splitlines() or [type(err).__name__])[0].split(" See full TensorStore details")[0]
    text = text.rstrip(". ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Checkpoints:
    """Orbax-managed checkpoints of one run's training state in ``directory``."""

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        with _quiet_orbax():  # it reads every checkpoint's metadata, damaged or not: restore names the damage
            self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint (``None``: none yet)."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any) -> None:
        """Save ``state`` as of ``step`` completed steps (asynchronously; replaces an existing save of that step)."""
        if step in self._manager.all_steps():
            return
        self._manager.save(step, args=ocp.args.StandardSave(state))

    def restore(self, step: int, like: Any) -> Any:
        """The state saved at ``step``, in the structure (and dtypes) of ``like`` (e.g. ``method.init()``).

        Raises:
            DamagedCheckpoint: orbax cannot read it back (files truncated, overwritten or missing).
        """
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x, like)
        # before the restore, not after it fails: the reads it abandons report from other threads, some
        # before the failure reaches this one
        _drop_abandoned_reads()
        try:
            with _quiet_orbax():
                return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as err:  # orbax and tensorstore raise bare Exceptions for unreadable bytes
            raise DamagedCheckpoint(self.directory / str(step), step, _first_line(err)) from None

    def restore_latest(self, like: Any, *, log: Callable[[str], None] = print) -> tuple[int, Any]:
        """The newest checkpoint that can be read back, as ``(step, state)``; ``(0, like)`` when there is none.

        A damaged newer checkpoint is skipped for the one before it (the run then redoes the steps
        in between, to the same bits): it is renamed ``<step>.damaged`` (kept for a look, out of
        orbax's way, so that step is saved afresh) and named in one ``log`` line with the step the
        run resumes from.

        Raises:
            DamagedCheckpoint: every checkpoint is damaged (the newest is named); nothing is renamed.
        """
        damaged: list[DamagedCheckpoint] = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                state = self.restore(step, like)
            except DamagedCheckpoint as err:
                damaged.append(err)
                continue
            for err in damaged:
                aside = err.path.with_name(f"{err.path.name}.damaged")
                if aside.exists():
                    aside = err.path.with_name(f"{err.path.name}.damaged-{os.getpid()}")
                err.path.rename(aside)
                log(
                    f"warning: checkpoint {err.path} is damaged ({err.reason}); resuming from step {step}, the newest "
                    f"good checkpoint (the damaged one is kept as {aside.name})"
                )
            if damaged:
                with _quiet_orbax():
                    self._manager.reload()
            return step, state
        if damaged:
            newest = damaged[0]
            raise DamagedCheckpoint(
                newest.path,
                newest.step,
                newest.reason,
                f"checkpoint {newest.path} is damaged ({newest.reason}) and no earlier one can be read: "
                "the run cannot resume; start it again (--overwrite)",
            )
        return 0, like

    def close(self) -> None:
        """Wait for the saves still running, then release orbax's threads."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
