"""Cold-start benchmark: the first serving call of a fresh process, serial vs batched, with and without the
persistent compilation cache.

A fresh Python process loads the bundled ``flux-t2i`` card into an ``Engine`` and runs ONE
``run_many`` of N text-to-image requests with mixed step counts (4, 8, 12, 16, cycling), either
``mode="serial"`` or ``mode="batched"``; the wall time of that call (compiles included) is what a
user waits for on first use. Three cache states, each in its own processes:

* ``no cache``   -- the persistent compilation cache off: every compile happens;
* ``cache: first`` -- the cache on, empty: compiles happen and are written to disk;
* ``cache: second`` -- a second process on the cache the first one filled.

Then, in one process, the same call repeated (steady state; the engine may compile a smaller batch
capacity on the second call and use it from then on). Modes are interleaved across repeats.

    python benchmarks/cold_start.py            # full run; refreshes the "cold_start" section of RESULTS.md
    python benchmarks/cold_start.py --quick    # smoke test: N = 8, one repeat, prints only
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section  # noqa: E402

SECTION = "cold_start"
CHILD = """
import sys, time, json
t0 = time.perf_counter()
import jaxpipe as jp
from jaxpipe import compilation
if sys.argv[3]:
    compilation.enable_cache(sys.argv[3])
engine = jp.Engine()
engine.register(jp.cards.load("flux-t2i"))
n, mode, repeats = int(sys.argv[1]), sys.argv[2], int(sys.argv[4])
prompts = ["seven thick", "one thin left", "three bright", "nine right dim"]
requests = [jp.Request("flux-t2i", prompt=prompts[i % 4], seed=i, num_steps=(4, 8, 12, 16)[i % 4]) for i in range(n)]
times = []
for _ in range(repeats):
    engine.cache.clear()
    start = time.perf_counter()
    [out.block_until_ready() for out in engine.run_many(requests, mode=mode)]
    times.append(time.perf_counter() - start)
print(json.dumps({"calls": times, "process": time.perf_counter() - t0}))
"""


def child(n: int, mode: str, cache: str, repeats: int = 1) -> dict:
    import json

    env = {k: v for k, v in os.environ.items() if k != "JAXPIPE_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), mode, cache, str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-n", type=int, default=32)
    args = parser.parse_args()
    n, repeats = (8, 1) if args.quick else (args.n, args.repeats)
    modes = ("serial", "batched")
    load = os.getloadavg()[0]
    start = time.perf_counter()
    results = {(mode, state): [] for mode in modes for state in ("no cache", "cache: first", "cache: second")}
    steady = {mode: [] for mode in modes}
    for r in range(repeats):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            results[(mode, "no cache")].append(child(n, mode, "")["calls"][0])
            with tempfile.TemporaryDirectory() as cache:
                results[(mode, "cache: first")].append(child(n, mode, cache)["calls"][0])
                results[(mode, "cache: second")].append(child(n, mode, cache)["calls"][0])
            steady[mode].append(child(n, mode, "", repeats=4)["calls"])
    lines = [
        f"`python benchmarks/cold_start.py`: the first `engine.run_many` of {n} `flux-t2i` requests (bundled card; 4 / 8 / 12 / 16 "
        "steps, cycling) in a fresh process, serial vs batched, compiles included (median of "
        f"{repeats} processes per cell); then the same call repeated in one process.",
        "",
        *[f"- {k}: {v}" for k, v in machine_info().items()],
        f"- load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f}",
        f"- whole run: {time.perf_counter() - start:.0f} s",
        "",
        "| first call of a process | serial s | batched s | batched / serial |",
        "|---|---:|---:|---:|",
    ]
    for state in ("no cache", "cache: first", "cache: second"):
        s, b = (statistics.median(results[(m, state)]) for m in modes)
        lines.append(f"| {state} | {s:.2f} | {b:.2f} | **{b / s:.2f}×** |")
    lines += ["", "| calls 1, 2, 3, 4 in one process (no persistent cache) | serial s | batched s |", "|---|---|---|"]
    per_call = {m: [statistics.median(c[i] for c in steady[m]) for i in range(4)] for m in modes}
    lines.append(
        "| median over processes | " + " | ".join(", ".join(f"{t:.2f}" for t in per_call[m]) for m in modes) + " |"
    )
    body = "\n".join(["## cold_start", "", *lines])
    print(body)
    if not args.quick:
        write_section(RESULTS, SECTION, body)
        print(f"\nwrote the {SECTION} section of {RESULTS}")


if __name__ == "__main__":
    main()
