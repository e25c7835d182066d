"""The two-stage ``ltx2-two-stage`` against the single-stage ``wan-t2v`` at matched DiT FLOPs, plus ablations.

Per setting, judged by ``jaxpipe.digits.quality.t2v_quality`` (``digit-scorer``) on ``--samples`` prompts naming a
digit and a motion: motion accuracy (the ink centroid moves > 1 px as told; ``still``: < 1 px), first- and
last-frame digit accuracy (read by the scorer, and by the independent ``digit-classifier``, which shares no
weights with it); **DiT GFLOPs per video** (XLA's cost analysis of one velocity call per loop,
times the forwards per step that guidance needs, times the steps); and **time per video** (median wall
ms of one compiled ``jp.generate`` call of ``--render`` prompts, divided by the prompts; the settings take
turns in each repeat).

Settings: ``wan-t2v`` at its default 8 steps and at the step count whose DiT FLOPs match the two-stage
card's default; ``ltx2-two-stage`` at its defaults, without STG, and with nearest-neighbour instead of
the learned upsampler.

    python benchmarks/two_stage.py               # full run (200 samples); prints a markdown table
    python benchmarks/two_stage.py --samples 40  # quicker
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.cards import toy_two_stage
from jaxpipe.digits import quality
from jaxpipe.loops import denoise
from jaxpipe.nn import DiTCond


def forwards_per_step(config: denoise.DenoiseConfig) -> int:
    """Rows of the DiT call one step of a loop makes per request (1; 2 with CFG; +1 with STG)."""
    return 1 + int(config.guide.needs_uncond) + int(config.stg > 0)


def dit_flops(card: Card, loop_id: str) -> float:
    """XLA-counted FLOPs of one single-row velocity call of the DiT ``loop_id`` binds, at its latent shape."""
    loop = card.spec.loop(loop_id)
    dit = card[loop.binds[0]]
    x = jnp.zeros((1, *loop.latent_shape), jnp.float32)
    cond = DiTCond(
        jnp.zeros((1, card["text_encoder"].cfg.max_len, dit.cfg.text_dim)),
        jnp.ones((1, card["text_encoder"].cfg.max_len), bool),
    )
    compiled = jax.jit(lambda m, x, c: m.velocity(x, jnp.ones((1,)), c)).lower(dit, x, cond).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis["flops"])


def video_gflops(card: Card, steps: dict[str, int]) -> float:
    """DiT GFLOPs of one video: per loop, steps × forwards per step × one forward's FLOPs."""
    return sum(n * forwards_per_step(card.spec.loop(lp).config) * dit_flops(card, lp) for lp, n in steps.items()) / 1e9


def with_loop(card: Card, loop_id: str, **changes) -> Card:
    """The card with ``loop_id``'s default config changed (e.g. ``stg=0``)."""
    loops = tuple(
        dataclasses.replace(lp, config=lp.config.replace(**changes)) if lp.id == loop_id else lp
        for lp in card.spec.loops
    )
    return Card(card.components, dataclasses.replace(card.spec, loops=loops))


def nearest_upsampler(card: Card) -> Card:
    """The card with its learned upsampler replaced by nearest-neighbour upsampling (a fresh upsampler is exactly that)."""
    fresh = jp.cards.build("ltx2-two-stage", seed=0, config=card.spec.config)["upsampler"]
    return card.replace(upsampler=fresh)


def times_per_video(settings: list[tuple[Card, int | None]], prompts: list[str], repeats: int) -> list[float]:
    """Per setting ``(card, num_steps)``: median wall ms of one compiled ``jp.generate`` call of ``prompts``, per
    prompt. Every setting is compiled first, then the settings take turns in each repeat (load drifts hit all alike)."""
    runs = [
        lambda c=c, n=n: jax.block_until_ready(jp.generate(c, prompts, seed=0, num_steps=n)["video"])
        for c, n in settings
    ]
    for run in runs:
        run()
    times = [[] for _ in runs]
    for _ in range(repeats):
        for run, out in zip(runs, times):
            start = time.perf_counter()
            run()
            out.append(time.perf_counter() - start)
    return [1000.0 * statistics.median(t) / len(prompts) for t in times]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--render", type=int, default=16, help="prompts per timed generate call")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    scorer, wan, ltx = jp.cards.load("digit-scorer"), jp.cards.load("wan-t2v"), jp.cards.load("ltx2-two-stage")
    base, refine = (ltx.spec.loop(lp).config for lp in (toy_two_stage.BASE_LOOP, toy_two_stage.REFINE_LOOP))
    ltx_gflops = video_gflops(
        ltx, {toy_two_stage.BASE_LOOP: base.num_steps, toy_two_stage.REFINE_LOOP: refine.num_steps}
    )
    wan_loop = wan.spec.recipe[0]
    per_step = video_gflops(wan, {wan_loop: 1})
    matched = max(1, round(ltx_gflops / per_step))
    settings = [
        ("wan-t2v (default)", wan, None, {wan_loop: wan.spec.loop(wan_loop).config.num_steps}),
        ("wan-t2v (matched FLOPs)", wan, matched, {wan_loop: matched}),
        ("ltx2-two-stage (default)", ltx, None, None),
        ("ltx2-two-stage, no STG", with_loop(ltx, toy_two_stage.BASE_LOOP, stg=0.0), None, None),
        ("ltx2-two-stage, nearest upsampler", nearest_upsampler(ltx), None, None),
    ]
    prompts = [f"{w} moving right" for w in ("zero", "one", "two", "three", "four", "five", "six", "seven")] * 4
    rows = []
    for name, card, num_steps, steps in settings:
        steps = steps or {toy_two_stage.BASE_LOOP: base.num_steps, toy_two_stage.REFINE_LOOP: refine.num_steps}
        report = quality.t2v_quality(card, scorer, samples=args.samples, seed=0, num_steps=num_steps)
        full = report["full"]
        rows.append(
            {
                "setting": name,
                "steps": " + ".join(str(n) for n in steps.values()),
                "dit_gflops_per_video": video_gflops(card, steps),
                "motion_accuracy": full["motion_accuracy"],
                "first_frame_digit_accuracy": full["first_frame_digit_accuracy"],
                "last_frame_digit_accuracy": full["last_frame_digit_accuracy"],
                "independent": {
                    k: full["independent"][k] for k in ("first_frame_digit_accuracy", "last_frame_digit_accuracy")
                },
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    timed = times_per_video(
        [(card, num_steps) for _, card, num_steps, _ in settings], prompts[: args.render], args.repeats
    )
    for row, ms in zip(rows, timed):
        row["ms_per_video"] = ms
    print(f"\n{args.samples} prompts per row, seed 0; jax {jax.__version__} on {jax.default_backend()}\n")
    print(
        "| setting | steps | DiT GFLOPs / video | motion acc. | first-frame digit (scorer) | last-frame digit (scorer) "
        "| first-frame digit (independent) | last-frame digit (independent) | ms / video |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ind = r["independent"]
        print(
            f"| {r['setting']} | {r['steps']} | {r['dit_gflops_per_video']:.2f} | {r['motion_accuracy']:.2f} | "
            f"{r['first_frame_digit_accuracy']:.2f} | {r['last_frame_digit_accuracy']:.2f} | "
            f"{ind['first_frame_digit_accuracy']:.2f} | {ind['last_frame_digit_accuracy']:.2f} | {r['ms_per_video']:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
