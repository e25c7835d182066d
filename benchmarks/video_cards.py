"""Text-to-video cards side by side: the bidirectional ``wan-t2v``, the two-stage ``ltx2-two-stage``, the
σ-routed ``wan22-moe`` and the chunked causal ``wan-causal`` (each where bundled), in one process.

Per card:

* **quality** (C4, ``jaxpipe.digits.quality.t2v_quality``, judged by ``digit-scorer``): on ``--samples`` prompts
  naming a digit and a motion (``"seven moving right"``), how often the ink centroid moves as told
  (> 1 px that way; ``still``: < 1 px) and how often the scorer reads the prompted digit in the first and
  in the last frame (and how often the independent ``digit-classifier``, which shares no weights with the
  scorer, reads it); at each card's default sampling (steps per stage, guidance);
* **loop steps**: what one request runs, per loop (``engine`` ``on_step`` events of one request);
* **time per video**: median wall ms of one default ``jp.generate`` call of ``--render`` prompts divided by
  the prompts (compiled first; cards interleaved in each repeat so load drifts hit all alike);
* **parameters**: all, and the denoiser parameters one step runs (``wan22-moe`` stores two experts and
  runs one per step).

    python benchmarks/video_cards.py           # full run; refreshes the "video_cards" section of RESULTS.md
    python benchmarks/video_cards.py --quick   # smoke test: a few prompts and repeats, prints only
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import jax
import numpy as np
from flax import nnx

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.digits import quality
from jaxpipe.engine import Engine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

SECTION = "video_cards"
CARDS = ("wan-t2v", "ltx2-two-stage", "wan22-moe", "wan-causal")


def _params(module) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param))))


def active_denoiser_params(card: Card) -> int:
    """Parameters of the denoiser one loop step runs: the largest component a sampling loop binds."""
    sizes = [_params(card[name]) for loop in card.spec.loops for name in loop.binds]
    return max(sizes) if sizes else 0


def loop_steps(card: Card) -> dict[str, int]:
    """Loop id -> steps one default request runs (counted from the engine's ``on_step`` events)."""
    engine = Engine()
    engine.register(card)
    counts: dict[str, int] = {}

    def count(event):
        counts[event.loop] = counts.get(event.loop, 0) + 1

    engine.run(jp.Request(card.model_id, prompt="seven moving right", seed=0), on_step=count)
    return counts


def real_videos_row(scorer: Card, samples: int, seed: int = 0) -> dict:
    """The ceiling: the same measures on real videos (held-out digits moved as captioned, like the training data)."""
    from jaxpipe.digits import digit_scorer
    from jaxpipe.digits.evaluators import default_evaluator

    images, labels = digits.load_images("heldout")
    pick = np.random.default_rng(seed).permutation(len(images))[:samples]
    data = digits.make_videos(images[pick], labels[pick], seed=seed)
    videos = (np.asarray(data.video) + 1.0) / 2.0
    read = lambda t: np.asarray(digit_scorer.predict(scorer, data.video[:, t])["digit"])
    centroids = quality.ink_centroids(videos)
    moved = quality.moves_as_told(centroids[:, -1] - centroids[:, 0], np.asarray(data.motion))
    independent = lambda t: np.asarray(default_evaluator().predict(videos[:, t]))
    return {
        "motion_accuracy": float(np.mean(moved)),
        "first_frame_digit_accuracy": float(np.mean(read(0) == data.digit)),
        "last_frame_digit_accuracy": float(np.mean(read(-1) == data.digit)),
        "independent": {
            "first_frame_digit_accuracy": float(np.mean(independent(0) == data.digit)),
            "last_frame_digit_accuracy": float(np.mean(independent(-1) == data.digit)),
        },
    }


def prompts(n: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [digits.caption(int(d), motion=int(m)) for d, m in zip(rng.integers(0, 10, n), rng.integers(0, 5, n))]


def time_per_video(cards: dict[str, Card], render: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Card -> (compile + first call s, median ms per video), the cards interleaved in every repeat."""
    batch = prompts(render)
    seeds = list(range(render))
    first, times = {}, {m: [] for m in cards}
    for model_id, card in cards.items():
        start = time.perf_counter()
        jax.block_until_ready(jp.generate(card, batch, seed=seeds)["video"])
        first[model_id] = time.perf_counter() - start
    for _ in range(repeats):
        for model_id, card in cards.items():
            start = time.perf_counter()
            jax.block_until_ready(jp.generate(card, batch, seed=seeds)["video"])
            times[model_id].append((time.perf_counter() - start) * 1000.0 / render)
    return {m: (first[m], statistics.median(times[m])) for m in cards}


def table(rows: dict[str, dict], args) -> str:
    head = (
        "| card | loop steps per video | motion as prompted | digit, first frame (scorer) | digit, last frame (scorer) "
        "| digit, first frame (independent) | digit, last frame (independent) "
        "| ms / video | params (all / one step's denoiser) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    frames = ("first_frame_digit_accuracy", "last_frame_digit_accuracy")
    if "real" in rows:
        r = rows.pop("real")
        lines.append(
            f"| real videos (held-out digits moved as captioned) | – | {100 * r['motion_accuracy']:.0f}% | "
            + " | ".join(f"{100 * q[k]:.0f}%" for q in (r, r["independent"]) for k in frames)
            + " | – | – |"
        )
    for model_id, r in rows.items():
        q = r["quality"]["full"] if r["quality"] else {}
        ind = q.get("independent", {})
        pct = lambda k, q=q: f"{100 * q[k]:.0f}%" if k in q else "–"
        steps = " + ".join(f"{n} `{loop}`" for loop, n in r["steps"].items())
        lines.append(
            f"| `{model_id}` | {steps} | {pct('motion_accuracy')} | {pct('first_frame_digit_accuracy')} "
            f"| {pct('last_frame_digit_accuracy')} | {pct('first_frame_digit_accuracy', ind)} "
            f"| {pct('last_frame_digit_accuracy', ind)} "
            f"| {r['ms']:.1f} | {r['params'] / 1e6:.2f} M / {r['active'] / 1e6:.2f} M |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cards", default=",".join(CARDS))
    parser.add_argument("--samples", type=int, default=100, help="quality prompts per card (0: skip quality)")
    parser.add_argument("--render", type=int, default=16, help="prompts per timed generate call")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.render, args.repeats = 4, 2, 1
    load = os.getloadavg()[0]
    start = time.perf_counter()
    available = set(jp.cards.available())
    wanted = [m for m in args.cards.split(",") if m in available]
    missing = [m for m in args.cards.split(",") if m not in available]
    if missing:
        print(f"not bundled, skipped: {missing}")
    cards = {m: jp.cards.load(m) for m in wanted}
    scorer = jp.cards.load("digit-scorer")
    rows = {}
    for model_id, card in cards.items():
        rows[model_id] = {
            "quality": quality.t2v_quality(card, scorer, samples=args.samples, progress=True) if args.samples else None,
            "steps": loop_steps(card),
            "params": card.num_params(),
            "active": active_denoiser_params(card),
        }
    for model_id, (compile_s, ms) in time_per_video(cards, args.render, args.repeats).items():
        rows[model_id].update(ms=ms, first_s=compile_s)
    if args.samples:
        rows = {"real": real_videos_row(scorer, max(args.samples, 300)), **rows}
    body = table(rows, args)
    print(body)
    if args.quick:
        return
    info = machine_info(
        **{
            "load average (1 min) before / after": f"{load:.2f} / {os.getloadavg()[0]:.2f}",
            "whole run": f"{time.perf_counter() - start:.0f} s",
        }
    )
    header = [
        "## video_cards",
        "",
        (
            "**Text-to-video cards side by side.** `python benchmarks/video_cards.py`: each bundled card at its "
            f"default sampling. Quality: `jaxpipe.digits.quality.t2v_quality` on {args.samples} prompts naming a digit and a "
            "motion (seed 0), the digit read by `digit-scorer` (scorer) and by the independent `digit-classifier` "
            "(independent: no weights shared with the scorer). Time: median of "
            f"{args.repeats} repeats of one `jp.generate` call of {args.render} prompts, per video, the cards interleaved "
            "in each repeat. Loop steps: the engine's `on_step` events of one request."
        ),
        "",
        "| | |\n|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
    ]
    write_section(RESULTS, SECTION, "\n".join(header) + "\n" + body + "\n")


if __name__ == "__main__":
    main()
