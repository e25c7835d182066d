"""``jaxpipe serve`` as a real process: SIGTERM drains (503 for new work, running work finishes) and exits 0."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe.cli import app

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

GRACE_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Serve:
    """``jaxpipe serve ARGS`` in a subprocess, its output collected as it comes."""

    def __init__(self, *args: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jaxpipe.cli", "serve", "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def output(self) -> str:
        return "".join(self.lines)

    def wait_until_up(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, "the server did not start: " + self.output()[-3000:]
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.slow  # ~15 s: a real server process; by default test_stop_resume sends SIGTERM to the CLI and the drain is tested in-process
def test_sigterm_stops_admitting_lets_running_work_finish_and_exits_0():
    serve = _Serve("--model", "flux-t2i", "--model", "wan-i2v", "--grace", str(GRACE_S))
    try:
        serve.wait_until_up()
        # 64 steps per stage (the batched loops' shortest schedule width): a job that outlasts the signal below
        body = {"model": "image_video.t2i_i2v", "prompt": "seven moving right", "num_steps": 64}
        job = httpx.post(serve.url + "/v1/videos", json=body, timeout=60).json()
        assert job["status"] in ("queued", "in_progress"), job
        serve.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        refused = httpx.post(
            serve.url + "/v1/images/generations", json={"model": "flux-t2i", "prompt": "one"}, timeout=30
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        seen = []
        while serve.proc.poll() is None:  # existing jobs still answer while it drains
            try:
                seen.append(httpx.get(f"{serve.url}/v1/videos/{job['id']}", timeout=5).json()["status"])
            except httpx.TransportError:
                break  # it stopped listening: the drain is over
            time.sleep(0.02)
        code = serve.proc.wait(timeout=GRACE_S + 30)
        took = time.monotonic() - signalled
    finally:
        serve.kill()
    out = serve.output()
    assert code == 0, out[-3000:]
    assert took < GRACE_S, took
    assert seen and set(seen) <= {"queued", "in_progress", "completed"}, seen
    assert "drained: every request finished" in out, out[-3000:]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--mode", "fast"], "--mode must be one of batched, serial, interleaved"),
        (["--max-rows", "0"], "--max-rows must be a positive integer"),
        (["--max-queued", "-1"], "--max-queued must be an integer >= 0"),
        (["--max-memory-gb", "0"], "--max-memory-gb must be a positive number"),
        (["--grace", "-1"], "--grace must be a finite number of seconds >= 0"),
        (["--port", "70000"], "--port must be in [0, 65535]"),
        (["--warm", "-1"], "--warm must be a number of rows >= 0"),
        (["--model", "nope"], "unknown card 'nope'"),
        (["--model", "image_video.t2i_i2v", "--model", "flux-t2i"], "add --model for ['wan-i2v']"),
    ],
)
def test_bad_flags_fail_with_one_line(flags, message):
    result = CliRunner().invoke(app, ["serve", *flags])
    assert result.exit_code == 2 and message in result.output, result.output


def test_warming_compiles_each_burst_size_so_a_first_burst_compiles_nothing(t2i_card, i2v_card):
    from jaxpipe.serve import warmup

    engine = jp.Engine(max_batch=4)
    engine.register(t2i_card)
    engine.register(i2v_card)  # reads an image: not warmed
    assert warmup.capacities(5, 4) == [1, 2, 3, 4] and warmup.capacities(2, 64) == [1, 2]
    assert warmup.warm_prompt(i2v_card) is None and warmup.warm_prompt(t2i_card) == "zero"
    assert warmup.warm(engine, 3, progress=False) == [("flux-t2i", 1), ("flux-t2i", 2), ("flux-t2i", 3)]
    compiled = engine.compiled_batches()
    assert {capacity for _, capacity in compiled} == {1, 2, 3}
    handles = [engine.submit(jp.Request("flux-t2i", prompt="seven", seed=s)) for s in range(3)]  # a first burst
    while engine.tick():
        pass
    assert all(h.result()["image"].shape == (16, 16, 1) for h in handles)
    assert engine.compiled_batches() == compiled  # it found its step compiled
    stopped = warmup.warm(jp.Engine(max_batch=4), 4, progress=False, should_stop=lambda: True)
    assert stopped == []


def test_warming_skips_an_id_served_with_a_program_that_reads_an_image():
    from jaxpipe.serve import warmup
    from jaxpipe.serve.chat import register_text_programs

    engine = jp.Engine(max_batch=2)
    engine.register(jp.cards.load("bagel-mot"))
    register_text_programs(engine)  # bagel-mot:understand: the same card, a program that reads an image
    assert warmup.warm_prompt(engine.card("bagel-mot:understand"), engine.program("bagel-mot:understand")) is None
    assert warmup.warm(engine, 1, progress=False) == [("bagel-mot", 1)]
