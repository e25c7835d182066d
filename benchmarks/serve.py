"""Load test of ``jaxpipe serve``: a mixed stream from concurrent HTTP clients, then batched vs one-at-a-time.

The server is a real ``jaxpipe serve`` process on a free loopback port (uvicorn, the bundled ``flux-t2i``,
``wan-i2v`` and ``unified`` cards); the clients are ``httpx.AsyncClient``s in this process. Two parts:

1. **Mixed stream** (``--clients`` concurrent clients for ``--seconds``, server in the batched mode): each
   client loops over a seeded mix of image generations (``/v1/images/generations``), video jobs
   (``POST /v1/videos``, polled to completion, ``/content`` fetched), chat completions (streamed over SSE),
   bad bodies (an unknown word: must get a 400) and cancellations (a video job deleted at once: must end
   ``cancelled``, or ``completed`` if it finished first). A request is **lost** when it gets no answer, an
   unexpected status (5xx, or a 4xx it did not earn) or a job that never reaches a final state: there must
   be none. Reported: errors by kind, p50 / p99 latency per kind, throughput.
2. **Batched vs one at a time**: image generations only, 16 and 64 concurrent clients, ``--per-client``
   requests each, against the server in ``--mode batched`` and in ``--mode serial`` (one request at a time),
   each started fresh and warmed up. Throughput (images / s) side by side and the ratio.

Every image the server returns as exact float32 (``output_format="npy"``, an extra body field) is checked
against the offline rendering of the same request in this process (``Engine.run``, the engine's serial
path): bit for bit when the server ran one request at a time (C1 through HTTP), within the C3 tolerance
(``jaxpipe.parity.TOLERANCE``) when it batched.

    python benchmarks/serve.py --results benchmarks/RESULTS.md
    python benchmarks/serve.py --quick        # a few seconds, 4 clients, prints only (the smoke test)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import io
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import report  # noqa: E402

SECTION = "serve"
CARDS = ("flux-t2i", "wan-i2v", "unified")
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
EXTRAS = ("", " thick", " thin", " left", " right", " bright", " dim")
STEPS = (4, 8)


def free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``jaxpipe serve`` subprocess on a free loopback port (``with Server(...) as url``)."""

    def __init__(self, mode: str, max_rows: int):
        self.mode, self.max_rows = mode, max_rows
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def __enter__(self) -> str:
        import httpx

        models = [a for card in CARDS for a in ("--model", card)]
        cmd = [
            sys.executable,
            "-m",
            "jaxpipe.cli",
            "serve",
            "--port",
            str(self.port),
            *models,
            "--mode",
            self.mode,
            "--max-rows",
            str(self.max_rows),
            "--max-queued",
            "4096",
            "--grace",
            "30",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jaxpipe serve exited {self.proc.returncode}: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("jaxpipe serve did not answer /health within 300 s")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def prompt_of(rng: random.Random) -> str:
    return rng.choice(DIGITS) + rng.choice(EXTRAS)


def decode_npy(text: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


class Tally:
    """What the clients saw: per kind, latencies, outcomes and the images to check."""

    def __init__(self):
        self.latency: dict[str, list[float]] = collections.defaultdict(list)
        self.outcomes: collections.Counter = collections.Counter()
        self.lost: list[str] = []
        self.images: list[tuple[dict, np.ndarray]] = []

    def done(self, kind: str, outcome: str, started: float) -> None:
        self.latency[kind].append(time.monotonic() - started)
        self.outcomes[(kind, outcome)] += 1

    def lose(self, kind: str, why: str) -> None:
        self.outcomes[(kind, "lost")] += 1
        self.lost.append(f"{kind}: {why}")


async def image(client, tally: Tally, body: dict) -> None:
    started = time.monotonic()
    try:
        r = await client.post(
            "/v1/images/generations", json={**body, "response_format": "b64_json", "output_format": "npy"}
        )
    except Exception as err:  # noqa: BLE001 - a transport error is a lost request
        tally.lose("image", repr(err))
        return
    if r.status_code != 200:
        tally.lose("image", f"{r.status_code} {r.text[:200]}")
        return
    tally.images.append((body, decode_npy(r.json()["data"][0]["b64_json"])))
    tally.done("image", "ok", started)


async def job(client, tally: Tally, body: dict, *, cancel: bool) -> None:
    kind = "cancel" if cancel else "video"
    started = time.monotonic()
    try:
        r = await client.post("/v1/videos", json=body)
        if r.status_code != 200:
            tally.lose(kind, f"create {r.status_code} {r.text[:200]}")
            return
        vid = r.json()["id"]
        if cancel:
            r = await client.delete(f"/v1/videos/{vid}")
            if r.status_code != 200:
                tally.lose(kind, f"delete {r.status_code} {r.text[:200]}")
                return
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = (await client.get(f"/v1/videos/{vid}")).json()["status"]
            if status in ("completed", "failed", "cancelled"):
                break
            await asyncio.sleep(0.05)
        else:
            tally.lose(kind, "never finished")
            return
        if status == "failed" or (not cancel and status != "completed"):
            tally.lose(kind, f"ended {status}")
            return
        if status == "completed":
            content = await client.get(f"/v1/videos/{vid}/content")
            if content.status_code != 200 or not content.content.startswith(b"GIF8"):
                tally.lose(kind, f"content {content.status_code}")
                return
        tally.done(kind, status, started)
    except Exception as err:  # noqa: BLE001
        tally.lose(kind, repr(err))


async def chat(client, tally: Tally, body: dict) -> None:
    started = time.monotonic()
    try:
        text = ""
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                tally.lose("chat", f"{r.status_code}")
                return
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    import json

                    for choice in json.loads(line[6:]).get("choices", []):
                        text += (choice.get("delta") or {}).get("content") or ""
        tally.done("chat", "ok" if text else "empty", started)
    except Exception as err:  # noqa: BLE001
        tally.lose("chat", repr(err))


async def bad(client, tally: Tally, rng: random.Random) -> None:
    started = time.monotonic()
    try:
        r = await client.post(
            "/v1/images/generations", json={"model": "flux-t2i", "prompt": "seven purple", "seed": rng.randrange(99)}
        )
    except Exception as err:  # noqa: BLE001
        tally.lose("bad body", repr(err))
        return
    if r.status_code != 400 or "purple" not in r.json()["error"]["message"]:
        tally.lose("bad body", f"{r.status_code} {r.text[:200]}")
        return
    tally.done("bad body", "400", started)


async def mixed_client(url: str, index: int, seconds: float, tally: Tally) -> None:
    import httpx

    rng = random.Random(index)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            roll = rng.random()
            seed = rng.randrange(10_000)
            if roll < 0.65:
                await image(
                    client,
                    tally,
                    {"model": "flux-t2i", "prompt": prompt_of(rng), "seed": seed, "num_steps": rng.choice(STEPS)},
                )
            elif roll < 0.75:
                await job(
                    client,
                    tally,
                    {
                        "model": "image_video.t2i_i2v",
                        "prompt": prompt_of(rng) + " moving right",
                        "seed": seed,
                        "num_steps": 4,
                    },
                    cancel=False,
                )
            elif roll < 0.85:
                await chat(
                    client,
                    tally,
                    {"model": "unified", "messages": [{"role": "user", "content": rng.choice(DIGITS)}], "seed": seed},
                )
            elif roll < 0.93:
                await bad(client, tally, rng)
            else:
                await job(
                    client,
                    tally,
                    {
                        "model": "image_video.t2i_i2v",
                        "prompt": prompt_of(rng) + " moving left",
                        "seed": seed,
                        "num_steps": 8,
                    },
                    cancel=True,
                )


async def image_clients(url: str, clients: int, per_client: int, tally: Tally) -> float:
    """``clients`` concurrent clients, each sending ``per_client`` image requests back to back: wall seconds."""
    import httpx

    async def one(index: int) -> None:
        rng = random.Random(1000 + index)
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            for _ in range(per_client):
                await image(
                    client,
                    tally,
                    {"model": "flux-t2i", "prompt": prompt_of(rng), "seed": rng.randrange(10_000), "num_steps": 8},
                )

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(clients)))
    return time.monotonic() - started


def check_images(images: list[tuple[dict, np.ndarray]], exact: bool) -> tuple[int, float]:
    """Compare served images with ``Engine.run`` of the same requests: (how many differ, the max abs gap)."""
    import jaxpipe as jp

    engine = CHECK_ENGINE.setdefault("engine", None) or jp.Engine()
    if not engine.models():
        engine.register(jp.cards.load("flux-t2i"))
        CHECK_ENGINE["engine"] = engine
    bad_count, gap = 0, 0.0
    for body, served in images:
        offline = np.asarray(
            engine.run(jp.Request("flux-t2i", prompt=body["prompt"], seed=body["seed"], num_steps=body["num_steps"]))[
                "image"
            ]
        )
        diff = float(np.abs(offline - served).max())
        gap = max(gap, diff)
        ok = np.array_equal(offline, served) if exact else diff <= jp.parity.TOLERANCE
        bad_count += not ok
    return bad_count, gap


CHECK_ENGINE: dict = {}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients of the mixed stream")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the mixed stream runs")
    parser.add_argument(
        "--warmup", type=float, default=40.0, help="seconds of unrecorded mixed stream first (compiles)"
    )
    parser.add_argument(
        "--per-client", type=int, default=8, help="image requests per client in the batched-vs-serial part"
    )
    parser.add_argument("--sizes", default="16,64", help="client counts of the batched-vs-serial part")
    parser.add_argument(
        "--quick", action="store_true", help="4 clients for 5 s, sizes 2 and 4, prints only (the smoke test)"
    )
    parser.add_argument(
        "--results", type=pathlib.Path, default=None, help="write the 'serve' section of this RESULTS.md"
    )
    args = parser.parse_args()
    if args.quick:
        args.clients, args.seconds, args.per_client, args.sizes, args.warmup = 4, 5.0, 1, "2,4", 0.0
    sizes = [int(s) for s in args.sizes.split(",")]
    max_rows = max([64, *sizes])

    # part 1: the mixed stream against the batched server
    mixed = Tally()
    with Server("batched", max_rows) as url:
        asyncio.run(image_clients(url, 2, 1, Tally()))  # warm-up: compile the first shapes
        if args.warmup > 0:  # and the mix's other shapes (batch capacities, video, chat), unrecorded

            async def warm() -> None:
                await asyncio.gather(*(mixed_client(url, 100 + i, args.warmup, Tally()) for i in range(args.clients)))

            asyncio.run(warm())
        started = time.monotonic()

        async def stream() -> None:
            clients = asyncio.gather(*(mixed_client(url, i, args.seconds, mixed) for i in range(args.clients)))
            await asyncio.wait_for(clients, args.seconds + 600)

        asyncio.run(stream())
        wall = time.monotonic() - started
    mixed_bad, mixed_gap = check_images(mixed.images, exact=False)

    # part 2: batched vs one at a time, images only
    rows = []
    for size in sizes:
        results = {}
        for mode in ("batched", "serial"):
            tally = Tally()
            with Server(mode, max_rows) as url:
                # a fresh server compiles every batch capacity and cohort size it meets: the same load once
                # untimed-for-the-ratio (its throughput is the cold column), then timed warm
                cold = Tally()
                cold_seconds = asyncio.run(image_clients(url, size, args.per_client, cold))
                seconds = asyncio.run(image_clients(url, size, args.per_client, tally))
            bad_count, gap = check_images(tally.images, exact=mode == "serial")
            results[mode] = (
                len(tally.images) / seconds,
                len(tally.lost) + len(cold.lost),
                bad_count,
                gap,
                percentile(tally.latency["image"], 0.5),
                len(cold.images) / cold_seconds,
            )
        rows.append((size, results))

    info = report.machine_info(**{"server": "jaxpipe serve (uvicorn), loopback", "cards": ", ".join(CARDS)})
    lines = [
        f"`python benchmarks/serve.py{' --quick' if args.quick else ''}`: a real `jaxpipe serve` process on a loopback port; "
        f"httpx async clients in the benchmark's process. Images are checked against `Engine.run` of the same request "
        f'(float32 through `output_format="npy"`): bit for bit one at a time (C1), within {__import__("jaxpipe").parity.TOLERANCE:g} batched (C3).',
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        "",
        f"### mixed stream: {args.clients} clients for {args.seconds:g} s after {args.warmup:g} s of warm-up "
        f"(server batched, max rows {max_rows})",
        "",
        "| kind | outcome | count | p50 latency (s) | p99 latency (s) |",
        "|---|---|---|---|---|",
    ]
    for (kind, outcome), count in sorted(mixed.outcomes.items()):
        lat = mixed.latency.get(kind, [])
        lines.append(f"| {kind} | {outcome} | {count} | {percentile(lat, 0.5):.2f} | {percentile(lat, 0.99):.2f} |")
    total = sum(mixed.outcomes.values())
    lines += [
        "",
        f"- requests: {total} in {wall:.1f} s ({total / wall:.2f} / s); **lost: {len(mixed.lost)}**"
        + (f" ({'; '.join(mixed.lost[:5])})" if mixed.lost else ""),
        f"- images checked against offline rendering: {len(mixed.images)}, outside C3: {mixed_bad} (max gap {mixed_gap:.1e})",
        "",
        "### batched vs one at a time (flux-t2i, 8 steps, images only)",
        "",
        "Warm: the second pass of the same load on the same server. Cold: the first pass of a fresh server "
        "process (compiling as it meets new batch shapes).",
        "",
        "| clients | batched (img/s) | one at a time (img/s) | batched / one at a time | cold: batched / one at a time (img/s) | p50 batched (s) | p50 one at a time (s) | lost | C1 (one at a time) | C3 (batched, max gap) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size, r in rows:
        b, s = r["batched"], r["serial"]
        c1 = "bit for bit" if s[2] == 0 else f"{s[2]} differ"
        c3 = f"{'ok' if b[2] == 0 else f'{b[2]} outside'} ({b[3]:.1e})"
        lines.append(
            f"| {size} | {b[0]:.2f} | {s[0]:.2f} | **{b[0] / s[0]:.2f}×** | {b[5]:.2f} / {s[5]:.2f} | {b[4]:.2f} | "
            f"{s[4]:.2f} | {b[1] + s[1]} | {c1} | {c3} |"
        )
    body = "\n".join(lines)
    print(body)
    if args.results and not args.quick:
        report.write_section(args.results, SECTION, f"## {SECTION}\n\n{body}")
    lost = len(mixed.lost) + sum(r[m][1] for _, r in rows for m in r)
    mismatched = mixed_bad + sum(r[m][2] for _, r in rows for m in r)
    sys.exit(1 if lost or mismatched else 0)


if __name__ == "__main__":
    os.environ.setdefault("JAXPIPE_CACHE_DIR", str(pathlib.Path.home() / ".cache" / "jaxpipe" / "xla"))
    main()
