"""RL on shared weights: one MoT thinks and generates vs two models (``unified``), equal rollouts.

The same prompts (mention 0.5, the stroke preference of the README's unified run), seeds, group
size, SDE window and number of rollouts for: ``SharedMoTRL`` on ``bagel-mot`` (modality routing),
on a ``"shared"``-routed MoT card (``--shared DIR``, trained by the same pretraining command), and
``UnifiedRL`` on ``unified`` (a refiner LM and a DiT, two optimisers). Reports the judged outcome
(all-right of the served, thought/refined prompts and of the prompts as written; the preferred-word
rate; diversity) before and after, and, per step, the cosine between the thinking part's and the
image part's gradients on each parameter role: does modality routing reduce interference?

    python benchmarks/shared_weights.py [--steps 300] [--shared out/cards/bagel-mot-shared]

Writes the ``shared_weights`` section of RESULTS.md and ``docs/img/shared_weights.png``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.digits import runs
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.joint_rl import UnifiedRLConfig
from jaxpipe.training.methods.mot_rl import ROLES, MoTRLConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling

SECTION = "shared_weights"
IMAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "img" / "shared_weights.png"
GENERATOR = FlowGRPOConfig(
    group=Group(4),
    sampling=Sampling(num_steps=8, sampler="sde", sde_window=(0, 4)),
    beta=0.2,
    optimizer=Optimizer(1e-4),
)
"""The image part's settings every contender shares (the MoT's one optimiser; ``unified``'s generator; its refiner LM
keeps the default lr 1e-3)."""


def moving(values, window: int = 25) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(values, np.float64)
    window = min(window, len(values))
    return np.arange(window, len(values) + 1), np.convolve(values, np.ones(window) / window, mode="valid")


def contenders(shared: pathlib.Path | None, quick: bool):
    scorer = jp.cards.load("digit-scorer")
    spec = runs.PromptSpec(mention=0.5, prefer=(("stroke", 1),))
    evaluation = runs.EvalSettings(
        samples=8 if quick else 200, diversity_prompts=2 if quick else 10, diversity_seeds=2 if quick else 6
    )
    mot = MoTRLConfig(generator=GENERATOR)
    yield (
        "SharedMoTRL, bagel-mot (modality)",
        lambda: runs.mot_run(jp.cards.load("bagel-mot"), scorer, mot, spec, evaluation=evaluation),
    )
    if shared is not None:
        yield (
            f"SharedMoTRL, {shared.name} (shared)",
            lambda: runs.mot_run(jp.cards.load(shared), scorer, mot, spec, evaluation=evaluation),
        )
    unified = UnifiedRLConfig(generator=GENERATOR)
    yield (
        "UnifiedRL, unified (two models)",
        lambda: runs.unified_run(jp.cards.load("unified"), scorer, unified, spec, evaluation=evaluation),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--shared", type=pathlib.Path, help="a bagel-mot card trained with --routing shared")
    parser.add_argument("--quick", action="store_true", help="smoke test: 3 steps, tiny evaluation, prints only")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, build) in enumerate(contenders(args.shared, args.quick)):
            print(f"{name}: {steps} steps ...", flush=True)
            out = pathlib.Path(tmp) / f"run{i}"
            t = time.perf_counter()
            report = runs.execute(build(), steps=steps, out=out, seed=0, progress=False, log=lambda *_: None)
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            before = json.loads((out / "before.json").read_text())
            results[name] = {
                "before": before,
                "after": report["after"],
                "rows": rows,
                "seconds": time.perf_counter() - t,
                "seconds_per_step": report["seconds_per_step"],
            }
    pct = lambda x: f"{100 * x:.1f}%"
    lines = [
        f"`python benchmarks/shared_weights.py --steps {steps}{' --shared ' + str(args.shared) if args.shared else ''}`: "
        f"{steps} rollouts of 4 prompts × 4 samples (3 think / refine, 1 as written), SDE on steps 0-3 of 8, lr 1e-4, "
        "β 0.2, prompts naming each attribute with probability 0.5, reward: every named attribute + thick strokes "
        "when the prompt leaves the stroke out. All right is of the served (thought / refined) images at guidance 1 "
        "(200 prompts, eval seed 0), read by the digit-scorer (the reward's own weights; scorer) and by the "
        "independent evaluators (digit-classifier + analytic readers, no weights shared with the reward; "
        "independent); cosines are between the thinking part's and the image part's gradients per "
        "step (mean over all steps; — where one part never reaches the role: no parameters there, or a path the "
        "objective does not take). s / step: training only, compiles included.",
        "",
        *[f"- {k}: {v}" for k, v in machine_info().items()],
        f"- whole run: {time.perf_counter() - start:.0f} s",
        "",
        "| run | all right (served, scorer): before → after | all right (served, independent): before → after "
        "| as written (scorer): before → after | as written (independent): before → after | preferred word rate "
        "| diversity change | s / step | cos all | cos shared | cos understanding | cos generation | cos io |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        b, a = r["before"], r["after"]
        # a role one of the two parts never reaches (no parameters, or a zero gradient) has no cosine
        reached = lambda role, r=r: (
            role == "all"
            or all(
                np.mean([row.get(f"{part}_grad_norm_{role}", 0.0) for row in r["rows"]]) > 0
                for part in ("token", "gen")
            )
        )
        cos = {
            role: np.mean([row[f"cos_{role}"] for row in r["rows"]])
            if f"cos_{role}" in r["rows"][0] and reached(role)
            else np.nan
            for role in ("all",) + ROLES
        }
        cell = lambda v: "—" if np.isnan(v) else f"{v:+.3f}"
        lines.append(
            f"| {name} | {pct(b['refined']['all_right'])} → {pct(a['refined']['all_right'])} | "
            f"{pct(b['refined']['independent']['all_right'])} → {pct(a['refined']['independent']['all_right'])} | "
            f"{pct(b['original']['all_right'])} → {pct(a['original']['all_right'])} | "
            f"{pct(b['original']['independent']['all_right'])} → {pct(a['original']['independent']['all_right'])} | "
            f"{pct(b['preferred_word_rate'] or 0)} → {pct(a['preferred_word_rate'] or 0)} | "
            f"{100 * (a['diversity'] / b['diversity'] - 1):+.1f}% | {r['seconds_per_step']:.2f} | "
            + " | ".join(cell(cos[k]) for k in ("all",) + ROLES)
            + " |"
        )
    body = "\n".join(["## shared_weights", "", *lines])
    print(body)
    if args.quick:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, r in results.items():
        left.plot(*moving([row["reward_mean"] for row in r["rows"]]), label=name)
        if "cos_all" in r["rows"][0]:
            for role, style in (("understanding", "-"), ("shared", "--"), ("generation", ":")):
                values = [row[f"cos_{role}"] for row in r["rows"]]
                if np.any(values):
                    right.plot(*moving(values), style, label=f"{name.split(', ')[1]}: {role}")
    left.set(xlabel="rollouts (steps)", ylabel="reward (moving mean, 25)", title="reward per rollout")
    right.axhline(0, color="grey", lw=0.5)
    right.set(
        xlabel="rollouts (steps)", ylabel="cosine (moving mean, 25)", title="thinking vs image gradient, per role"
    )
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMAGE, dpi=110)
    write_section(RESULTS, SECTION, body)
    print(f"\nwrote the {SECTION} section of {RESULTS} and {IMAGE}")


if __name__ == "__main__":
    main()
