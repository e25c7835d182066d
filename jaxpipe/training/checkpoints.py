"""Training-state checkpoints with orbax: atomic saves of a state pytree, restored into its own structure.

``Checkpoints(directory)`` keeps the last ``keep`` saves (``step_<n>`` folders written atomically by
orbax: a save that did not finish is never read back). Saves run asynchronously while training
goes on; ``close()`` (or leaving the ``with`` block) waits for them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

__all__ = ["Checkpoints"]


class Checkpoints:
    """Orbax-managed checkpoints of one run's training state in ``directory``."""

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
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
        """The state saved at ``step``, in the structure (and dtypes) of ``like`` (e.g. ``method.init()``)."""
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x, like)
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except (ValueError, KeyError, FileNotFoundError) as err:
            raise ValueError(f"{self.directory / str(step)}: cannot restore the training state: {err}") from None

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpoints":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
