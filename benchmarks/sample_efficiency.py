"""Sample efficiency of several PPO updates per rollout: 1 / 2 / 4 updates per rollout.

For FlowGRPO on ``flux-t2i`` and joint UnifiedRL on ``unified`` (the README's settings), the same
run is trained with each rollout split into 1, 2 or 4 minibatches (one inner epoch), same seeds.
Every ``--segment`` steps the run stops and is resumed (bit for bit the uninterrupted run, see
``runs.execute``), and the card is judged in between, so all-attributes-right is measured along the
way. Reported against **rollouts consumed** (steps) and against **training wall time** (this
process, compiles included): reward (moving mean), all-right, clip fraction and KL over training,
diversity before / after.

    python benchmarks/sample_efficiency.py                    # seeds 0 and 1 (~25 min on 2 cores): RESULTS.md + docs/img curves
    python benchmarks/sample_efficiency.py --replot FILE      # the table and curves again from a run's raw results
    python benchmarks/sample_efficiency.py --quick            # smoke test: 4 steps, tiny evaluation, prints only

The raw results (every metrics row, step time and evaluation) are kept in
``out/benchmarks/sample_efficiency.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.digits import runs
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.joint_rl import UnifiedRLConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.ppo import Schedule
from jaxpipe.training.rollout import Group, Sampling

SECTION = "sample_efficiency"
IMAGES = pathlib.Path(__file__).resolve().parent.parent / "docs" / "img"
UPDATES = (1, 2, 4)
RAW = pathlib.Path(__file__).resolve().parent.parent / "out" / "benchmarks" / "sample_efficiency.json"


class Timed:
    """A method whose ``step`` records each step's wall time (synchronised): training time per step."""

    def __init__(self, method):
        self._method, self.times = method, []

    def __getattr__(self, name):
        return getattr(self._method, name)

    def step(self, state, batch, key):
        start = time.perf_counter()
        state, metrics = self._method.step(state, batch, key)
        jax.block_until_ready(metrics)
        self.times.append(time.perf_counter() - start)
        return state, metrics


def experiments(quick: bool):
    flux, unified, scorer = (jp.cards.load(name) for name in ("flux-t2i", "unified", "digit-scorer"))
    common = {
        "group": Group(4),
        "sampling": Sampling(num_steps=8, sampler="sde", sde_window=(0, 4)),
        "beta": 0.04,
        "optimizer": Optimizer(1e-4),
    }
    spec_fg = runs.PromptSpec()
    spec_un = runs.PromptSpec(mention=0.5, prefer=(("stroke", 1),))
    evaluation = runs.EvalSettings(
        samples=8 if quick else 200, diversity_prompts=2 if quick else 10, diversity_seeds=2 if quick else 6
    )
    for updates in UPDATES:
        fg = FlowGRPOConfig(**common, ppo=Schedule(minibatches=updates))
        yield (
            "FlowGRPO (flux-t2i)",
            updates,
            300,
            lambda fg=fg: runs.flow_grpo_run(flux, scorer, fg, spec_fg, prompts_per_step=4, evaluation=evaluation),
            "all_attributes_correct",
        )
    for updates in UPDATES:
        un = UnifiedRLConfig(generator=FlowGRPOConfig(**{**common, "beta": 0.2}, ppo=Schedule(minibatches=updates)))
        yield (
            "UnifiedRL joint (unified)",
            updates,
            500,
            lambda un=un: runs.unified_run(unified, scorer, un, spec_un, prompts_per_step=4, evaluation=evaluation),
            "refined_all_right",
        )


def all_right(report: dict, key: str) -> float:
    """All attributes right after training, judged by the digit-scorer (the reward's own weights)."""
    after = report["after"]
    return after[key] if key in after else after["refined"]["all_right"]


def all_right_independent(report: dict, key: str) -> float:
    """The same images' all right judged by the independent evaluators (digit-classifier + readers)."""
    after = report["after"]
    return after["independent"][key] if key in after else after["refined"]["independent"]["all_right"]


def run_one(build, steps: int, segment: int, out: pathlib.Path, key: str, seed: int) -> dict:
    """One run, stopped and resumed every ``segment`` steps and judged at each stop."""
    curve, times = [], []
    done = 0
    while done < steps:
        done = min(steps, done + segment)
        run = build()
        timed = Timed(run.method)
        run.method = timed
        report = runs.execute(
            run, steps=done, out=out, seed=seed, resume=out.exists(), progress=False, log=lambda *_: None
        )
        times.extend(timed.times)
        curve.append((done, all_right(report, key), report["after"]["diversity"], all_right_independent(report, key)))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    before = json.loads((out / "before.json").read_text())
    return {
        "curve": curve,
        "times": times,
        "rows": rows,
        "before": all_right({"after": before}, key),
        "before_independent": all_right_independent({"after": before}, key),
        "diversity_before": before["diversity"],
    }


def moving(values, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, moving mean over ``window`` steps) of a per-step series (steps count from 1)."""
    values = np.asarray(values, np.float64)
    window = min(window, len(values))
    return np.arange(window, len(values) + 1), np.convolve(values, np.ones(window) / window, mode="valid")


def series(rows: list[dict], *names: str) -> list[float]:
    """The first of ``names`` each metrics row has (FlowGRPO: ``clip_frac``; joint: ``gen_clip_frac``)."""
    return [next(r[n] for n in names if n in r) for r in rows]


def plot(name: str, results: dict, path: pathlib.Path) -> None:
    """Four panels, mean over seeds: reward vs rollouts and vs wall time, all right, clip fraction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.4))
    for updates, by_seed in results.items():
        label = f"{updates} update{'s' if int(updates) > 1 else ''} / rollout"
        runs_ = list(by_seed.values())
        reward = np.mean([series(r["rows"], "reward_mean") for r in runs_], axis=0)
        steps, smooth = moving(reward, 20)
        wall = np.mean([np.cumsum(r["times"]) for r in runs_], axis=0)[steps - 1]
        axes[0].plot(steps, smooth, label=label)
        axes[1].plot(wall, smooth, label=label)
        xs = [0] + [c[0] for c in runs_[0]["curve"]]
        right = np.mean([[r["before"]] + [c[1] for c in r["curve"]] for r in runs_], axis=0)
        axes[2].plot(xs, 100 * right, marker="o", label=label)
        clip = np.mean([series(r["rows"], "clip_frac", "gen_clip_frac") for r in runs_], axis=0)
        axes[3].plot(*moving(clip, 10), label=label)
    axes[0].set(title="reward (moving mean 20) vs rollouts", xlabel="rollouts (steps)")
    axes[1].set(title="reward vs training wall time", xlabel="seconds (compiles included)")
    axes[2].set(title="all attributes right (scorer), %", xlabel="rollouts (steps)")
    axes[3].set(title="generator clip fraction (mean 10)", xlabel="rollouts (steps)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.suptitle(f"{name}, mean over seeds {', '.join(next(iter(results.values())))}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def row(name: str, updates: str, runs_: list[dict]) -> str:
    """One table row: means over the seeds' runs (per seed for final all right and diversity)."""
    n = max(1, len(runs_[0]["rows"]) // 10)
    percent = lambda v: f"{100 * v:.1f}%"
    right = np.mean([[r["before"]] + [c[1] for c in r["curve"]] for r in runs_], axis=0)
    final = [r["curve"][-1][1] for r in runs_]
    reward = np.array([series(r["rows"], "reward_mean") for r in runs_])
    clip = np.array([series(r["rows"], "clip_frac", "gen_clip_frac") for r in runs_])
    kl = np.array([series(r["rows"], "kl", "gen_kl") for r in runs_])
    diversity = [(r["curve"][-1][2] - r["diversity_before"]) / r["diversity_before"] for r in runs_]
    if all("before_independent" in r and len(r["curve"][-1]) > 3 for r in runs_):  # not in raw files from before it
        independent = (
            f"{percent(np.mean([r['before_independent'] for r in runs_]))} → "
            f"{' / '.join(percent(r['curve'][-1][3]) for r in runs_)}"
        )
    else:
        independent = "—"
    return (
        f"| {name} | {updates} | {' → '.join(map(percent, right))} | {' / '.join(map(percent, final))} | {independent} | "
        f"{reward[:, :n].mean():.3f} → {reward[:, -n:].mean():.3f} | {clip[:, -n:].mean():.3f} | {kl[:, -n:].mean():.2e} | "
        f"{' / '.join(f'{100 * d:+.1f}%' for d in diversity)} | {np.mean([sum(r['times']) for r in runs_]):.0f} | "
        f"{np.mean([np.median(r['times']) for r in runs_]):.3f} |"
    )


def table(raw: dict) -> list[str]:
    """The markdown table: one row per run and updates per rollout."""
    lines = [
        (
            f"| run | updates / rollout | all right (scorer): before → every {raw['segment']} steps (mean over seeds) | "
            "final all right (scorer), per seed | all right (independent): before → final, per seed | reward, first → "
            "last 10% | clip fraction, last 10% | KL, last 10% | diversity change, per seed | train s | s / step |"
        ),
        "|---|---:|---|---|---|---|---:|---:|---|---:|---:|",
    ]
    for name, results in raw["results"].items():
        lines += [row(name, updates, list(by_seed.values())) for updates, by_seed in results.items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 steps, tiny evaluation, prints only")
    parser.add_argument(
        "--steps", type=int, help="steps of every run (default: 300 FlowGRPO, 500 UnifiedRL, as the README)"
    )
    parser.add_argument("--segment", type=int, default=100, help="steps between evaluations")
    parser.add_argument("--seeds", default="0,1", help="training seeds (prompts and rollouts), comma-separated")
    parser.add_argument("--raw", type=pathlib.Path, default=RAW, help="where the raw results are written")
    parser.add_argument(
        "--replot", type=pathlib.Path, help="only rebuild the table and curves from this raw results file"
    )
    args = parser.parse_args()
    if args.replot:
        raw = json.loads(args.replot.read_text())
    else:
        raw = measure(args)
        if not args.quick:
            args.raw.parent.mkdir(parents=True, exist_ok=True)
            args.raw.write_text(json.dumps(raw))
    body = "\n".join(["## sample_efficiency", "", *raw["header"], "", *table(raw)])
    print(body)
    images = pathlib.Path(tempfile.mkdtemp()) if args.quick else IMAGES  # a smoke test draws, but not over the curves
    for name, results in raw["results"].items():
        slug = "flow_grpo" if name.startswith("FlowGRPO") else "unified"
        plot(name, results, images / f"sample_efficiency_{slug}.png")
    if args.quick:
        print(f"\ncurves in {images}")
    else:
        write_section(RESULTS, SECTION, body)
        print(f"\nwrote the {SECTION} section of {RESULTS} and docs/img/sample_efficiency_*.png")


def measure(args) -> dict:
    """Every (setting, seed) run; the raw file is rewritten after each, and a rerun resumes from it."""
    seeds = [int(s) for s in args.seeds.split(",")]
    segment = 2 if args.quick else args.segment
    load = os.getloadavg()[0]
    settings = {"seeds": seeds, "segment": segment, "steps": args.steps}
    previous = json.loads(args.raw.read_text()) if args.raw.exists() and not args.quick else {}
    partial = previous if previous.get("settings") == settings and "header" not in previous else {}
    results: dict = partial.get("results", {})
    elapsed = partial.get("elapsed", 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, updates, steps, build, key) in enumerate(experiments(args.quick)):
            steps = 4 if args.quick else args.steps or steps
            for seed in seeds:
                done = results.get(name, {}).get(str(updates), {})
                if str(seed) in done:
                    print(f"{name}: {updates} update(s) per rollout, seed {seed}: kept from {args.raw}", flush=True)
                    continue
                print(f"{name}: {updates} update(s) per rollout, {steps} steps, seed {seed} ...", flush=True)
                out = pathlib.Path(tmp) / f"run{i}_seed{seed}"
                start = time.perf_counter()
                results.setdefault(name, {}).setdefault(str(updates), {})[str(seed)] = run_one(
                    build, steps, segment, out, key, seed
                )
                elapsed += time.perf_counter() - start
                if not args.quick:
                    args.raw.parent.mkdir(parents=True, exist_ok=True)
                    args.raw.write_text(json.dumps({"settings": settings, "results": results, "elapsed": elapsed}))
    header = [
        (
            "`python benchmarks/sample_efficiency.py`: each rollout (step) is P = 4 prompts × K = 4 samples, split "
            "into 1, 2 or 4 minibatches (one inner epoch: 1 / 2 / 4 PPO updates per rollout, `--minibatches`), "
            f"training seeds {', '.join(map(str, seeds))} for every setting; judged every {segment} steps (200 prompts, "
            "eval seed 0, guidance 1, 8 steps). FlowGRPO on `flux-t2i`, as `jaxpipe train flow-grpo --steps 300`: "
            "full compositional prompts, SDE on steps 0-3 of 8, lr 1e-4, β 0.04, clip 1e-3. UnifiedRL joint on "
            "`unified`, as `jaxpipe train unified --prefer stroke=thick --beta 0.2 --steps 500`: mention 0.5, LM lr "
            "1e-3; its all right is of the refined prompts. All right is read twice from the same images: by the "
            "digit-scorer (the reward's own weights; scorer) and by the independent evaluators (digit-classifier + "
            "analytic readers, no weights shared with the reward; independent). Train s: the training steps only (compiles included; "
            "the run is resumed after every evaluation), this process; s / step: the median step."
        ),
        "",
        *[f"- {k}: {v}" for k, v in machine_info().items()],
        f"- load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f}",
        f"- all runs: {elapsed:.0f} s (training and judging)",
    ]
    return {"settings": settings, "segment": segment, "header": header, "results": results, "elapsed": elapsed}


if __name__ == "__main__":
    main()
