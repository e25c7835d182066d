"""DiffusionNFT vs FlowGRPO on ``flux-t2i`` (issue 16): the same rollouts, and the same wall time.

Both methods train the bundled ``flux-t2i`` card from the ``digit-scorer`` reward (digit, stroke,
position, brightness probabilities, summed) on full compositional prompts, P = 4 prompts × K = 4
samples per step (one rollout), the same prompt stream and step keys (``fold_in(key(seed), i)``, as
``jaxpipe train``). FlowGRPO runs with the README's settings (SDE on denoising steps 0–3 of 8, lr
1e-4, β 0.04, clip 1e-3); DiffusionNFT renders its rollouts with the 8-step ODE (no log-probs) and
takes one flow-matching regression per rollout, one run per ``--nft-lr`` (1e-4 and 5e-5 by default).

* **Equal rollouts**: both train ``--steps`` steps; the train reward per step is kept, and every
  ``--every`` steps the card is judged on the same held-out prompts and noise (200 full prompts and
  200 plain digits at guidance 1, ``quality.t2i_quality``; diversity over 10 prompts × 6 seeds).
* **Equal wall time**: the runs of a seed are raced on one clock (the one that has spent the least
  warm step time steps next, so load from other jobs on a shared machine hits all alike); each NFT
  run is judged when its summed step time reaches FlowGRPO's for ``--steps`` steps. The first call (the
  compile) is timed separately, on throwaway states, with a few warm steps interleaved one by one.

    python benchmarks/nft_vs_grpo.py                  # seeds 0 and 1 (~7.5 min on 2 shared cores): RESULTS.md + PNG
    python benchmarks/nft_vs_grpo.py --quick          # smoke test: 4 steps, tiny evaluation, prints only
    python benchmarks/nft_vs_grpo.py --sweep --steps 150  # NFT settings (lr / β / EMA), one seed: prints only
    python benchmarks/nft_vs_grpo.py --replot FILE    # the table and plot again from a run's raw results

The raw results (per-step rewards and times, every evaluation) go to ``out/benchmarks/nft_vs_grpo.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.digits import quality
from jaxpipe.digits.evaluation import EvalSettings, diversity
from jaxpipe.digits.prompts import PromptSpec, prompt_batches
from jaxpipe.digits.rewards import scorer_reward
from jaxpipe.prompts import Prompts
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.flow_grpo import FlowGRPO
from jaxpipe.training.methods.nft import EMA, DiffusionNFT, DiffusionNFTConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling

SECTION = "nft_vs_grpo"
HERE = pathlib.Path(__file__).resolve().parent
PLOT = HERE / "nft_vs_grpo.png"
RAW = HERE.parent / "out" / "benchmarks" / "nft_vs_grpo.json"
PROMPTS_PER_STEP, GROUP, NUM_STEPS = 4, 4, 8
GRPO = FlowGRPOConfig(
    group=Group(GROUP),
    sampling=Sampling(num_steps=NUM_STEPS, sampler="sde", sde_window=(0, 4)),
    beta=0.04,
    optimizer=Optimizer(1e-4),
)
"""FlowGRPO as the README's FlowGRPO section and ``jaxpipe train flow-grpo`` run it."""
SWEEP = (
    {"learning_rate": 3e-5, "beta": 1.0, "ema_end": 0.5},
    {"learning_rate": 5e-5, "beta": 1.0, "ema_end": 0.5},
    {"learning_rate": 1e-4, "beta": 1.0, "ema_end": 0.5},
    {"learning_rate": 3e-4, "beta": 1.0, "ema_end": 0.5},
    {"learning_rate": 1e-3, "beta": 1.0, "ema_end": 0.5},
    {"learning_rate": 3e-4, "beta": 0.1, "ema_end": 0.5},
    {"learning_rate": 1e-4, "beta": 1.0, "ema_end": 0.0},
    {"learning_rate": 1e-4, "beta": 1.0, "ema_end": 0.9},
    {"learning_rate": 3e-4, "beta": 1.0, "ema_end": 0.0},
    {"learning_rate": 3e-4, "beta": 1.0, "ema_end": 0.9},
    {"learning_rate": 1e-4, "beta": 1.0, "ema_end": 0.5, "adv_clip": 5.0},
)
"""The ``--sweep`` grid of NFT settings (the rest as ``nft_config``)."""


def nft_config(
    learning_rate: float, beta: float, ema_end: float, adv_clip: float = 2.0, ema_ramp_steps: int = 100
) -> DiffusionNFTConfig:
    """DiffusionNFT on the same P, K and 8-step schedule as FlowGRPO (ODE rollouts, guidance 1)."""
    return DiffusionNFTConfig(
        group=Group(GROUP, adv_clip=adv_clip),
        sampling=Sampling(num_steps=NUM_STEPS),
        beta=beta,
        ema=EMA(end=ema_end, ramp_steps=ema_ramp_steps),
        optimizer=Optimizer(learning_rate),
    )


def parse_grid(text: str) -> tuple[dict, ...]:
    """``"lr,beta,ema_end[,adv_clip];..."`` -> ``nft_config`` keyword sets."""
    names = ("learning_rate", "beta", "ema_end", "adv_clip")
    points = []
    for part in filter(None, text.split(";")):
        values = [float(v) for v in part.split(",")]
        if not 3 <= len(values) <= 4:
            raise ValueError(f"a grid point is lr,beta,ema_end[,adv_clip] (got {part!r})")
        points.append(dict(zip(names, values)))
    return tuple(points)


def judge(card: Card, scorer: Card, spec: PromptSpec, settings: EvalSettings) -> dict:
    """Held-out quality at guidance 1 (the README's yardsticks): all attributes right on full prompts,
    digit accuracy on plain-digit prompts, diversity; the same prompts and noise for every card. Judged by the
    digit-scorer (the reward's own weights) and, under ``"independent"``, by the independent evaluators
    (digit-classifier + analytic readers, ``quality.t2i_quality``'s own second reading of the same images)."""
    start = time.perf_counter()
    q = quality.t2i_quality(
        card,
        scorer,
        samples=settings.samples,
        seed=settings.seed,
        num_steps=NUM_STEPS,
        guidance=1.0,
        batch=settings.batch,
    )
    return {
        "all_right": q["all_attributes_correct"],
        "digit_accuracy": q["digit_accuracy"],
        "attribute_accuracy": q["attribute_accuracy"],
        "independent": {
            "all_right": q["independent"]["all_attributes_correct"],
            "digit_accuracy": q["independent"]["digit_accuracy"],
            "attribute_accuracy": q["independent"]["attribute_accuracy"],
        },
        "diversity": diversity(card, spec, settings, num_steps=NUM_STEPS),
        "seconds": time.perf_counter() - start,
    }


def _timed_step(method, state, batch, key) -> tuple:
    start = time.perf_counter()
    state, metrics = method.step(state, batch, key)
    jax.block_until_ready(metrics)
    return state, metrics, time.perf_counter() - start


def step_costs(methods: dict, batches: Iterator[Prompts], seed: int, rounds: int) -> dict:
    """Per method: the first call's seconds (compile + one step) and ``rounds`` warm step times, the
    methods interleaved step by step so that both see the same load. Throwaway states and keys."""
    key = jax.random.fold_in(jax.random.key(seed), 2**30)  # not a training step's key
    states = {name: m.init(jax.random.key(seed)) for name, m in methods.items()}
    out = {name: {"first_call_s": 0.0, "times": []} for name in methods}
    for r in range(rounds + 1):
        batch = next(batches)
        for name, method in methods.items():
            states[name], _, seconds = _timed_step(method, states[name], batch, jax.random.fold_in(key, r))
            if r == 0:
                out[name]["first_call_s"] = seconds
            else:
                out[name]["times"].append(seconds)
    for record in out.values():
        record["step_s"] = float(np.median(record["times"]))
    return out


class Runner:
    """One method's training run, advanced a step at a time: key ``i`` = ``fold_in(key(seed), i)``; per-step
    train reward and warm seconds (evaluations excluded); ``evaluate(card)`` every ``every`` steps."""

    def __init__(
        self, method, batches: Iterator[Prompts], seed: int, every: int, evaluate: Callable[[Card], dict] | None
    ):
        self.method, self.batches, self.every, self.evaluate = method, batches, every, evaluate
        self.state, self.key = method.init(jax.random.key(seed)), jax.random.key(seed)
        self.steps, self.spent = 0, 0.0
        self.rewards, self.times, self.evals = [], [], {}

    def step(self) -> None:
        self.state, metrics, seconds = _timed_step(
            self.method, self.state, next(self.batches), jax.random.fold_in(self.key, self.steps)
        )
        self.steps, self.spent = self.steps + 1, self.spent + seconds
        self.rewards.append(float(metrics["reward_mean"]))
        self.times.append(seconds)
        if self.steps % self.every == 0:
            self.judge()

    def judge(self) -> None:
        """Evaluate the card as trained so far (once per step count)."""
        if self.evaluate is not None and str(self.steps) not in self.evals:
            self.evals[str(self.steps)] = self.evaluate(self.method.card(self.state))

    def record(self) -> dict:
        return {"rewards": self.rewards, "times": self.times, "evals": self.evals}


def train(method, batches: Iterator[Prompts], steps: int, seed: int, evaluate: Callable[[Card], dict] | None) -> dict:
    """``steps`` steps of one method, judged after the last: ``Runner.record()``."""
    runner = Runner(method, batches, seed, steps, evaluate)
    for _ in range(steps):
        runner.step()
    return runner.record()


def race(grpo: Runner, nfts: dict[str, Runner], steps: int) -> dict[str, int]:
    """All runs advanced on one clock: whichever has spent the least warm step time steps next, so all see
    the same machine load at the same moments. FlowGRPO stops at ``steps``; each NFT run steps on until
    its time passes FlowGRPO's (overshoot under one step) — its equal-wall step count, judged and
    returned per run — then on to ``steps`` if it is not there yet."""
    runners = [grpo, *nfts.values()]
    while grpo.steps < steps:
        min(runners, key=lambda r: r.spent).step()
    grpo.judge()
    wall_steps = {}
    for name, nft in nfts.items():
        while nft.spent < grpo.spent:
            nft.step()
        wall_steps[name] = nft.steps
        nft.judge()
        while nft.steps < steps:
            nft.step()
        nft.judge()
    return wall_steps


def measure(args) -> dict:
    """Every seed: compile and interleaved step timing, then FlowGRPO for ``steps`` raced against NFT on one
    clock (``race``), judged every ``every`` steps and at the equal-wall point."""
    flux, scorer = jp.cards.load("flux-t2i"), jp.cards.load("digit-scorer")
    spec = PromptSpec()
    reward = scorer_reward(scorer, spec.terms)
    lrs = [float(v) for v in args.nft_lr.split(",")]
    configs = {
        f"NFT lr {np.format_float_scientific(lr, trim='-', exp_digits=1)}": nft_config(
            lr, args.nft_beta, args.nft_ema_end, args.nft_adv_clip, args.nft_ema_ramp
        )
        for lr in lrs
    }
    nft = next(iter(configs.values()))
    methods = {
        "FlowGRPO": FlowGRPO(flux, reward, GRPO),
        **{name: DiffusionNFT(flux, reward, c) for name, c in configs.items()},
    }
    settings = EvalSettings(
        samples=8 if args.quick else 200,
        diversity_prompts=2 if args.quick else 10,
        diversity_seeds=2 if args.quick else 6,
    )
    evaluate = lambda card: judge(card, scorer, spec, settings)
    steps, every = (4, 2) if args.quick else (args.steps, args.every)
    seeds = [int(s) for s in args.seeds.split(",")]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    print("judging the bundled card ...", flush=True)
    base = evaluate(flux)
    results = {}
    for seed in seeds:
        cost = step_costs(
            methods, prompt_batches(flux, spec, PROMPTS_PER_STEP, 10_000 + seed), seed, 2 if args.quick else args.rounds
        )
        print(f"seed {seed}: s/step " + ", ".join(f"{name} {c['step_s']:.3f}" for name, c in cost.items()), flush=True)
        print(f"seed {seed}: FlowGRPO {steps} steps and NFT in the same time, raced ...", flush=True)
        runners = {
            name: Runner(m, prompt_batches(flux, spec, PROMPTS_PER_STEP, seed), seed, every, evaluate)
            for name, m in methods.items()
        }
        wall_steps = race(runners["FlowGRPO"], {name: runners[name] for name in configs}, steps)
        print(f"seed {seed}: steps in FlowGRPO's {runners['FlowGRPO'].spent:.1f} s: {wall_steps}", flush=True)
        results[str(seed)] = {
            "cost": cost,
            "wall_steps": wall_steps,
            "runs": {name: r.record() for name, r in runners.items()},
        }
    header = [
        (
            "`python benchmarks/nft_vs_grpo.py`: `flux-t2i`, digit-scorer reward (digit + stroke + position + "
            f"brightness), full compositional prompts, P = {PROMPTS_PER_STEP} prompts × K = {GROUP} samples per step "
            f"(one rollout), 8 denoising steps, the same prompt stream and step keys for both methods, training seeds "
            f"{', '.join(map(str, seeds))}. FlowGRPO: SDE on steps 0–3 of 8, lr 1e-4, β (KL) 0.04, clip 1e-3 (the "
            f"README's). DiffusionNFT: ODE rollouts, lr {' and '.join(name.split()[-1] for name in configs)} (one run each), β {nft.beta:g}, adv clip {nft.group.adv_clip:g}, "
            f"EMA decay {nft.ema.start:g} → {nft.ema.end:g} over {nft.ema.ramp_steps} steps, σ {nft.noise.sampling} on "
            f"[{nft.noise.min:g}, {nft.noise.max:g}]. Judged on {settings.samples} held-out full prompts (all right) and "
            f"plain digits (digit accuracy) at guidance 1, eval seed {settings.seed}, each read twice: by the "
            'digit-scorer (the reward\'s own weights; "scorer") and by the independent evaluators (digit-classifier + '
            'analytic readers, sharing no weights with the reward; "independent"); diversity over '
            f"{settings.diversity_prompts} prompts × {settings.diversity_seeds} seeds. Train s: sum of the warm step "
            "times (compiles and evaluations excluded). The runs of a seed are raced on one clock (whichever has "
            "spent the least step time steps next, so load from other jobs hits all alike); equal wall time: NFT's step "
            "count when its summed step time first reaches FlowGRPO's for all its steps. Warm s / step: medians of "
            "the runs' own steps, and of steps interleaved one by one before them (throwaway states)."
        ),
        "",
        *[f"- {k}: {v}" for k, v in machine_info().items()],
        f"- load average (1 min) before / after: {load:.2f} / {os.getloadavg()[0]:.2f}",
        f"- whole benchmark: {time.perf_counter() - start:.0f} s",
    ]
    return {
        "steps": steps,
        "every": every,
        "header": header,
        "base": base,
        "results": results,
        "nft_runs": list(configs),
    }


def nft_runs(raw: dict) -> list[str]:
    """The NFT runs' names (a raw file from before several NFT runs has one, ``"NFT"``)."""
    return raw.get("nft_runs", ["NFT"])


def wall_steps(result: dict, name: str) -> int:
    """NFT run ``name``'s equal-wall step count in one seed's result."""
    wall = result["wall_steps"]
    return wall if isinstance(wall, int) else wall[name]


def moving(values, window: int) -> np.ndarray:
    """Trailing moving mean (shorter windows at the start), same length as ``values``."""
    values = np.asarray(values, np.float64)
    c = np.cumsum(np.insert(values, 0, 0.0))
    n = np.minimum(np.arange(1, len(values) + 1), window)
    return (c[1:] - c[np.arange(1, len(values) + 1) - n]) / n


def _mean_over_seeds(raw: dict, name: str, field: str, n: int) -> np.ndarray:
    return np.mean([r["runs"][name][field][:n] for r in raw["results"].values()], axis=0)


def checkpoints(raw: dict, name: str) -> list[int]:
    """The regular (every ``--every`` steps) evaluations of method ``name`` that every seed has."""
    found = [{int(s) for s in r["runs"][name]["evals"]} for r in raw["results"].values()]
    return sorted(m for m in set.intersection(*found) if m % raw["every"] == 0)


def plot(raw: dict, path: pathlib.Path) -> None:
    """Reward (moving mean 20, mean over seeds) vs rollouts and vs warm training seconds; all right at checkpoints."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    seeds = list(raw["results"])
    for name, color in zip(
        ["FlowGRPO", *nft_runs(raw)], ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    ):
        n = min(len(r["runs"][name]["rewards"]) for r in raw["results"].values())
        reward = moving(_mean_over_seeds(raw, name, "rewards", n), 20)
        wall = np.cumsum(_mean_over_seeds(raw, name, "times", n))
        label = name.replace("NFT", "DiffusionNFT")
        axes[0].plot(np.arange(1, n + 1), reward, color=color, label=label)
        axes[1].plot(wall, reward, color=color, label=label)
        marks = checkpoints(raw, name)
        right = [
            np.mean([r["runs"][name]["evals"][str(m)]["all_right"] for r in raw["results"].values()]) for m in marks
        ]
        axes[2].plot(
            [0] + marks, 100 * np.array([raw["base"]["all_right"]] + right), marker="o", color=color, label=label
        )
    grpo_budget = np.mean([sum(r["runs"]["FlowGRPO"]["times"]) for r in raw["results"].values()])
    axes[1].axvline(grpo_budget, color="gray", ls=":", lw=1, label="FlowGRPO's budget")
    axes[0].set(
        title="train reward (moving mean 20) vs rollouts",
        xlabel="rollouts (steps of P·K = 16 samples)",
        ylabel="reward",
    )
    axes[1].set(title="train reward vs training wall time", xlabel="seconds (warm steps, compiles excluded)")
    axes[2].set(title="held-out all attributes right (scorer), %", xlabel="rollouts (steps)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"DiffusionNFT vs FlowGRPO on flux-t2i, mean over seed(s) {', '.join(seeds)}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _cell(values: list[float], fmt: Callable[[float], str]) -> str:
    """The mean over seeds, and each seed's value when there are several."""
    text = fmt(float(np.mean(values)))
    return text if len(values) == 1 else f"{text} ({' / '.join(fmt(v) for v in values)})"


def independent(evaluation: dict, name: str) -> float | None:
    """The independent evaluators' reading of ``evaluation[name]`` (``None`` in a raw file from before they existed)."""
    return evaluation.get("independent", {}).get(name)


def _judged_cells(evals: list[dict], name: str, fmt: Callable[[float], str]) -> str:
    """Two table cells of ``name`` over seeds: the scorer's reading, then the independent evaluators' (``—``
    where it was not recorded)."""
    read = [independent(e, name) for e in evals]
    other = "—" if None in read else _cell(read, fmt)
    return f"{_cell([e[name] for e in evals], fmt)} | {other}"


def table(raw: dict) -> list[str]:
    """The summary table (base, FlowGRPO, NFT at equal rollouts, NFT at equal wall time) and the checkpoint table."""
    steps, results, base, names = raw["steps"], list(raw["results"].values()), raw["base"], nft_runs(raw)
    pct = lambda v: f"{100 * v:.1f}%"
    f3 = lambda v: f"{v:.3f}"

    def final_reward(rewards: list[float], n: int) -> float:
        return float(np.mean(rewards[n - max(1, n // 10) : n]))

    def first_reward(name: str) -> str:
        return f3(float(np.mean([r["runs"][name]["rewards"][: max(1, steps // 10)] for r in results])))

    def row(label: str, name: str, ns: list[int]) -> str:
        evals = [r["runs"][name]["evals"][str(n)] for r, n in zip(results, ns)]
        wall = [sum(r["runs"][name]["times"][:n]) for r, n in zip(results, ns)]
        rew = [final_reward(r["runs"][name]["rewards"], n) for r, n in zip(results, ns)]
        div = [e["diversity"] for e in evals]
        return (
            f"| {label} | {_cell(ns, lambda v: f'{v:g}')} | {_cell([n * PROMPTS_PER_STEP * GROUP for n in ns], lambda v: f'{v:g}')} | "
            f"{_cell(wall, lambda v: f'{v:.1f}')} | {_judged_cells(evals, 'all_right', pct)} | "
            f"{_judged_cells(evals, 'digit_accuracy', pct)} | {_cell(div, f3)} ({100 * (np.mean(div) / base['diversity'] - 1):+.1f}%) | "
            f"{_cell(rew, f3)} |"
        )

    lines = [
        "| run | steps (rollouts) | samples | train s | all right, full prompts (scorer) | all right (independent) | "
        "digit accuracy, plain prompts (scorer) | digit accuracy (independent) | diversity (change) | "
        "final train reward (last 10% of steps) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| base `flux-t2i` | 0 | 0 | 0 | {_judged_cells([base], 'all_right', pct)} | {_judged_cells([base], 'digit_accuracy', pct)} | "
        f"{base['diversity']:.3f} | "
        f"first 10%: {', '.join(f'{name} {first_reward(name)}' for name in ['FlowGRPO', *names])} |",
        row("FlowGRPO", "FlowGRPO", [steps] * len(results)),
    ]
    for name in names:
        label = name.replace("NFT", "DiffusionNFT")
        lines += [
            row(f"{label}, equal rollouts", name, [steps] * len(results)),
            row(f"{label}, equal wall time", name, [wall_steps(r, name) for r in results]),
        ]
    cost = lambda name: _cell([r["cost"][name]["step_s"] for r in results], f3)
    in_run = lambda name: _cell([float(np.median(r["runs"][name]["times"])) for r in results], f3)
    lines += [
        "",
        "| method | warm s / step, median in the run | warm s / step, median of interleaved steps | first call of the "
        "process, s (compile + 1 step) |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {name.replace('NFT', 'DiffusionNFT')} | {in_run(name)} | {cost(name)} | {results[0]['cost'][name]['first_call_s']:.1f} |"
        for name in ["FlowGRPO", *names]
    ]
    marks = [m for m in checkpoints(raw, names[0]) if m % max(raw["every"], 100) == 0 or m == steps]  # a readable width
    head = " | ".join(f"{m}" for m in marks)
    lines += [
        "",
        f"| held-out all right / digit accuracy (scorer) / diversity after … steps | 0 | {head} |",
        "|---|" + "---:|" * (len(marks) + 1),
    ]
    for name in ["FlowGRPO", *names]:
        label = name.replace("NFT", "DiffusionNFT")
        cells = [
            f"{100 * np.mean([r['runs'][name]['evals'][str(m)]['all_right'] for r in results]):.1f} / "
            f"{100 * np.mean([r['runs'][name]['evals'][str(m)]['digit_accuracy'] for r in results]):.1f}% / "
            f"{np.mean([r['runs'][name]['evals'][str(m)]['diversity'] for r in results]):.2f}"
            if m in checkpoints(raw, name)
            else "—"
            for m in marks
        ]
        base_cell = f"{100 * base['all_right']:.1f} / {100 * base['digit_accuracy']:.1f}% / {base['diversity']:.2f}"
        lines.append(f"| {label} | {base_cell} | {' | '.join(cells)} |")
    return lines


def sweep(args) -> None:
    """NFT alone over ``SWEEP`` for ``--steps`` steps, one seed: train reward first / last 10%, held-out all
    right, digit accuracy and diversity (100 prompts, 6 × 6 diversity). Prints a table."""
    flux, scorer = jp.cards.load("flux-t2i"), jp.cards.load("digit-scorer")
    spec = PromptSpec()
    reward = scorer_reward(scorer, spec.terms)
    settings = EvalSettings(
        samples=8 if args.quick else 100,
        diversity_prompts=2 if args.quick else 6,
        diversity_seeds=2 if args.quick else 6,
    )
    steps = 4 if args.quick else args.steps
    base = judge(flux, scorer, spec, settings)
    print(
        f"base: all right {100 * base['all_right']:.1f}% (independent {100 * base['independent']['all_right']:.1f}%), "
        f"digit {100 * base['digit_accuracy']:.1f}% (independent {100 * base['independent']['digit_accuracy']:.1f}%), "
        f"diversity {base['diversity']:.3f}"
    )
    print(
        "| lr | β | EMA end | adv clip | reward first → last 10% | all right (scorer / independent) "
        "| digit accuracy (scorer / independent) | diversity | s / step |"
    )
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    grid = parse_grid(args.grid) if args.grid else SWEEP
    for point in grid[:1] if args.quick else grid:
        method = DiffusionNFT(flux, reward, nft_config(**point))
        out = train(
            method,
            prompt_batches(flux, spec, PROMPTS_PER_STEP, 0),
            steps,
            0,
            lambda card: judge(card, scorer, spec, settings),
        )
        e, r, n = out["evals"][str(steps)], out["rewards"], max(1, steps // 10)
        print(
            f"| {point['learning_rate']:g} | {point['beta']:g} | {point['ema_end']:g} | {point.get('adv_clip', 2.0):g} | {np.mean(r[:n]):.3f} → {np.mean(r[-n:]):.3f} | "
            f"{100 * e['all_right']:.1f}% / {100 * e['independent']['all_right']:.1f}% | "
            f"{100 * e['digit_accuracy']:.1f}% / {100 * e['independent']['digit_accuracy']:.1f}% | {e['diversity']:.3f} | "
            f"{np.median(out['times'][1:] or out['times']):.3f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 steps, tiny evaluation, prints only")
    parser.add_argument("--steps", type=int, default=300, help="steps (rollouts) of each method at equal rollouts")
    parser.add_argument("--every", type=int, default=50, help="steps between held-out evaluations")
    parser.add_argument("--seeds", default="0,1", help="training seeds (prompt stream and step keys), comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved warm steps per method for the s/step timing")
    parser.add_argument("--nft-lr", default="1e-4,5e-5", help="NFT learning rate(s), comma-separated: one NFT run each")
    parser.add_argument("--nft-beta", type=float, default=1.0)
    parser.add_argument("--nft-ema-end", type=float, default=0.5)
    parser.add_argument("--nft-ema-ramp", type=int, default=100)
    parser.add_argument("--nft-adv-clip", type=float, default=2.0)
    parser.add_argument("--grid", help="--sweep's points, 'lr,beta,ema_end[,adv_clip];...' (default: SWEEP)")
    parser.add_argument("--sweep", action="store_true", help="only the NFT settings sweep (prints a table)")
    parser.add_argument("--raw", type=pathlib.Path, default=RAW, help="where the raw results are written")
    parser.add_argument(
        "--replot", type=pathlib.Path, help="only rebuild the table and plot from this raw results file"
    )
    args = parser.parse_args()
    if args.sweep:
        return sweep(args)
    if args.replot:
        raw = json.loads(args.replot.read_text())
    else:
        raw = measure(args)
        if not args.quick:
            args.raw.parent.mkdir(parents=True, exist_ok=True)
            args.raw.write_text(json.dumps(raw))
    body = "\n".join([f"## {SECTION}", "", *raw["header"], "", *table(raw), "", f"![NFT vs FlowGRPO]({PLOT.name})"])
    print(body)
    path = (
        pathlib.Path(tempfile.mkdtemp()) / PLOT.name if args.quick else PLOT
    )  # a smoke test draws, but not over the plot
    plot(raw, path)
    if args.quick:
        print(f"\nplot in {path}")
    else:
        write_section(RESULTS, SECTION, body)
        print(f"\nwrote the {SECTION} section of {RESULTS} and {PLOT}")


if __name__ == "__main__":
    main()
