"""``wan22-moe`` against ``wan-t2v``: two σ-routed experts (twice the parameters, the same per step) vs one DiT.

Per card, at its default sampling (8 steps, guidance 2), in one process:

* **quality** (``jaxpipe.digits.quality.t2v_quality``, judged by ``digit-scorer``): on ``--samples`` prompts naming
  a digit and a motion, how often the ink centroid moves as told and how often the scorer reads the
  prompted digit in the first and the last frame (the same prompts and seeds for every card), and how often
  the independent ``digit-classifier`` (no weights shared with the scorer) reads it;
* **time per video**: median wall ms of one ``jp.generate`` call of ``--render`` prompts, divided by the
  prompts (compiled first; the cards interleaved in each repeat so load drifts hit all alike);
* **parameters**: all, and those one denoise step runs (one expert).

With ``--experts`` it also renders ``wan22-moe`` with a constant router (``policies.Fixed``: only the
high-noise or only the low-noise expert for every step), to show what each expert alone is worth.

    python benchmarks/moe.py                 # prints a markdown table and writes --json
    python benchmarks/moe.py --quick         # smoke test
    python benchmarks/moe.py --samples 0 --repeats 20   # time per video only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import jax
import numpy as np
from flax import nnx

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.digits import quality
from jaxpipe.loops import policies


def params(module) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param))))


def step_params(card: Card) -> int:
    """Parameters one denoise step runs: one bound denoiser (the experts are the same size)."""
    return max(params(card[name]) for loop in card.spec.loops for name in loop.binds)


def with_router(card: Card, router, model_id: str) -> Card:
    """``card`` with its denoise loop's router replaced (``model_id`` names the variant)."""
    loop = card.spec.loops[0]
    loop = dataclasses.replace(loop, config=loop.config.replace(router=router))
    return Card(card.components, dataclasses.replace(card.spec, loops=(loop,), model_id=model_id))


def time_per_video(cards: dict[str, Card], render: int, repeats: int) -> dict[str, float]:
    """Card -> median ms per video of one ``jp.generate`` call of ``render`` prompts."""
    rng = np.random.default_rng(1)
    batch = [
        digits.caption(int(d), motion=int(m)) for d, m in zip(rng.integers(0, 10, render), rng.integers(0, 5, render))
    ]
    seeds = list(range(render))
    for card in cards.values():
        jax.block_until_ready(jp.generate(card, batch, seed=seeds)["video"])
    times = {m: [] for m in cards}
    for _ in range(repeats):
        for model_id, card in cards.items():
            start = time.perf_counter()
            jax.block_until_ready(jp.generate(card, batch, seed=seeds)["video"])
            times[model_id].append((time.perf_counter() - start) * 1000.0 / render)
    return {m: statistics.median(t) for m, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=200, help="quality prompts per card (0: time only)")
    parser.add_argument("--render", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--experts", action="store_true", help="also each expert alone (constant router)")
    parser.add_argument("--json", default="/tmp/moe_benchmark.json")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.render, args.repeats = 4, 2, 1
    load = os.getloadavg()[0]
    moe = jp.cards.load("wan22-moe")
    cards = {"wan-t2v": jp.cards.load("wan-t2v"), "wan22-moe": moe}
    if args.experts:
        cards["wan22-moe, high expert only"] = with_router(moe, policies.Fixed(0, 2), "wan22-moe-high")
        cards["wan22-moe, low expert only"] = with_router(moe, policies.Fixed(1, 2), "wan22-moe-low")
    scorer = jp.cards.load("digit-scorer")
    rows = {}
    for name, card in cards.items():
        q = quality.t2v_quality(card, scorer, samples=args.samples, progress=True)["full"] if args.samples else {}
        rows[name] = {**q, "params": card.num_params(), "step_params": step_params(card)}
    for name, ms in time_per_video(cards, args.render, args.repeats).items():
        rows[name]["ms_per_video"] = ms
    lines = [
        "| card | motion as prompted | digit, first frame (scorer) | digit, last frame (scorer) "
        "| digit, first frame (independent) | digit, last frame (independent) | ms / video | params (all / per step) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pct = lambda r, k: f"{100 * r[k]:.0f}%" if k in r else "–"
    for name, r in rows.items():
        ind = r.get("independent", {})
        lines.append(
            f"| `{name}` | {pct(r, 'motion_accuracy')} | {pct(r, 'first_frame_digit_accuracy')} "
            f"| {pct(r, 'last_frame_digit_accuracy')} | {pct(ind, 'first_frame_digit_accuracy')} "
            f"| {pct(ind, 'last_frame_digit_accuracy')} | {r['ms_per_video']:.1f} "
            f"| {r['params'] / 1e6:.2f} M / {r['step_params'] / 1e6:.2f} M |"
        )
    print("\n".join(lines))
    print(
        f"samples {args.samples} (seed 0), time: median of {args.repeats} x {args.render} prompts; "
        f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    if not args.quick:
        with open(args.json, "w") as f:
            json.dump(
                {"samples": args.samples, "render": args.render, "repeats": args.repeats, "rows": rows}, f, indent=2
            )


if __name__ == "__main__":
    main()
