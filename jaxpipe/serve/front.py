"""The async front of an engine: one thread ticks it, a budget admits requests, a wait window fills batches.

``Front(engine, budget)`` owns the engine's ``tick`` loop: a background thread advances the
engine while it has work and sleeps on a condition variable when it has none (it never spins).
When work arrives at an idle engine the thread waits up to ``budget.max_wait_ms`` (or until
``budget.max_rows`` rows are queued) before the first tick, so requests arriving together start
in one batch instead of the first one starting alone.

``front.submit(request)`` validates and admits a request, returning the engine's ``Handle``
(``await handle`` / ``async for event in handle.events()`` from asyncio). Admission is by the
``Budget``; every refusal is an ``APIError`` with its HTTP status:

* a request the budget can never hold (``n`` rows over ``max_rows``: 400; its memory estimate
  alone over ``max_memory_bytes``: 413) is refused at once, naming the budget;
* over capacity (rows in flight would exceed ``max_rows + max_queued``, or the memory estimates
  in flight would exceed ``max_memory_bytes``): 429 ``busy`` with a ``Retry-After`` computed from
  the current load and the recent service time;
* while draining: 503 ``draining``;
* a model the engine does not serve: 404 listing the served ids; a request the engine's own
  validation rejects (unknown words, bad steps or guidance, a missing image): 400 with the
  engine's message.

The budget, its load snapshot and the memory estimate live in ``budget.py`` (re-exported here).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import re
import threading
import time
from collections.abc import Sequence

from jaxpipe.engine import Engine, Handle
from jaxpipe.request import Request
from jaxpipe.serve.budget import MIN_REQUEST_BYTES, STATE_COPIES, Budget, FrontLoad, estimate_bytes
from jaxpipe.serve.errors import APIError

__all__ = [
    "Budget",
    "Front",
    "FrontLoad",
    "api_error",
    "STATE_COPIES",
    "MIN_REQUEST_BYTES",
    "estimate_bytes",
]  # budget's re-exported

_log = logging.getLogger("jaxpipe.serve")

_MAX_RETRY_S = 600
_FIELD = re.compile(r"\bRequest\.(\w+)")


@dataclasses.dataclass
class _Admitted:
    handle: Handle | None  # None: rows reserved while the engine validates the requests
    rows: int
    bytes: int
    submitted: float


class Front:
    """Drives an ``Engine`` from a background thread and admits requests by a ``Budget``.

    Args:
      engine: the engine to serve (its ``mode`` decides how requests step: serial, interleaved, batched).
      budget: what to admit (default ``Budget()``).

    Submit through the front (a request given to ``engine.submit`` directly does not wake an idle front's
    thread). The thread starts at construction; ``close()`` stops it (``drain`` first for a graceful stop). The front
    bounds the rows in flight; how many of them one batched step carries is the engine's ``max_batch``
    (``jaxpipe serve`` sets it to ``max_rows``).
    """

    def __init__(self, engine: Engine, budget: Budget | None = None):
        self.engine = engine
        self.budget = Budget() if budget is None else budget
        self._cond = threading.Condition()
        self._admitted: dict[str, _Admitted] = {}
        self._arrivals = 0  # rows admitted since the engine was last idle (the wait window's fill)
        self._draining = False
        self._closed = False
        self._ticks = 0
        self._tick_times: collections.deque[float] = collections.deque(maxlen=256)
        self._rows = 0
        self._service_s = 0.0  # a moving average of submit -> done, for Retry-After
        self.refused: collections.Counter[str] = collections.Counter()
        """Admissions refused, by reason (``queue``, ``memory``, ``never_fits``, ``draining``, ``invalid``, ``unknown_model``)."""
        self.finished: collections.Counter[tuple[str, str]] = collections.Counter()
        """Requests finished, by ``(model, status)`` (``completed``, ``failed``, ``cancelled``)."""
        self._thread = threading.Thread(target=self._run, name="jaxpipe-front", daemon=True)
        self._thread.start()

    # ---- admission ----------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        """Whether the front has stopped admitting (``drain`` or ``close`` was called)."""
        return self._draining

    def submit(self, request: Request, previews: bool = False) -> Handle:
        """Admit ``request`` and queue it on the engine: its ``Handle``.

        Args:
          request: the request.
          previews: whether its ``"step"`` events carry latents and decoded previews.

        Returns:
          The engine's handle (``await`` it from asyncio, or ``result()``).

        Raises:
          APIError: 503 while draining, 404 for an unknown model, 400 / 413 for a request that can never fit
            or that the engine rejects, 429 (with ``Retry-After``) over capacity.
        """
        return self.submit_many([request], previews)[0]

    def submit_many(self, requests: Sequence[Request], previews: bool = False) -> list[Handle]:
        """Admit ``requests`` together (one row each): all of them or none.

        Args:
          requests: the requests (e.g. the ``n`` seeds of one image call).
          previews: whether their ``"step"`` events carry latents and decoded previews.

        Returns:
          Their handles, in order.

        Raises:
          APIError: as ``submit``; nothing is queued when it raises.
        """
        requests = list(requests)
        if not requests:
            raise APIError(400, "no requests to submit", param="n")
        rows = len(requests)
        need = sum(self._estimate(r) for r in requests)
        self._check_fits(rows, need, requests[0].model)
        with self._cond:
            self._check_capacity(rows, need)
            ticket = object()
            self._admitted[id(ticket)] = _Admitted(None, rows, need, time.monotonic())  # reserved while submitting
        handles: list[Handle] = []
        try:
            # outside the front's lock: the engine's lock is held by a running tick, whose done callbacks take ours
            for request in requests:
                handles.append(self.engine.submit(request, previews=previews))
        except BaseException as err:
            for h in handles:
                h.cancel()
            with self._cond:
                self._admitted.pop(id(ticket))
                self._arrivals += len(handles)  # wake the thread: the next tick settles the cancelled ones
                self._cond.notify_all()
            if isinstance(err, (ValueError, TypeError)):
                raise self._refusal("invalid", api_error(err)) from err
            raise
        now = time.monotonic()
        with self._cond:
            del self._admitted[id(ticket)]
            for h in handles:
                self._admitted[h.id] = _Admitted(h, 1, need // rows, now)
            self._arrivals += rows
            self._cond.notify_all()
        for h in handles:
            h.add_done_callback(self._settled)
        return handles

    def _estimate(self, request: Request) -> int:
        if self._draining:
            self._draining_error()
        if not isinstance(request, Request):
            raise APIError(400, f"expected a jaxpipe Request (got {type(request).__name__})")
        if not self.engine.serves(request.model):
            raise self._refusal(
                "unknown_model",
                APIError(
                    404,
                    f"unknown model {request.model!r}; this server serves {self.engine.models()}",
                    param="model",
                    code="model_not_found",
                ),
            )
        return estimate_bytes(self.engine, request.model)

    def _check_fits(self, rows: int, need: int, model: str) -> None:
        b = self.budget
        if rows > b.max_rows:
            raise self._refusal(
                "never_fits",
                APIError(
                    400,
                    f"{rows} rows can never fit: this server steps at most max_rows={b.max_rows} rows at once "
                    f"(ask for n <= {b.max_rows})",
                    param="n",
                    code="too_many_rows",
                ),
            )
        if b.max_memory_bytes is not None and need > b.max_memory_bytes:
            raise self._refusal(
                "never_fits",
                APIError(
                    413,
                    f"a {model!r} call of {rows} row(s) needs about {need} bytes, over this server's "
                    f"max_memory_bytes={int(b.max_memory_bytes)}: it can never fit (ask for fewer rows)",
                    code="too_large",
                ),
            )

    def _check_capacity(self, rows: int, need: int) -> None:
        """Under the lock: refuse (429) what the budget cannot hold now."""
        if self._draining:
            self._draining_error()
        b = self.budget
        in_rows = sum(a.rows for a in self._admitted.values())
        in_bytes = sum(a.bytes for a in self._admitted.values())
        limit = b.max_rows + b.max_queued
        if in_rows + rows > limit:
            self._busy(
                "queue",
                f"{in_rows} rows in flight and {rows} asked for, over max_rows + max_queued = {limit}",
                in_rows + rows - limit,
            )
        if b.max_memory_bytes is not None and in_bytes + need > b.max_memory_bytes:
            over = (in_bytes + need - b.max_memory_bytes) / max(1, in_bytes / max(1, in_rows))
            self._busy(
                "memory",
                f"{in_bytes} bytes in flight and {need} asked for, over max_memory_bytes={int(b.max_memory_bytes)}",
                math.ceil(over),
            )

    def _busy(self, reason: str, detail: str, excess_rows: int) -> None:
        retry = self.retry_after(excess_rows)
        raise self._refusal(
            reason,
            APIError(
                429,
                f"the server is busy ({detail}); retry in about {retry} s",
                code="busy",
                headers={"Retry-After": str(retry)},
            ),
        )

    def retry_after(self, excess_rows: int = 1) -> int:
        """Seconds until about ``excess_rows`` rows have finished, from the recent service time (at least 1).

        Args:
          excess_rows: how many admitted rows must finish before the refused request fits.

        Returns:
          Whole seconds for a ``Retry-After`` header.
        """
        per_batch = self._service_s or 1.0
        batches = math.ceil(max(1, excess_rows) / self.budget.max_rows)
        return int(min(_MAX_RETRY_S, max(1, math.ceil(per_batch * batches))))

    def _draining_error(self) -> None:
        raise self._refusal(
            "draining",
            APIError(
                503,
                "the server is draining (shutting down): it admits no new requests",
                code="draining",
                headers={"Retry-After": "5"},
            ),
        )

    def count_refusal(self, reason: str) -> None:
        """Count one refused request under ``reason`` (``jaxpipe_admissions_refused_total``).

        Args:
          reason: ``queue``, ``memory``, ``never_fits``, ``draining``, ``invalid`` or ``unknown_model``.
        """
        with self._cond:
            self.refused[reason] += 1

    def _refusal(self, reason: str, err: APIError) -> APIError:
        """``err``, counted under ``reason`` (the app's handlers count only what the front has not)."""
        self.count_refusal(reason)
        err.counted = True
        return err

    def _settled(self, handle: Handle) -> None:
        """A done callback (on the ticking thread): release the request's share of the budget."""
        with self._cond:
            entry = self._admitted.pop(handle.id, None)
            self.finished[(handle.request.model, handle.status)] += 1
            if entry is not None and handle.status == "completed":
                took = time.monotonic() - entry.submitted
                self._service_s = took if not self._service_s else 0.8 * self._service_s + 0.2 * took
            self._cond.notify_all()

    # ---- what it holds ------------------------------------------------------------------------

    def load(self) -> FrontLoad:
        """What the front holds now (without waiting for a running tick)."""
        with self._cond:
            entries = [a for a in self._admitted.values() if a.handle is not None]
            queued = sum(a.handle.status == "queued" for a in entries)
            return FrontLoad(
                queued,
                len(entries) - queued,
                self._rows,
                sum(a.rows for a in self._admitted.values()),
                sum(a.bytes for a in self._admitted.values()),
            )

    def counts(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """Snapshots of ``refused`` (by reason) and ``finished`` (by ``(model, status)``)."""
        with self._cond:
            return dict(self.refused), dict(self.finished)

    @property
    def ticks(self) -> int:
        """Engine ticks run so far (each advances every running request by one loop step)."""
        return self._ticks

    def steps_per_second(self, window_s: float = 10.0) -> float:
        """Engine ticks per second over the last ``window_s`` seconds (0 when idle)."""
        now = time.monotonic()
        with self._cond:
            recent = [t for t in self._tick_times if now - t <= window_s]
        if len(recent) < 2:
            return 0.0
        return (len(recent) - 1) / max(recent[-1] - recent[0], 1e-9)

    # ---- the ticking thread -------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._closed and self._arrivals == 0 and self.engine.idle:
                    self._cond.wait()
                if self._closed:
                    return
                if self._arrivals and self._rows == 0:
                    # work arrived at an idle engine: let a batch fill (bounded by max_wait_ms and max_rows)
                    deadline = time.monotonic() + self.budget.max_wait_ms / 1000
                    while not self._closed and self._arrivals < self.budget.max_rows:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                self._arrivals = 0
            try:
                more = self.engine.tick()
                failures = 0
            except Exception:  # the engine fails requests alone; whatever escapes must not end the serving thread
                failures += 1
                _log.exception("engine tick failed (%d in a row); the front keeps serving", failures)
                more = True
                with self._cond:
                    self._cond.wait(min(1.0, 0.01 * 2 ** min(failures, 7)))  # back off: never spin on a broken tick
            rows = self.engine.load().rows if more else 0
            with self._cond:
                self._ticks += 1
                self._tick_times.append(time.monotonic())
                self._rows = rows

    # ---- stopping -----------------------------------------------------------------------------

    def drain(self, grace_s: float) -> bool:
        """Stop admitting, let the admitted work finish within ``grace_s`` seconds, cancel what is left.

        Args:
          grace_s: seconds to wait for the admitted requests.

        Returns:
          Whether every admitted request finished on its own (none was cancelled by the drain).
        """
        with self._cond:
            self._draining = True
            deadline = time.monotonic() + max(0.0, grace_s)
            while self._admitted and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            left_over = [a.handle for a in self._admitted.values() if a.handle is not None]
        for h in left_over:
            h.cancel()
        for h in left_over:  # a cancel takes effect at the next tick
            try:
                h.exception(timeout=max(5.0, grace_s))
            except TimeoutError:
                _log.warning("request %s did not settle after its cancel", h.id)
        return not left_over

    def close(self) -> None:
        """Stop admitting, cancel whatever is still admitted, and stop the ticking thread (waits for it)."""
        if self._thread.is_alive() and not self._closed:
            self.drain(0.0)
        with self._cond:
            self._draining = True
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Front:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def api_error(err: BaseException) -> APIError:
    """An engine validation error (``ValueError`` / ``TypeError``) as the HTTP error to answer with.

    Args:
      err: the engine's error (its message names the problem and what is allowed).

    Returns:
      A 404 ``model_not_found`` for an unknown model (the message lists the served ids), else a 400 whose
      ``param`` is the request field the message names (``Request.num_steps`` -> ``num_steps``; words ->
      ``prompt``; the conditioning image -> ``image``).
    """
    message = err.args[0] if err.args and isinstance(err.args[0], str) else str(err)
    field = _FIELD.search(message)
    if field:
        param = field.group(1)
    elif "word" in message:
        param = "prompt"
    else:
        param = "image" if "image" in message else None
    code = "model_not_found" if message.startswith("unknown model") else "invalid_value"
    status = 404 if code == "model_not_found" else 400
    return APIError(status, message, param="model" if status == 404 else param, code=code)
