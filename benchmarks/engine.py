"""Engine benchmark: ``run_many(mode="batched")`` vs ``mode="serial"`` vs the fused path.

For 1, 4, 16 and 64 concurrent text-to-image requests with **mixed step counts** (4, 8, 12, 16
steps, cycling) and distinct seeds and prompts, one engine in one process runs the same request
list three ways, interleaved repeats, and reports the median and best wall time per whole list,
the throughput and the ratios:

* ``serial``  -- the engine, each request to completion: its cached text encoding, then the
  program entered, its denoise loop driven one jitted pure ``step`` per call (the same compiled
  step as ``mode="interleaved"``, so serial == interleaved bit for bit), then decoded;
* ``batched`` -- the engine's continuous batching: requests are prepared in cohorts of equal
  settings, share one jitted batched step per tick (steps between scheduling events fused into
  one call), join free slots as others finish, and are decoded per cohort;
* ``fused``   -- no engine: ``jp.generate`` (the program's fused path: encode -> one ``lax.scan``
  denoise -> decode, one jitted call), **one call per distinct step count** with every request
  of that step count as its batch. ``jp.generate`` batches prompts only when their settings
  agree, so this is the most the fused path can batch of a mixed list (at N <= 4 every call
  holds one request: the fused path per request). It encodes its prompts in-batch, without the
  feature cache.

Every timed engine run starts with an empty feature cache (each distinct prompt is encoded once per
run, the same way in both modes). Before timing, the batched and fused outputs are compared with the
serial ones (C3: the max abs difference is reported; the fused scan is compiled differently from
the driven step, so it too agrees within the C3 tolerance, not bit for bit).

"Where the time goes" re-runs 16 requests with every jitted engine call (the operations of
``jaxpipe.engine.batch`` the scheduler calls) wrapped in a synchronising timer, and measures the
raw cost of one denoise step per request at batch sizes 1..64: the ceiling on what batching can
buy on this machine.

Two cards: the bundled ``flux-t2i`` (guidance 2, so each step runs the DiT on a doubled batch;
random weights of the bundled size when the checkpoint is absent) and the tiny test-size card
(guidance 1), whose batch-1 step is dispatch-bound.

Mixed guidance (``--stream guidance``, its own section ``engine_guidance``): N requests of one step count
whose classifier-free guidance scales differ (cycling over ``GUIDANCES``). A request's guidance is a per-row
value of the loop state, so the engine batches them all in one compiled step; the contenders are the engine's
``batched`` mode, the same requests one at a time (``serial``), and ``batched`` per guidance value (one
``run_many`` per distinct scale, one after another: what batching could do when each scale compiled its own
step). It reports the compiled batched-step executables a mixed list adds after a list of one guidance has run
(0: the scales share the compiled step) and C3 against the serial images.

    python benchmarks/engine.py                      # full run; refreshes the "engine" section of RESULTS.md
    python benchmarks/engine.py --quick              # smoke test: fewer repeats and sizes, prints only
    python benchmarks/engine.py --stream guidance    # the mixed-guidance stream; refreshes "engine_guidance"
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.cards import generator, toy_t2i
from jaxpipe.digits import DIGIT_WORDS, POSITIONS, STROKES
from jaxpipe.engine import batch as engine_ops
from jaxpipe.loops import denoise
from jaxpipe.nn import DiTCond

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section  # noqa: E402

from jaxpipe.digits import cards as digit_cards

SECTION = "engine"
SIZES = (1, 4, 16, 64)
STEPS = (4, 8, 12, 16)
TARGET = 1.5  # batched / serial throughput at 16 requests on the 2-core CPU
MODES = ("serial", "batched", "fused")
ENGINE_MODES = ("serial", "batched")
GUIDANCES = (1.5, 2.0, 3.0, 4.5)  # every scale != 1: each request runs CFG (two DiT rows)
GUIDANCE_STEPS = 8
JITTED = ("enter", "node", "step", "steps", "empty", "admit", "retire", "resize")  # jaxpipe.engine.batch


def _perturbed(card: jp.Card, seed: int) -> jp.Card:
    """Random non-zero weights in the zero-initialised adaLN / output layers (a fresh DiT outputs 0)."""
    from flax import nnx

    graphdef, params, rest = nnx.split(card["transformer"], nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    leaves = [p + 0.05 * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys)]
    return card.replace(transformer=nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest))


def bench_cards() -> dict[str, tuple[jp.Card, str]]:
    """name -> (card, description)."""
    out = {}
    if "flux-t2i" in jp.cards.available():
        card = jp.cards.load("flux-t2i")
        source = "bundled checkpoint"
    else:
        card = _perturbed(jp.cards.build("flux-t2i", config=digit_cards.bundled_config("flux-t2i")), 1)
        source = "random weights of the bundled size (no checkpoint yet)"
    out["flux-t2i (bundled)"] = (card, source)
    out["flux-t2i (tiny)"] = (_perturbed(jp.cards.build("flux-t2i"), 1), "random weights, test size")
    return out


def describe(card: jp.Card) -> str:
    dit, sampling = card.spec.config.dit, card.spec.loop(toy_t2i.LOOP_ID).config
    tokens = np.prod(card.spec.loop(toy_t2i.LOOP_ID).latent_shape[:3]) // dit.patch_size**2
    return (
        f"DiT dim={dit.dim}, depth={dit.depth}, heads={dit.heads}, {tokens} latent tokens, "
        f"guidance {sampling.guidance:g} ({'2 DiT rows per request' if sampling.guidance != 1 else '1 DiT row per request'}), "
        f"{card.num_params() / 1e6:.2f} M parameters"
    )


def requests(n: int, seed: int = 0) -> list[jp.Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = [DIGIT_WORDS[rng.integers(10)], STROKES[rng.integers(2)], POSITIONS[rng.integers(3)]]
        out.append(
            jp.Request("flux-t2i", prompt=" ".join(words), seed=seed * 1000 + i, num_steps=STEPS[i % len(STEPS)])
        )
    return out


def fused_run(card: jp.Card, reqs) -> list:
    """The fused contender: ``jp.generate`` once per distinct step count (its requests as one batch).
    Returns the batched images, one array per call (split per request only outside the timer)."""
    groups: dict[int, list] = {}
    for r in reqs:
        groups.setdefault(r.num_steps, []).append(r)
    return [
        jp.generate(card, [r.prompt for r in group], seed=[r.seed for r in group], num_steps=steps)["image"]
        for steps, group in groups.items()
    ]


def per_request(reqs, fused: list) -> list[dict]:
    """``fused_run``'s images back in request order, as ``{"image": (H, W, C)}`` per request."""
    order = list(dict.fromkeys(r.num_steps for r in reqs))
    rows = {steps: iter(images) for steps, images in zip(order, fused)}
    return [{"image": next(rows[r.num_steps])} for r in reqs]


def timed_run(engine: jp.Engine, reqs, mode: str) -> tuple[float, list]:
    """Wall seconds of one whole request list in ``mode``, and its outputs."""
    engine.cache.clear()
    start = time.perf_counter()
    if mode == "fused":
        outs = jax.block_until_ready(fused_run(engine.card(reqs[0].model), reqs))
    else:
        outs = engine.run_many(reqs, mode)
        jax.block_until_ready([o["image"] for o in outs])
    return time.perf_counter() - start, outs


def measure(engine: jp.Engine, n: int, repeats: int, budget_s: float) -> dict:
    reqs = requests(n)
    first = {}
    outs = {}
    for mode in MODES:
        first[mode], outs[mode] = timed_run(engine, reqs, mode)  # compiles
    images = {m: [{"image": o["image"]} for o in outs[m]] for m in ENGINE_MODES}
    images["fused"] = per_request(reqs, outs["fused"])
    c3 = {
        m: parity.compare(images["serial"], images[m], tolerance=parity.TOLERANCE, level="C3")
        for m in ("batched", "fused")
    }
    times = {m: [] for m in MODES}
    start = time.perf_counter()
    for r in range(repeats):
        for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:  # rotating order
            times[mode].append(timed_run(engine, reqs, mode)[0])
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    med = {m: statistics.median(t) for m, t in times.items()}
    best = {m: min(t) for m, t in times.items()}
    return {
        "n": n,
        "steps": sum(r.num_steps for r in reqs),
        "first": first,
        "median": med,
        "best": best,
        "ratio": med["serial"] / med["batched"],
        "ratio_best": best["serial"] / best["batched"],
        "ratio_fused": med["fused"] / med["batched"],
        "repeats": len(times["serial"]),
        "c3": {m: report.max_abs_diff for m, report in c3.items()},
        "c3_passed": all(report.passed for report in c3.values()),
    }


def step_scaling(card: jp.Card, sizes=(1, 4, 16, 64), steps: int = 8) -> dict[int, float]:
    """ms per request-step of a fused ``steps``-step batched denoise at each batch size (best of 5)."""
    loop = card.spec.loop(toy_t2i.LOOP_ID)
    config = loop.config
    leaves, treedef = jax.tree.flatten(card)

    @jax.jit
    def run(leaves, state):
        models = jax.tree.unflatten(treedef, leaves).bound(toy_t2i.LOOP_ID)
        return jax.lax.fori_loop(0, steps, lambda _, s: denoise.step(models, s, config)[0], state)

    encode = lambda ids: DiTCond(card["text_encoder"](ids), ids != 0)
    out = {}
    for b in sizes:
        ids = generator.tokenize(card, ["seven thick"] * b)
        uncond = encode(jnp.zeros_like(ids)) if config.guide.needs_uncond else None
        state = denoise.init(jax.random.split(jax.random.key(0), b), loop.latent_shape, encode(ids), config, uncond)
        jax.block_until_ready(run(leaves, state))
        best = min(_time(lambda state=state: run(leaves, state)) for _ in range(5))
        out[b] = best / steps / b * 1e3
    return out


def _time(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def breakdown(engine: jp.Engine, n: int = 16) -> dict[str, dict[str, tuple[float, int]]]:
    """Synchronised wall ms and call counts per engine piece for ``n`` requests, per mode."""
    reqs = requests(n)
    for mode in ENGINE_MODES:
        timed_run(engine, reqs, mode)
    originals = {name: getattr(engine_ops, name) for name in JITTED}
    acc: dict = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()

    def wrap(name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = jax.block_until_ready(fn(*args, **kwargs))
            acc[name] += time.perf_counter() - start
            calls[name] += 1
            return out

        return timed

    result = {}
    try:
        for name, fn in originals.items():
            setattr(engine_ops, name, wrap(name, fn))
        for mode in ENGINE_MODES:
            acc.clear()
            calls.clear()
            total = statistics.mean(timed_run(engine, reqs, mode)[0] for _ in range(3))
            acc_ms = {k: v / 3 * 1e3 for k, v in acc.items()}
            pieces = {k: (acc_ms[k], calls[k] // 3) for k in acc_ms}
            pieces["host (bind, cache lookups, scheduling)"] = (total * 1e3 - sum(acc_ms.values()), 0)
            pieces["total"] = (total * 1e3, 0)
            result[mode] = pieces
    finally:
        for name, fn in originals.items():
            setattr(engine_ops, name, fn)
    return result


PIECES = {
    "node": "text encoder (cache misses, batch 1)",
    "enter": "enter / finish the program (start loop, decode), per cohort",
    "step": "one denoise step of one request (serial)",
    "steps": "batched denoise steps (fused between events)",
    "admit": "admit rows into slots",
    "retire": "retire rows from slots",
    "resize": "resize the slot batch",
    "empty": "allocate a slot batch",
}


def report(results: dict, info: dict, loads: tuple[float, float], elapsed: float, quick: bool) -> str:
    lines = [
        "## engine",
        "",
        '`python benchmarks/engine.py`: `engine.run_many(requests, mode="batched")` vs `mode="serial"` (each request',
        "alone, its loop driven one jitted step per call) vs the fused path (`jp.generate`, one jitted encode -> scan ->",
        "decode call per distinct step count, batching that step count's requests) for N concurrent text-to-image",
        f"requests with mixed step counts ({', '.join(map(str, STEPS))} steps, cycling), distinct seeds and prompts, one",
        "engine, one process. Each engine run starts with an empty feature cache. Wall ms per whole request list (median",
        "of interleaved repeats, and the fastest); throughput = N / median; batched / serial = serial ms / batched ms and",
        "batched / fused = fused ms / batched ms (> 1: batching is faster). C3 = max abs difference from the serial",
        f"images (tolerance {parity.TOLERANCE:g}). Compile = first run of each mode (trace + compile + run).",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- load average (1 min) before / after: {loads[0]:.2f} / {loads[1]:.2f}"
        + (" (other processes were using the CPU)" if loads[0] >= 0.5 else ""),
        f"- whole run: {elapsed:.0f} s{' (--quick)' if quick else ''}",
    ]
    for name, res in results.items():
        lines += ["", f"### {name}: {res['describe']} ({res['source']})", ""]
        lines += [
            "| N | steps (all requests) | serial ms | batched ms | fused ms | serial req/s | batched req/s | fused req/s "
            "| batched / serial | best-of ratio | batched / fused | compile s (serial / batched / fused) "
            "| C3 max abs diff (batched / fused) | repeats |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in res["rows"]:
            med, first, c3 = row["median"], row["first"], row["c3"]
            lines.append(
                f"| {row['n']} | {row['steps']} | {med['serial'] * 1e3:.1f} | {med['batched'] * 1e3:.1f} | "
                f"{med['fused'] * 1e3:.1f} | {row['n'] / med['serial']:.1f} | {row['n'] / med['batched']:.1f} | "
                f"{row['n'] / med['fused']:.1f} | **{row['ratio']:.2f}×** | {row['ratio_best']:.2f}× | "
                f"{row['ratio_fused']:.2f}× | {first['serial']:.1f} / {first['batched']:.1f} / {first['fused']:.1f} | "
                f"{c3['batched']:.1e} / {c3['fused']:.1e} | {row['repeats']} |"
            )
        scaling = res["scaling"]
        lines += [
            "",
            "Raw denoise cost, ms per request-step (a fused 8-step batched loop, best of 5): "
            + ", ".join(f"batch {b}: {ms:.3f}" for b, ms in scaling.items())
            + f" -> the most batching can save on compute here is {scaling[min(scaling)] / min(scaling.values()):.2f}×.",
        ]
        if res.get("breakdown"):
            lines += [
                "",
                "Where the time goes at N = 16 (every jitted engine call synchronised and timed; ms per run):",
                "",
            ]
            lines += ["| piece | serial ms (calls) | batched ms (calls) |", "|---|---:|---:|"]
            keys = list(dict.fromkeys([*res["breakdown"]["serial"], *res["breakdown"]["batched"]]))
            keys = [k for k in keys if k != "total"] + ["total"]
            for key in keys:
                cells = []
                for mode in ("serial", "batched"):
                    ms, calls = res["breakdown"][mode].get(key, (0.0, 0))
                    cells.append(f"{ms:.1f}" + (f" ({calls})" if calls else ""))
                lines.append(f"| {PIECES.get(key, key)} | {cells[0]} | {cells[1]} |")
    lines += ["", f"Target (batched ≥ {TARGET}× serial at 16 requests on this CPU):", ""]
    for name, res in results.items():
        row = next((r for r in res["rows"] if r["n"] == 16), None)
        if row:
            met = "met" if row["ratio"] >= TARGET else "not met"
            lines.append(
                f"- {name}: {row['ratio']:.2f}× (best-of {row['ratio_best']:.2f}×) -> {met}; "
                f"batched vs the fused path: {row['ratio_fused']:.2f}×"
            )
    return "\n".join(lines) + "\n"


def guidance_requests(n: int, guidances=GUIDANCES, seed: int = 0) -> list[jp.Request]:
    """``n`` requests of ``GUIDANCE_STEPS`` steps whose guidance cycles over ``guidances``."""
    base = requests(n, seed)
    return [
        jp.Request(
            r.model, prompt=r.prompt, seed=r.seed, num_steps=GUIDANCE_STEPS, guidance=guidances[i % len(guidances)]
        )
        for i, r in enumerate(base)
    ]


def _compiled_steps() -> int:
    return engine_ops.stepped._cache_size() + engine_ops.stepped_many._cache_size()


def _per_value(engine: jp.Engine, reqs) -> list:
    """``batched`` once per distinct guidance value, one after another (outputs in request order)."""
    groups: dict[float, list[int]] = {}
    for i, r in enumerate(reqs):
        groups.setdefault(r.guidance, []).append(i)
    outs = [None] * len(reqs)
    for rows in groups.values():
        for i, out in zip(rows, engine.run_many([reqs[i] for i in rows], "batched")):
            outs[i] = out
    return outs


GUIDANCE_MODES = ("serial", "batched", "per-value")


def measure_guidance(engine: jp.Engine, n: int, repeats: int, budget_s: float) -> dict:
    """Wall time of one mixed-guidance list of ``n`` requests in each contender, C3, compiled steps added."""
    uniform = guidance_requests(n, guidances=(GUIDANCES[0],), seed=1)
    engine.run_many(uniform, "batched")  # compiles the batched step at this width for one guidance
    before = _compiled_steps()
    reqs = guidance_requests(n)

    def run(mode):
        engine.cache.clear()
        start = time.perf_counter()
        outs = _per_value(engine, reqs) if mode == "per-value" else engine.run_many(reqs, mode)
        jax.block_until_ready([o["image"] for o in outs])
        return time.perf_counter() - start, outs

    _, batched = run("batched")
    added = _compiled_steps() - before
    first, outs = {}, {"batched": batched}
    for mode in ("serial", "per-value"):
        first[mode], outs[mode] = run(mode)
    images = {m: [{"image": o["image"]} for o in outs[m]] for m in GUIDANCE_MODES}
    c3 = parity.compare(images["serial"], images["batched"], tolerance=parity.TOLERANCE, level="C3")
    times = {m: [] for m in GUIDANCE_MODES}
    start = time.perf_counter()
    for r in range(repeats):
        for mode in GUIDANCE_MODES[r % 3 :] + GUIDANCE_MODES[: r % 3]:
            times[mode].append(run(mode)[0])
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    med = {m: statistics.median(t) for m, t in times.items()}
    return {
        "n": n,
        "median": med,
        "ratio": med["serial"] / med["batched"],
        "ratio_per_value": med["per-value"] / med["batched"],
        "added": added,
        "c3": c3.max_abs_diff,
        "c3_passed": c3.passed,
        "repeats": len(times["serial"]),
    }


def guidance_report(name: str, card: jp.Card, rows: list[dict], info: dict, loads, elapsed: float) -> str:
    lines = [
        "## engine_guidance",
        "",
        "`python benchmarks/engine.py --stream guidance`: N concurrent text-to-image requests of "
        f"{GUIDANCE_STEPS} steps whose guidance scales differ (cycling over {', '.join(map(str, GUIDANCES))}), distinct",
        "seeds and prompts, one engine, one process: the engine's `batched` mode (every scale in one batch: a request's",
        "guidance is a per-row value of the loop state) vs the same requests one at a time (`serial`) vs `batched` once",
        "per guidance value (what batching can do when each scale needs its own compiled step). Wall ms per whole list",
        "(median of interleaved repeats); ratios > 1: the mixed batch is faster. Steps compiled = batched-step",
        "executables the mixed list added after a one-guidance list of the same N had run (0: shared). C3 = max abs",
        f"difference of the batched images from the serial ones (tolerance {parity.TOLERANCE:g}).",
        "",
        *[f"- {k}: {v}" for k, v in info.items()],
        f"- load average (1 min) before / after: {loads[0]:.2f} / {loads[1]:.2f}"
        + (" (other processes were using the CPU)" if loads[0] >= 0.5 else ""),
        f"- whole run: {elapsed:.0f} s",
        "",
        f"### {name}: {describe(card)}",
        "",
        "| N | serial ms | batched ms | per-value ms | batched / serial | batched / per-value | steps compiled "
        "| C3 max abs diff | repeats |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        med = row["median"]
        lines.append(
            f"| {row['n']} | {med['serial'] * 1e3:.1f} | {med['batched'] * 1e3:.1f} | {med['per-value'] * 1e3:.1f} | "
            f"**{row['ratio']:.2f}×** | {row['ratio_per_value']:.2f}× | {row['added']} | "
            f"{row['c3']:.1e}{'' if row['c3_passed'] else ' (FAILED)'} | {row['repeats']} |"
        )
    return "\n".join(lines) + "\n"


def guidance_stream(args) -> int:
    """The mixed-guidance stream on the bundled-size card."""
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    name, (card, source) = next(iter(bench_cards().items()))
    engine = jp.Engine(max_batch=64)
    engine.register(card)
    rows = []
    for n in (4,) if args.quick else (4, 16):
        row = measure_guidance(engine, n, 2 if args.quick else 5, budget_s=30.0)
        rows.append(row)
        print(
            f"{name} mixed guidance N={n:3d}: serial {row['median']['serial'] * 1e3:8.1f} ms  batched "
            f"{row['median']['batched'] * 1e3:8.1f} ms  per-value {row['median']['per-value'] * 1e3:8.1f} ms  "
            f"ratio {row['ratio']:.2f}x  vs per-value {row['ratio_per_value']:.2f}x  compiled +{row['added']}  "
            f"C3 {row['c3']:.1e}",
            flush=True,
        )
    body = guidance_report(
        f"{name} ({source})", card, rows, machine_info(), (load_before, os.getloadavg()[0]), time.perf_counter() - start
    )
    print(body)
    if not args.quick or args.results:
        write_section(args.results or RESULTS, "engine_guidance", body)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="sizes 1 and 4, few repeats, print only")
    parser.add_argument(
        "--results", type=pathlib.Path, default=None, help=f"write the section here (default: {RESULTS.name})"
    )
    parser.add_argument("--stream", choices=("steps", "guidance"), default="steps", help="which request stream")
    args = parser.parse_args(argv)
    if args.stream == "guidance":
        return guidance_stream(args)
    sizes = (1, 4) if args.quick else SIZES
    repeats = 2 if args.quick else 7
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    results = {}
    for name, (card, source) in bench_cards().items():
        engine = jp.Engine(max_batch=64)
        engine.register(card)
        rows = []
        for n in sizes:
            row = measure(engine, n, repeats, budget_s=20.0 if n < 64 else 40.0)
            rows.append(row)
            print(
                f"{name} N={n:3d}: serial {row['median']['serial'] * 1e3:8.1f} ms  batched {row['median']['batched'] * 1e3:8.1f} ms"
                f"  fused {row['median']['fused'] * 1e3:8.1f} ms  ratio {row['ratio']:.2f}x (best {row['ratio_best']:.2f}x)"
                f"  vs fused {row['ratio_fused']:.2f}x  C3 {row['c3']['batched']:.1e} / {row['c3']['fused']:.1e}",
                flush=True,
            )
        results[name] = {
            "source": source,
            "describe": describe(card),
            "rows": rows,
            "scaling": step_scaling(card),
            "breakdown": None if args.quick else breakdown(engine),
        }
        print(f"{name} per request-step ms:", {b: round(v, 3) for b, v in results[name]["scaling"].items()}, flush=True)
    elapsed = time.perf_counter() - start
    body = report(results, machine_info(), (load_before, os.getloadavg()[0]), elapsed, args.quick)
    print(body)
    if not args.quick or args.results:
        write_section(args.results or RESULTS, SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
