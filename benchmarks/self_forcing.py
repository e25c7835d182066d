"""Self-forcing of the bundled ``wan-causal`` against the bidirectional ``wan-t2v``: before vs after.

A short ``SelfForcing`` run (``jaxpipe.training.methods.self_forcing``; prompts naming a digit and a motion,
the card's own sampling: 4 chunks of 2 frames, 8 Euler steps per chunk, guidance 2) from the bundled
card, then, on the bundled card and on the trained one, with the same prompts and seeds:

* **quality** (``quality.t2v_quality``, judged by ``digit-scorer``): the ink centroid moves as told
  (``quality.moves_as_told``) and the scorer reads the prompted digit in the first and last frame (and,
  marked "independent", how often the ``digit-classifier``, which shares no weights with the scorer, reads it);
* **drift past the trained length**: ``--long-chunks`` chunks (default 12 = 24 frames, 3× the 4 chunks
  trained on) per prompt; per 8-frame window (frames 0-7 = the trained length, 8-15, 16-23): how often
  the scorer (and the independent classifier) reads the prompted digit, the ink mass (sum of pixel values per frame), the ink brightness
  (mean of the pixels above 0.25) and how often the window moves as told (centroid of its last frame vs
  its first).

The teacher ``wan-t2v`` is measured on the same prompts (its own 8 frames) as the reference the
distribution matching pulls toward.

The trained card is saved (only its DiT; text encoder and autoencoder from the bundled ``wan-causal``)
to ``--out`` and reloaded with ``jp.cards.load``.

    python benchmarks/self_forcing.py            # 7 min training + ~3 min evaluation; writes RESULTS section self_forcing
    python benchmarks/self_forcing.py --quick    # short smoke run (fewer steps and samples)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import numpy as np

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict, save_card
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer, quality
from jaxpipe.digits.evaluators import default_evaluator
from jaxpipe.digits.prompts import TEXT_WIDTH
from jaxpipe.prompts import Prompts
from jaxpipe.training.distribution_matching import DistributionMatching
from jaxpipe.training.methods.self_forcing import SelfForcing, SelfForcingConfig
from jaxpipe.training.optim import Optimizer

WINDOW = 8  # frames per drift window: the length the card was trained on
INK = 0.25


def motion_prompts(n: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``n`` captions naming a digit and a motion, with their digit and motion labels."""
    rng = np.random.default_rng(seed)
    digit, motion = rng.integers(0, 10, n), rng.integers(0, len(digits.MOTION_NAMES), n)
    return [digits.caption(int(d), motion=int(m)) for d, m in zip(digit, motion)], digit, motion


def batches(card: Card, prompts_per_step: int, seed: int):
    """Endless training batches (``Prompts``, the digit labels as metadata) of digit-and-motion prompts."""
    rng_seed = seed
    while True:
        texts, digit, _ = motion_prompts(prompts_per_step, rng_seed)
        rng_seed += 1
        yield Prompts.from_texts(card, texts, {"digit": digit.astype(np.int32)}, width=TEXT_WIDTH)


def drift(card: Card, scorer: Card, samples: int, chunks: int | None, seed: int = 123, batch: int = 16) -> dict:
    """Per 8-frame window of ``chunks``-chunk videos (``None``: the card's own length, e.g. the bidirectional
    teacher's 8 frames): digit read accuracy (by the scorer, and by the independent digit-classifier), ink mass,
    ink brightness, motion."""
    texts, digit, motion = motion_prompts(samples, seed)
    inputs = {} if chunks is None else {"chunks": chunks}
    videos = np.concatenate(
        [
            np.asarray(
                jp.generate(
                    card,
                    texts[i : i + batch],
                    seed=list(range(seed + i, seed + min(i + batch, samples))),
                    inputs=inputs,
                )["video"]
            )
            for i in range(0, samples, batch)
        ]
    )
    n, t = videos.shape[:2]
    frames = videos.reshape((n * t,) + videos.shape[2:])
    read = np.asarray(digit_scorer.predict(scorer, frames * 2.0 - 1.0)["digit"])
    read = read.reshape(n, t) == digit[:, None]
    read_independent = np.asarray(default_evaluator().predict(frames)).reshape(n, t) == digit[:, None]
    mass = videos[..., 0].sum(axis=(-2, -1))  # (n, t)
    inked = videos[..., 0] > INK
    bright = (videos[..., 0] * inked).sum(axis=(-2, -1)) / np.maximum(inked.sum(axis=(-2, -1)), 1)
    centroids = quality.ink_centroids(videos)
    out = []
    for w in range(t // WINDOW):
        s = slice(w * WINDOW, (w + 1) * WINDOW)
        moved = quality.moves_as_told(centroids[:, s.stop - 1] - centroids[:, s.start], motion)
        out.append(
            {
                "frames": f"{s.start}-{s.stop - 1}",
                "digit_read": float(read[:, s].mean()),
                "digit_read_independent": float(read_independent[:, s].mean()),
                "ink_mass": float(mass[:, s].mean()),
                "ink_brightness": float(bright[:, s].mean()),
                "moves_as_told": float(moved.mean()),
            }
        )
    return {"samples": samples, "chunks": chunks, "windows": out}


def evaluate(card: Card, scorer: Card, samples: int, drift_samples: int, chunks: int | None) -> dict:
    q = quality.t2v_quality(card, scorer, samples=samples)["full"]
    independent = {
        f"{k} (independent)": q["independent"][k] for k in ("first_frame_digit_accuracy", "last_frame_digit_accuracy")
    }
    return {
        "quality": {
            **{k: q[k] for k in ("motion_accuracy", "first_frame_digit_accuracy", "last_frame_digit_accuracy")},
            **independent,
        },
        "drift": drift(card, scorer, drift_samples, chunks),
    }


def train(method: SelfForcing, card: Card, steps: int, minutes: float, prompts: int, seed: int) -> tuple:
    state = method.init(jax.random.key(seed))
    data = batches(card, prompts, seed)
    history, start, done = [], time.perf_counter(), 0
    for i in range(steps):
        state, metrics = method.step(state, next(data), jax.random.fold_in(jax.random.key(seed), i))
        metrics = {k: float(v) for k, v in metrics.items()}
        done = i + 1
        if i % 10 == 0 or i == steps - 1:
            history.append({"step": i, **metrics, "elapsed_s": round(time.perf_counter() - start, 1)})
            print(json.dumps(history[-1]), flush=True)
        if time.perf_counter() - start > minutes * 60:
            break
    return state, done, time.perf_counter() - start, history


def table(before: dict, after: dict, teacher: dict) -> str:
    rows = ["| | bundled wan-causal | self-forced | wan-t2v (teacher, 8 frames) |", "|---|---|---|---|"]
    for k in (
        "motion_accuracy",
        "first_frame_digit_accuracy",
        "last_frame_digit_accuracy",
        "first_frame_digit_accuracy (independent)",
        "last_frame_digit_accuracy (independent)",
    ):
        name, _, judge = k.partition(" (")
        judge = judge.rstrip(")") or ("" if k == "motion_accuracy" else "scorer")
        label = f"{name} ({judge + '; ' if judge else ''}8 frames, t2v_quality)"
        rows.append(
            f"| {label} | {before['quality'][k]:.3f} | {after['quality'][k]:.3f} | {teacher['quality'][k]:.3f} |"
        )
    windows = zip(before["drift"]["windows"], after["drift"]["windows"])
    names = {"digit_read": "digit_read (scorer)", "digit_read_independent": "digit_read (independent)"}
    for w, (wb, wa) in enumerate(windows):
        for k in ("digit_read", "digit_read_independent", "moves_as_told", "ink_mass", "ink_brightness"):
            fmt = ".1f" if k == "ink_mass" else ".3f"
            ref = f"{teacher['drift']['windows'][0][k]:{fmt}}" if w == 0 else ""
            rows.append(f"| frames {wb['frames']}: {names.get(k, k)} | {wb[k]:{fmt}} | {wa[k]:{fmt}} | {ref} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=None, help="training wall-clock budget")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=None, help="t2v_quality prompts")
    parser.add_argument("--drift-samples", type=int, default=None)
    parser.add_argument("--long-chunks", type=int, default=12)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--critic-learning-rate", type=float, default=2e-4)
    parser.add_argument("--critic-steps", type=int, default=4)
    parser.add_argument(
        "--critic-warmup",
        "--warmup-steps",
        dest="critic_warmup",
        type=int,
        default=None,
        help="critic-only steps first (50; --quick 5)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="/tmp/selfforcing/wan-causal-sf", help="where the trained card is saved")
    parser.add_argument("--json", default="/tmp/selfforcing/self_forcing.json")
    parser.add_argument("--results", default=str(Path(__file__).with_name("RESULTS.md")))
    args = parser.parse_args()
    steps = args.steps or (20 if args.quick else 400)
    minutes = args.minutes or (2.0 if args.quick else 7.0)
    samples = args.samples or (20 if args.quick else 200)
    drift_samples = args.drift_samples or (16 if args.quick else 96)

    causal, teacher, scorer = jp.cards.load("wan-causal"), jp.cards.load("wan-t2v"), jp.cards.load("digit-scorer")
    config = SelfForcingConfig(
        student=Optimizer(args.learning_rate, b1=0.0),
        dm=DistributionMatching(critic=Optimizer(args.critic_learning_rate, b1=0.0), critic_steps=args.critic_steps),
        critic_warmup=(5 if args.quick else 50) if args.critic_warmup is None else args.critic_warmup,
    )
    t0 = time.perf_counter()
    before = evaluate(causal, scorer, samples, drift_samples, args.long_chunks)
    eval_s = time.perf_counter() - t0
    reference = evaluate(teacher, scorer, samples, drift_samples, None)
    method = SelfForcing(causal, teacher, config)
    # the training rollout (guided, 8 steps per chunk) is the served one: same keys, same latents
    check = next(batches(causal, args.prompts, args.seed + 999))
    served = method.serve(method.init(), check, jax.random.key(0))["latents"]
    rollout_gap = float(
        np.abs(np.asarray(method.render(method.init(), check, jax.random.key(0))) - np.asarray(served)).max()
    )
    print(f"max |training rollout - served rollout| (latents): {rollout_gap:.2e}", flush=True)
    state, done, train_s, history = train(method, causal, steps, minutes, args.prompts, args.seed)
    trained = method.card(state)
    out = save_card(trained, args.out, base="wan-causal", base_components=("text_encoder", "vae"))
    reloaded = jp.cards.load(str(out))
    after = evaluate(reloaded, scorer, samples, drift_samples, args.long_chunks)
    result = {
        "config": {**config_to_dict(config), "prompts_per_step": args.prompts},
        "rollout_gap": rollout_gap,
        "steps": done,
        "train_s": round(train_s, 1),
        "eval_s_per_card": round(eval_s, 1),
        "saved": str(out),
        "before": before,
        "after": after,
        "teacher": reference,
        "history": history,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    body = (
        f"## self_forcing\n\n`python benchmarks/self_forcing.py{' --quick' if args.quick else ''}`: {done} SelfForcing steps "
        f"({args.prompts} prompts each, {config.dm.critic_steps} critic updates per step, the first {config.critic_warmup} critic-only, lr {config.student.learning_rate:g} / "
        f"critic {config.dm.critic.learning_rate:g}) in {train_s:.0f} s from the bundled wan-causal against wan-t2v "
        f"(guidance 2); t2v_quality on {samples} prompts, drift on {drift_samples} videos of {args.long_chunks} "
        f"chunks ({2 * args.long_chunks} frames; trained on 4 chunks = 8 frames). The training rollout equals the "
        f"served one to {rollout_gap:.1e} (max abs latent difference, same keys, guidance 2). Trained card: "
        f"`{out}` (`jp.cards.load` it). Digit reads: by the digit-scorer (the reward's own weights; scorer) and by "
        f"the independent digit-classifier (no weights shared with the scorer; independent).\n\n"
        + table(before, after, reference)
    )
    print(body)
    if os.environ.get("SELF_FORCING_NO_RESULTS") != "1":
        from report import write_section

        write_section(Path(args.results), "self_forcing", body)


if __name__ == "__main__":
    main()
