"""``wan-causal`` (chunked causal video over a KV cache) against the bidirectional ``wan-t2v``.

In one process, at each card's default sampling (``wan-causal``: 4 chunks of 2 frames, 8 Euler steps
per chunk; ``wan-t2v``: 8 steps over all 8 frames; guidance 2 for both):

* **quality** (``jaxpipe.digits.quality.t2v_quality``, judged by ``digit-scorer``): on ``--samples`` prompts
  naming a digit and a motion, how often the ink centroid moves as told and how often the scorer reads
  the prompted digit in the first and the last frame (the same prompts and seeds for both cards), and how
  often the independent ``digit-classifier`` (no weights shared with the scorer) reads it;
* **continuation** (``video.t2v_continue``'s two stages, on a shorter prefix): ``wan-t2v`` renders 8
  frames, ``wan-causal`` is given the first 4 and generates 2 chunks after them: how often the new
  frames keep moving as told (centroid of frame 7 vs frame 3) and show the digit in the last frame;
* **time per video vs chunk count**: the bundled weights run as 1, 2, 4 and 8 chunks of an 8-frame
  video (8 steps per chunk; only the 4-chunk setting is what the card was trained for, the others
  are timing only), median ms per video of one ``jp.generate`` call of ``--render`` prompts;
* **the cache speed-up**: the same rollout with the cache vs recomputing every finished chunk at
  every step (the full block-causal forward over chunks ``0..c``, clean past at σ = 0), and the max
  difference of the two videos' latents at guidance 1 (where they compute the same thing).

    python benchmarks/causal.py              # prints markdown tables and writes --json
    python benchmarks/causal.py --quick      # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxpipe as jp
from jaxpipe import samplers
from jaxpipe.card import Card
from jaxpipe.cards import generator
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer, quality
from jaxpipe.digits.evaluators import default_evaluator
from jaxpipe.loops import chunk as chunk_loop
from jaxpipe.loops import policies
from jaxpipe.nn import DiTCond


def with_chunks(card: Card, chunk_frames: int) -> Card:
    """``card`` generating its 8 frames as chunks of ``chunk_frames`` (same weights)."""
    loop = card.spec.loops[0]
    sampling = loop.config.replace(chunk_frames=chunk_frames, chunks=loop.latent_shape[0] // chunk_frames)
    config = dataclasses.replace(card.spec.config, sampling=sampling)
    spec = dataclasses.replace(
        card.spec,
        loops=(dataclasses.replace(loop, config=sampling),),
        config=config,
        model_id=f"{card.model_id}-f{chunk_frames}",
    )
    return Card(card.components, spec)


def prompts(n: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    digit, motion = rng.integers(0, 10, n), rng.integers(0, len(digits.MOTION_NAMES), n)
    return [digits.caption(int(d), motion=int(m)) for d, m in zip(digit, motion)], digit, motion


def timed(fn, repeats: int) -> float:
    """Median wall ms of ``fn()`` (called once first to compile)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def time_per_video(cards: dict[str, Card], texts: list[str], repeats: int) -> dict[str, float]:
    """Setting -> median ms per video of one ``jp.generate`` call of ``texts`` (compiled first; the settings
    interleaved in each repeat, so load drifts hit all alike)."""
    seeds = list(range(len(texts)))
    render = lambda card: jax.block_until_ready(jp.generate(card, texts, seed=seeds)["video"])
    for card in cards.values():
        render(card)
    times = {name: [] for name in cards}
    for _ in range(repeats):
        for name, card in cards.items():
            start = time.perf_counter()
            render(card)
            times[name].append((time.perf_counter() - start) * 1000.0 / len(texts))
    return {name: statistics.median(t) for name, t in times.items()}


def continuation(t2v: Card, causal: Card, scorer: Card, samples: int, keep: int = 4, chunks: int = 2) -> dict:
    """``wan-t2v`` renders 8 frames; ``wan-causal`` is given the first ``keep`` and generates ``chunks`` more
    chunks after them (the digits world's motions span 8 frames: further out, the digit would leave
    the frame). Judged on the new frames: the centroid moves as told from the last given frame to the
    last frame, the scorer reads the prompted digit in the last frame (and, ``"independent"``, the independent
    digit-classifier), and the same digit as in the last given frame (the identity is carried over, whatever
    wan-t2v drew); the same judged on wan-t2v's own frames (``"wan-t2v alone"``) for reference."""
    texts, digit, motion = prompts(samples, seed=2)
    videos, references = [], []
    for i, text in enumerate(texts):
        first = np.asarray(jp.generate(t2v, text, seed=i)["video"][0])
        references.append(first)
        videos.append(
            np.asarray(
                jp.generate(causal, text, seed=i + 1, inputs={"video": first[:keep], "chunks": chunks})["video"][0]
            )
        )
    read = lambda frames: np.asarray(digit_scorer.predict(scorer, jnp.asarray(frames) * 2.0 - 1.0)["digit"])

    def judge(videos: np.ndarray) -> dict:
        centroids = quality.ink_centroids(videos)
        last, given = read(videos[:, -1]), read(videos[:, keep - 1])
        return {
            "motion_accuracy": float(np.mean(quality.moves_as_told(centroids[:, -1] - centroids[:, keep - 1], motion))),
            "last_frame_digit_accuracy": float(np.mean(last == digit)),
            "given_frame_digit_accuracy": float(np.mean(given == digit)),
            "keeps_given_digit": float(np.mean(last == given)),
            "independent": {
                "last_frame_digit_accuracy": float(np.mean(default_evaluator().predict(videos[:, -1]) == digit))
            },
        }

    videos = np.stack(videos)
    return {
        "samples": samples,
        "given_frames": keep,
        "frames_added": int(videos.shape[1] - keep),
        **judge(videos),
        "wan-t2v alone": judge(np.stack(references)[:, : videos.shape[1]]),
    }


def recompute_rollout(dit, keys, cond: DiTCond, uncond: DiTCond | None, config: chunk_loop.ChunkConfig, shape):
    """The chunk rollout without a cache: every step of chunk ``c`` runs the full block-causal forward over
    chunks ``0..c`` (finished ones clean, σ = 0) and keeps the last chunk's velocity. Latents ``(B, T, h, w, C)``."""
    f, b = config.chunk_frames, keys.shape[0]
    sigmas = chunk_loop.schedule(config)
    video = jnp.zeros((b, 0) + tuple(shape[1:]), jnp.float32)
    for c in range(config.chunks):
        x = chunk_loop._noise(keys, jnp.full((b,), c, jnp.int32), (f,) + tuple(shape[1:]))

        def velocity(x, sigma, text, video=video, c=c):
            past = jnp.concatenate([video] * (x.shape[0] // b), axis=0)  # guidance stacks cond and uncond rows
            full = jnp.concatenate([past, x], axis=1)
            sig = jnp.concatenate([jnp.zeros((x.shape[0], c)), sigma[:, None]], axis=1)
            return dit(full, sig, text.context, text.context_mask, chunk_frames=f)[:, -f:]

        def body(i, x):
            sigma = jnp.full((b,), sigmas[i])
            v = policies.guidance(config.guidance)(velocity, x, sigma, cond, uncond)
            return samplers.euler_step(x, v, sigma, jnp.full((b,), sigmas[i + 1]))

        video = jnp.concatenate([video, jax.lax.fori_loop(0, config.num_steps, body, x)], axis=1)
    return video


SPEEDUP_SETTINGS = ((2, 4), (1, 8), (2, 8), (2, 16))
"""(chunk_frames, chunks) of the cache speed-up: the bundled 4 x 2, then longer rollouts (positions past the
trained 8 frames: timing only)."""


def cache_speedup(card: Card, render: int, repeats: int, settings=SPEEDUP_SETTINGS) -> dict:
    """Per ``(chunk_frames, chunks)``: ms per video of the cached rollout vs recomputing the finished chunks at
    every step; for the bundled setting also their max latent difference at guidance 1 (the same computation)."""
    texts, _, _ = prompts(render, seed=3)
    ids = jnp.asarray(card.spec.tokenizer.encode(texts, card["text_encoder"].cfg.max_len))
    keys = generator.request_keys(list(range(render)))
    loop = card.spec.loops[0]
    out = {}
    for f, n in settings:
        row = {}
        for guidance in (loop.config.guidance, 1.0):
            config = loop.config.replace(guidance=guidance, chunk_frames=f, chunks=n)
            if guidance == 1.0 and (f, n) != settings[0]:
                continue
            shape = (f * n,) + tuple(loop.latent_shape[1:])

            def conds(card, config=config):
                cond = DiTCond(card["text_encoder"](ids), ids != 0)
                null = jnp.zeros_like(ids)
                return cond, DiTCond(card["text_encoder"](null), null != 0) if config.guide.needs_uncond else None

            @jax.jit
            def cached(card, config=config, shape=shape, conds=conds):
                cond, uncond = conds(card)
                state = chunk_loop.init(card["transformer"], keys, shape, cond, config, uncond)
                return chunk_loop.run((card["transformer"],), state, config)[0].video

            @jax.jit
            def recomputed(card, config=config, shape=shape, conds=conds):
                cond, uncond = conds(card)
                return recompute_rollout(card["transformer"], keys, cond, uncond, config, shape)

            if guidance == 1.0:
                row["max_abs_diff_guidance_1"] = float(jnp.abs(cached(card) - recomputed(card)).max())
            else:
                row["cached_ms_per_video"] = timed(lambda: cached(card), repeats) / render
                row["recomputed_ms_per_video"] = timed(lambda: recomputed(card), repeats) / render
                row["speedup"] = row["recomputed_ms_per_video"] / row["cached_ms_per_video"]
        out[f"{n} chunks of {f}"] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--continue-samples", type=int, default=50)
    parser.add_argument("--render", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timing-only", action="store_true", help="skip the quality and continuation runs")
    parser.add_argument("--skip-cache", action="store_true", help="skip the cache speed-up runs")
    parser.add_argument("--json", default="/tmp/causal_benchmark.json")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.continue_samples, args.render, args.repeats = 4, 2, 2, 1
    load = os.getloadavg()[0]
    causal, t2v, scorer = jp.cards.load("wan-causal"), jp.cards.load("wan-t2v"), jp.cards.load("digit-scorer")
    report: dict = {"samples": args.samples, "render": args.render, "repeats": args.repeats}

    if not args.timing_only:
        report["quality"] = {
            name: quality.t2v_quality(card, scorer, samples=args.samples, progress=True)["full"]
            for name, card in (("wan-t2v", t2v), ("wan-causal", causal))
        }
        report["continuation"] = continuation(t2v, causal, scorer, args.continue_samples)
    texts, _, _ = prompts(args.render, seed=1)
    settings = {
        "wan-t2v": t2v,
        **{f"wan-causal, {8 // f} chunk(s) of {f}": with_chunks(causal, f) for f in (8, 4, 2, 1)},
    }
    report["ms_per_video"] = time_per_video(settings, texts, args.repeats)
    if not args.skip_cache:
        report["cache"] = cache_speedup(causal, args.render, args.repeats)

    lines = []
    if not args.timing_only:
        lines += [
            "| card | motion as prompted | digit, first frame (scorer) | digit, last frame (scorer) "
            "| digit, first frame (independent) | digit, last frame (independent) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, r in report["quality"].items():
            ind = r["independent"]
            lines.append(
                f"| `{name}` | {100 * r['motion_accuracy']:.0f}% | {100 * r['first_frame_digit_accuracy']:.0f}% "
                f"| {100 * r['last_frame_digit_accuracy']:.0f}% | {100 * ind['first_frame_digit_accuracy']:.0f}% "
                f"| {100 * ind['last_frame_digit_accuracy']:.0f}% |"
            )
        c = report["continuation"]
        lines += [
            "",
            f"continuation ({c['given_frames']} given + {c['frames_added']} new frames, {c['samples']} prompts): "
            f"motion as prompted {100 * c['motion_accuracy']:.0f}%, digit in the last frame (scorer) "
            f"{100 * c['last_frame_digit_accuracy']:.0f}% (last given frame: {100 * c['given_frame_digit_accuracy']:.0f}%; "
            f"independent classifier, last frame: {100 * c['independent']['last_frame_digit_accuracy']:.0f}%), "
            f"the scorer reads the same digit in the last given and the last new frame {100 * c['keeps_given_digit']:.0f}%; "
            f"wan-t2v's own frames on the same prompts and seeds: motion {100 * c['wan-t2v alone']['motion_accuracy']:.0f}%, "
            f"digit in frame {c['given_frames'] + c['frames_added']} {100 * c['wan-t2v alone']['last_frame_digit_accuracy']:.0f}%, "
            f"same digit as in frame {c['given_frames']} {100 * c['wan-t2v alone']['keeps_given_digit']:.0f}%",
            "",
        ]
    lines += ["| setting | ms / video |", "|---|---:|"]
    lines += [f"| {name} | {ms:.1f} |" for name, ms in report["ms_per_video"].items()]
    if "cache" in report:
        lines += [
            "",
            "| rollout | cached ms / video | recomputing finished chunks | speed-up |",
            "|---|---:|---:|---:|",
        ]
        for name, k in report["cache"].items():
            lines.append(
                f"| {name} | {k['cached_ms_per_video']:.1f} | {k['recomputed_ms_per_video']:.1f} | {k['speedup']:.2f}x |"
            )
        first = next(iter(report["cache"].values()))
        lines.append(f"max |cached - recomputed| latents at guidance 1: {first['max_abs_diff_guidance_1']:.2e}")
    print("\n".join(lines))
    print(
        f"samples {args.samples} (seed 0), time: median of {args.repeats} x {args.render} prompts; "
        f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    if not args.quick:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
