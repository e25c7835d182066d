"""A submitted request's handle: its id, status, progress, result and event stream.

``Engine.submit(request)`` returns a ``Handle`` at once; the engine's ``tick`` (on whatever
thread drives it) moves it through ``queued -> running -> completed | failed | cancelled``. The
handle is the only object shared between the ticking thread and its readers, so every field a
reader sees is written under the handle's own condition variable. Readers wait with
``result(timeout)``, iterate ``events()`` (blocking, or ``async for`` from asyncio), or ``await``
the handle itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from jaxpipe.request import Output, Request

__all__ = ["Event", "EventStream", "Handle", "Progress", "STATUSES", "FINAL"]

STATUSES = ("queued", "running", "completed", "failed", "cancelled")
"""A handle's statuses, in lifecycle order (the last three are final)."""
FINAL = frozenset(STATUSES[2:])

_SALT = os.urandom(4).hex()
_COUNTER = itertools.count()


def _new_id() -> str:
    return f"req-{_SALT}{next(_COUNTER):04x}"


@dataclasses.dataclass(frozen=True)
class Progress:
    """Where a request is: the stage path (``""`` for a plain card request), its loop and steps done."""

    stage: str = ""
    loop: str | None = None
    step: int = 0
    num_steps: int = 0


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing that happened to a request.

    Attributes:
      kind: ``"queued"``, ``"started"``, ``"step"``, ``"completed"``, ``"failed"`` or ``"cancelled"``.
      stage: the stage path of a workflow request (``"i2v"``), ``""`` for a plain card request.
      loop: the loop that stepped (``"step"`` events), else ``None``.
      step: steps of ``loop`` done.
      num_steps: the loop's steps for this request.
      tick: the engine tick it happened on.
      latents: with ``previews=True``, on ``"step"`` events: the request's loop latents ``(*latent_shape)``
        as a NumPy array (a text loop's token buffer ``(max_len,)``); else ``None``.
      image: the decoded preview (``(H, W, C)`` or ``(T, H, W, C)`` in [0, 1]) where the card's program
        decodes its loop's latents by itself; else ``None``.
    """

    kind: str
    stage: str = ""
    loop: str | None = None
    step: int = 0
    num_steps: int = 0
    tick: int = 0
    latents: Any = None
    image: Any = None


class Handle:
    """A request submitted to an engine (``Engine.submit``): wait for it, watch it, cancel it."""

    def __init__(self, request: Request, *, previews: bool = False):
        self.id = _new_id()
        self.request = request
        self.previews = bool(previews)
        self._status = "queued"
        self._progress = Progress()
        self._output: Output | None = None
        self._error: BaseException | None = None
        self._cancel = False
        self._events: list[Event] = [Event("queued")]
        self._callbacks: list[Callable[[Handle], None]] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._cond = threading.Condition()

    def __repr__(self) -> str:
        return f"Handle({self.id}, {self.request.model!r}, {self._status})"

    # ---- what readers see ----------------------------------------------------------------------

    @property
    def status(self) -> str:
        """``"queued"``, ``"running"``, ``"completed"``, ``"failed"`` or ``"cancelled"``."""
        return self._status

    @property
    def progress(self) -> Progress:
        """The request's stage, loop and steps done so far."""
        return self._progress

    @property
    def cancel_requested(self) -> bool:
        """Whether ``cancel()`` was called (it takes effect at the engine's next tick)."""
        return self._cancel

    def done(self) -> bool:
        """Whether the request has finished (completed, failed or cancelled)."""
        return self._status in FINAL

    def cancel(self) -> bool:
        """Ask the engine to cancel the request at its next tick (its batch slot is freed then).

        Returns:
          ``False`` if the request had already finished, else ``True``.
        """
        with self._cond:
            if self.done():
                return False
            self._cancel = True
            return True

    def result(self, timeout: float | None = None) -> Output:
        """The request's ``Output``, waiting up to ``timeout`` seconds (``None``: forever).

        A cancelled request returns an ``Output`` with ``cancelled`` set (no artifacts).

        Raises:
          TimeoutError: if it has not finished in time.
          Exception: the request's own error, if it failed.
        """
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._output

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The request's error once it finished (``None`` if it did not fail); ``TimeoutError`` if not done in time."""
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[Handle], None]) -> None:
        """Call ``fn(handle)`` when the request finishes (at once if it has; else on the ticking thread)."""
        with self._cond:
            if not self.done():
                self._callbacks.append(fn)
                return
        fn(self)

    def events(self) -> EventStream:
        """The request's events from the first (``queued``) to the final one: ``for`` or ``async for``."""
        return EventStream(self)

    def __await__(self):
        return self._async_result().__await__()

    async def _async_result(self) -> Output:
        async for _ in self.events():
            pass
        return self.result(0)

    def _wait(self, timeout: float | None) -> None:
        with self._cond:
            if not self._cond.wait_for(self.done, timeout):
                raise TimeoutError(
                    f"request {self.id} ({self.request.model!r}) is still {self._status} after {timeout} s"
                )

    # ---- what the engine writes ----------------------------------------------------------------
    # Only the engine's scheduler calls ``record`` and ``finish`` (on its ticking thread); a reader never does.

    def record(self, event: Event, *, status: str | None = None, progress: Progress | None = None) -> None:
        """The engine's side: append ``event`` (and set ``status`` / ``progress``), waking every reader.

        Args:
          event: what happened.
          status: the new status, if it changes.
          progress: the new progress, if it changes.
        """
        with self._cond:
            if self.done():
                return
            if status is not None:
                self._status = status
            if progress is not None:
                self._progress = progress
            self._events.append(event)
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, flag in waiters:
            try:
                loop.call_soon_threadsafe(flag.set)
            except RuntimeError:  # that event loop has closed: nobody is listening
                pass

    def finish(self, output: Output | None, error: BaseException | None, tick: int) -> None:
        """The engine's side: the request ended with ``output`` (or failed with ``error``) at ``tick``; its final
        event is recorded and its done callbacks run (nothing happens if it had already finished).

        Args:
          output: the request's ``Output`` (``None`` when it failed).
          error: its error, or ``None``.
          tick: the engine tick it ended on.
        """
        if self.done():
            return
        self._output, self._error = output, error
        kind = "failed" if error is not None else "cancelled" if output.cancelled else "completed"
        self.record(Event(kind, self._progress.stage, tick=tick), status=kind)
        with self._cond:
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


class EventStream:
    """A handle's events, replayed from the start: iterate it (blocking) or ``async for`` it."""

    def __init__(self, handle: Handle):
        self._handle = handle

    def __iter__(self) -> Iterator[Event]:
        h, i = self._handle, 0
        while True:
            with h._cond:
                h._cond.wait_for(lambda i=i: i < len(h._events) or h.done())
                fresh, finished = h._events[i:], h.done()
            yield from fresh
            i += len(fresh)
            if finished and i >= len(h._events):
                return

    async def __aiter__(self) -> AsyncIterator[Event]:
        h, i = self._handle, 0
        loop = asyncio.get_running_loop()
        while True:
            flag = asyncio.Event()
            with h._cond:
                fresh, finished = h._events[i:], h.done()
                if not fresh and not finished:
                    h._waiters.append((loop, flag))
            for event in fresh:
                yield event
            i += len(fresh)
            if finished and i >= len(h._events):
                return
            if not fresh:
                await flag.wait()
