"""Running the app on uvicorn: in the foreground with a graceful SIGTERM drain (``jaxpipe serve``), or in a thread.

``run(app, front, host=, port=, grace_s=)`` serves until SIGTERM or SIGINT. The first signal starts
a drain instead of uvicorn's own stop: the front stops admitting (every new ``POST`` gets 503
``draining``; ``GET``s, such as polling an existing video job, still answer), the admitted work gets
up to ``grace_s`` seconds to finish, whatever is left is cancelled (at the engine's next tick: a tick
in progress, a compile say, is not interrupted), and only then is uvicorn told to exit (it finishes
the responses in flight, closes its connections and returns). A second SIGINT stops at once. Nothing is written
to disk, so a stop leaves nothing half-written; the exit status is 0 after a drain.

``serve_in_thread(app)`` runs the app on a free loopback port in a daemon thread (tests, notebooks)
and yields its base URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import uvicorn

from jaxpipe.serve.front import Front

__all__ = ["Served", "run", "serve_in_thread"]

_log = logging.getLogger("jaxpipe.serve")


class Served(NamedTuple):
    """A server running in this process: its base URL (``http://127.0.0.1:PORT``) and its front."""

    url: str
    front: Front


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``run`` installs the draining handlers instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _config(app, *, log_level: str, **kwargs) -> uvicorn.Config:
    # lifespan off: the app has no startup work (the front is built and ticking before the app is served)
    return uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5, **kwargs)


def run(
    app,
    front: Front,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    grace_s: float = 30.0,
    log_level: str = "info",
    on_ready=None,
) -> int:
    """Serve ``app`` until SIGTERM / SIGINT, draining ``front`` first (see the module docstring). Main thread only.

    Args:
      app: the ASGI app (``create_app(front)``).
      front: the front to drain on a signal (closed before returning).
      host: the address to bind.
      port: the port to bind.
      grace_s: seconds the admitted work gets to finish after the signal.
      log_level: uvicorn's log level.
      on_ready: called with the base URL once the server accepts connections.

    Returns:
      The exit status: 0 after a stop by signal (or uvicorn ending), 1 if the server could not start.
    """
    server = _Server(_config(app, host=host, port=port, log_level=log_level))
    started = asyncio.run(_serve(server, front, grace_s, on_ready, host, port))
    return 0 if started else 1


async def _serve(server: _Server, front: Front, grace_s: float, on_ready, host: str, port: int) -> bool:
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task] = []

    async def drain(signum: int) -> None:
        _log.warning(
            "%s: draining (no new requests; up to %g s for the running ones)", signal.Signals(signum).name, grace_s
        )
        finished = await asyncio.to_thread(front.drain, grace_s)
        _log.warning("drained: %s", "every request finished" if finished else "the unfinished requests were cancelled")
        server.should_exit = True

    def on_signal(signum: int) -> None:
        if draining:
            if signum == signal.SIGINT:  # a second Ctrl-C: stop now
                _log.warning("second SIGINT: stopping without waiting")
                server.should_exit = server.force_exit = True
            return
        draining.append(loop.create_task(drain(signum)))

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)

    async def announce() -> None:
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.05)
        if server.started and on_ready is not None:
            on_ready(f"http://{host}:{port}")

    watcher = loop.create_task(announce())
    try:
        await server.serve()
    finally:
        watcher.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        for task in draining:
            if not task.done():
                task.cancel()
        await asyncio.to_thread(front.close)
    return server.started


def _free_socket(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


@contextlib.contextmanager
def serve_in_thread(
    app, *, host: str = "127.0.0.1", timeout_s: float = 30.0, log_level: str = "warning"
) -> Iterator[str]:
    """Serve ``app`` in a daemon thread on a free port of ``host`` (bound before it starts: no race for the port).

    Args:
      app: the ASGI app.
      host: a loopback address.
      timeout_s: how long to wait for the server to start.
      log_level: uvicorn's log level.

    Yields:
      The base URL, ``http://HOST:PORT``; on exit the server stops (its front is left to the caller).

    Raises:
      RuntimeError: if it does not start within ``timeout_s``.
    """
    sock = _free_socket(host)
    port = sock.getsockname()[1]
    server = _Server(_config(app, log_level=log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the server on {host}:{port} did not start within {timeout_s} s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()
