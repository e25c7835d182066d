"""Safe stopping: SIGINT / SIGTERM become a flag that long-running work checks at safe points.

A ``KeyboardInterrupt`` raised while XLA compiles or runs a computation unwinds Python through
JAX's C++ frames and tears the interpreter down while XLA's threads are still working: the
``jaxpipe`` command used to die with SIGSEGV (exit -11) when Ctrl-C landed during a compile.
``Stopper`` replaces the default handlers with one that only records the signal; training checks
it between steps (``fit(should_stop=...)``), the engine between loop steps (``cancel=``), evaluation
between batches. The command then writes what it has and exits ``128 + signal`` (130 for SIGINT,
143 for SIGTERM). A second signal exits at once, without writing anything more.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["Stopped", "Stopper", "exit_code"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(signum: int) -> int:
    """The shell's exit status for a process ended by ``signum``: ``128 + signum``.

    Args:
      signum: the signal number (e.g. ``signal.SIGINT``, 2).

    Returns:
      ``128 + signum`` (130 for SIGINT, 143 for SIGTERM).
    """
    return 128 + int(signum)


class Stopped(Exception):
    """Work stopped at a safe point because a stop was requested (``signum``: the signal, if any)."""

    def __init__(self, signum: int | None = None, message: str = "stopped"):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The exit status to end the process with: ``128 + signum`` (SIGINT's, 130, without a signal)."""
        return exit_code(self.signum if self.signum is not None else signal.SIGINT)


class Stopper:
    """A stop flag set by SIGINT / SIGTERM while the ``with`` block runs (handlers restored after).

    Call it (or ``is_set()``, so it can serve as an ``Engine.run_many(cancel=...)``) to ask whether a
    stop was requested; ``check()`` raises ``Stopped`` when one was. Outside the main thread it
    installs nothing and never fires.
    """

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __call__(self) -> bool:
        """Whether a stop was requested."""
        return self.signum is not None

    is_set = __call__

    def check(self) -> None:
        """Raises ``Stopped`` (with the signal) if a stop was requested; returns otherwise.

        Raises:
          Stopped: if a stop was requested.
        """
        if self.signum is not None:
            raise Stopped(self.signum)

    def __enter__(self) -> Stopper:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            sys.stderr.write(f"\n{signal.Signals(signum).name} again: exiting now\n")
            sys.stderr.flush()
            os._exit(exit_code(signum))
        self.signum = signum
        sys.stderr.write(
            f"\n{signal.Signals(signum).name}: stopping at the next safe point (send it again to exit at once)\n"
        )
        sys.stderr.flush()
