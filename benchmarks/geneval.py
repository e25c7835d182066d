"""GenEval on the shapes world: the base ``shapes-t2i`` and ``shapes-unified`` cards, FlowGRPO, DiffusionNFT and
joint refiner + generator RL (UnifiedRL), at equal rollouts and seeds.

FlowGRPO and DiffusionNFT train the bundled ``shapes-t2i`` card, UnifiedRL the bundled ``shapes-unified`` card
(``shapes-t2i``'s generator behind a refiner LM that may append up to 3 words; its generator half is the
FlowGRPO row's exact config), all from the analytic judge's reward (``jaxpipe.shapes.rewards.
judge_reward``: the fraction of the judge's checks a picture passes) on the same prompt stream (train-split
prompts of the six categories, drawn by the seed) and the same step keys, P = 4 prompts × K = 4 samples
per step, ``--steps`` steps. The judge always checks the ORIGINAL prompt; a unified card renders its
refinement of it (the refiner sampling at its temperature, 1), and what it appended is reported. The reward IS the evaluator here (no learned reward model: the judge has no
weights to hack, only its checks), so "reward" below is the judge's own partial score on the rollouts.
Each card is then judged like GenEval's table: every category's all-right accuracy and their mean
(``overall``) on the fixed test prompts (seen colour-shape pairs) and on the held-out pairs, ``--samples``
seeds per prompt, plus the diversity (mean pairwise L2 between the seeds of a prompt).

    python benchmarks/geneval.py                 # seeds 0 and 1: RESULTS.md section + docs/img/geneval_rewards.png
    python benchmarks/geneval.py --quick         # smoke test: 2 steps, 1 prompt per category, prints only
    python benchmarks/geneval.py --grid          # only docs/img/shapes_grid.png: the base card on one prompt per category

Raw results go to ``out/benchmarks/geneval.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
from collections import Counter

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.prompts import PromptSet
from jaxpipe.shapes import evaluation, grammar
from jaxpipe.shapes.rewards import judge_reward
from jaxpipe.training.fit import fit
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.flow_grpo import FlowGRPO
from jaxpipe.training.methods.joint_rl import UnifiedRL, UnifiedRLConfig
from jaxpipe.training.methods.nft import DiffusionNFT, DiffusionNFTConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling

SECTION = "geneval"
HERE = pathlib.Path(__file__).resolve().parent
PLOT = HERE.parent / "docs" / "img" / "geneval_rewards.png"
RAW = HERE.parent / "out" / "benchmarks" / "geneval.json"
PROMPTS_PER_STEP, GROUP, NUM_STEPS = 4, 4, 8


def methods(card, unified) -> dict:
    """The contenders, rolling out at guidance 1 (FlowGRPO's log-probs need it; NFT's default), as on the digits world:
    FlowGRPO and NFT on ``card``, UnifiedRL on ``unified`` (its generator half FlowGRPO's very config; the refiner
    at its defaults: 1 of K samples keeps the prompt as written, lr 1e-3, token clip 0.2, KL β 0.01)."""
    grpo = FlowGRPOConfig(
        group=Group(GROUP),
        beta=0.04,
        optimizer=Optimizer(1e-4),
        sampling=Sampling(num_steps=NUM_STEPS, sampler="sde", sde_window=(0, 4)),
    )
    nft = DiffusionNFTConfig(
        group=Group(GROUP, adv_clip=2.0), sampling=Sampling(num_steps=NUM_STEPS), optimizer=Optimizer(1e-4)
    )
    return {
        "flow-grpo": (card, FlowGRPO(card, judge_reward, grpo)),
        "nft": (card, DiffusionNFT(card, judge_reward, nft)),
        "unified-rl": (unified, UnifiedRL(unified, judge_reward, UnifiedRLConfig(generator=grpo))),
    }


def training_prompts(test_prompts: int, n: int = 4000) -> PromptSet:
    """The RL prompt pool: ``n`` train-split draws, the six categories equally (seed 100), less the test prompts of the
    categories with more than one thing (the one-thing categories have only 12 texts: all of them are test prompts)."""
    rng = np.random.default_rng(100)
    test = {
        p.text
        for c in grammar.CATEGORIES
        if c not in ("single_object", "colors")
        for p in grammar.prompt_set(c, test_prompts)
    }
    texts = [grammar.sample(grammar.CATEGORIES[i % 6], rng).text for i in range(n)]
    return PromptSet.from_list([t for t in dict.fromkeys(texts) if t not in test])


def judge_card(card, args) -> dict:
    """``{str(guidance): {split: geneval table}}`` at each judged guidance, and the seconds it took."""
    start = time.perf_counter()
    out = {
        str(g): {
            split: evaluation.geneval(
                card,
                split=split,
                prompts=args.prompts,
                samples=args.samples,
                num_steps=NUM_STEPS,
                guidance=g,
                progress=not args.quick,
            )
            for split in grammar.SPLITS
        }
        for g in args.guidance
    }
    out["seconds"] = time.perf_counter() - start
    return out


def appended(card, args, top: int = 8) -> dict:
    """What a unified card's refiner appends to the test prompts (the train split's geneval rows: the same prompts,
    seeds and so the same LM draws as its geneval renders, whatever the guidance or steps): the fraction of renders
    with extra words (overall and per category), the mean extra words, and the ``top`` commonest appended words and
    whole appendices."""
    rows = [
        (c, p.text, 1000 * i + j)
        for c in grammar.CATEGORIES
        for i, p in enumerate(grammar.prompt_set(c, args.prompts))
        for j in range(args.samples)
    ]
    refined = []
    for start in range(0, len(rows), 64):  # one denoise step: the refinement does not depend on the denoiser
        chunk = rows[start : start + 64]
        refined += jp.generate(card, [t for _, t, _ in chunk], seed=[s for *_, s in chunk], num_steps=1)["refined_text"]
    extra = [r.split()[len(t.split()) :] for (_, t, _), r in zip(rows, refined)]
    words = Counter(w for e in extra for w in e)
    tails = Counter(" ".join(e) for e in extra if e)
    return {
        "renders": len(rows),
        "with_extra_words": float(np.mean([bool(e) for e in extra])),
        "mean_extra_words": float(np.mean([len(e) for e in extra])),
        "by_category": {
            c: float(np.mean([bool(e) for e, (k, _, _) in zip(extra, rows) if k == c])) for c in grammar.CATEGORIES
        },
        "top_words": words.most_common(top),
        "top_appendices": tails.most_common(top),
    }


def measure(args) -> dict:
    started = time.perf_counter()
    card, unified = jp.cards.load(args.card), jp.cards.load(args.unified_card)
    pool = training_prompts(args.prompts)
    raw = {"header": [], "base": judge_card(card, args), "base_unified": judge_card(unified, args), "runs": {}}
    raw["base_unified"]["appended"] = appended(unified, args)
    for seed in args.seeds:
        for name, (start_card, method) in methods(card, unified).items():
            start = time.perf_counter()
            state, history = fit(
                method.step,
                method.init(),
                pool.batches(start_card, PROMPTS_PER_STEP, seed=seed),
                steps=args.steps,
                key=jax.random.key(seed),
                desc=f"{name} seed {seed}",
                progress=not args.quick,
            )
            seconds = time.perf_counter() - start
            trained = method.card(state)
            result = judge_card(trained, args)
            result.update(rewards=[row["reward_mean"] for row in history], train_seconds=seconds)
            if (
                "refined_tokens" in history[0]
            ):  # the joint run: its rollouts' rewrite lengths (<eos> counted) and rewards
                result.update(
                    refined_tokens=[row["refined_tokens"] for row in history],
                    reward_refined=[row["reward_refined"] for row in history],
                    reward_original=[row["reward_original"] for row in history],
                    appended=appended(trained, args),
                )
            raw["runs"].setdefault(name, {})[str(seed)] = result
            first = result[str(args.guidance[0])]
            print(
                f"{name} seed {seed}: overall {first['train']['overall']:.3f} (test) "
                f"{first['heldout']['overall']:.3f} (held out) at guidance {args.guidance[0]}, trained in {seconds:.0f} s",
                flush=True,
            )
    machine = machine_info()
    raw["header"] = [
        f"Measured {machine['date']} on {machine['cpu']} ({machine['cores']} cores), "
        f"`python benchmarks/geneval.py --steps {args.steps} --seeds {' '.join(map(str, args.seeds))}` "
        f"({time.perf_counter() - started:.0f} s in all).",
        f"Every card judged at guidance {' and '.join(map(str, args.guidance))}, {NUM_STEPS} steps, {args.prompts} prompts per category "
        f"(single object and colours: all 12 seen / 6 held-out pairs) × {args.samples} seeds. RL at guidance 1 "
        f"(FlowGRPO: SDE on steps 0–3 of 8, lr 1e-4, β 0.04; NFT: ODE rollouts, lr 1e-4, β 1, EMA 0 → 0.5; unified-rl: "
        f"`{args.unified_card}`, its generator half that FlowGRPO config, its refiner sampling up to 3 words at temperature 1 "
        "on 3 of each group's 4 samples, lr 1e-3, token clip 0.2, KL β 0.01): P = "
        f"{PROMPTS_PER_STEP} prompts × K = {GROUP} samples per step, {args.steps} steps, from {len(pool)} train-split prompts "
        "(the multi-object test prompts left out), the same prompt stream and "
        "step keys for every method of a seed; reward = the analytic judge's partial score of the ORIGINAL prompt (the "
        "evaluator itself: no learned reward model is involved, so there is no second score to set beside it). A unified "
        "card renders its refiner's continuation of each prompt (sampled at temperature 1, as served) and is judged "
        "against the prompt as given.",
    ]
    return raw


def _cell(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.0f}"
    return f"{100 * np.mean(values):.0f} ± {100 * (max(values) - min(values)) / 2:.0f}"


def table(raw: dict) -> list[str]:
    """GenEval's table for each guidance and split: rows base / methods (mean ± half the seed range), columns the categories."""
    lines = []
    guidances = [k for k in raw["base"] if k != "seconds"]
    for g in guidances:
        for split, title in (
            ("train", "test prompts (seen colour-shape pairs)"),
            ("heldout", "held-out colour-shape pairs"),
        ):
            lines += [
                f"**{title}, guidance {g}** — all-right accuracy, % (mean ± half the range over seeds)",
                "",
                "| card | " + " | ".join(grammar.CATEGORIES) + " | overall | diversity |",
                "|---" * (len(grammar.CATEGORIES) + 3) + "|",
            ]
            rows = {"base shapes-t2i": [raw["base"]]} | (
                {"base shapes-unified": [raw["base_unified"]]} if "base_unified" in raw else {}
            )
            rows |= {name: list(seeds.values()) for name, seeds in raw["runs"].items()}
            for name, results in rows.items():
                cells = [_cell([r[g][split]["accuracy"][c] for r in results]) for c in grammar.CATEGORIES]
                overall = _cell([r[g][split]["overall"] for r in results])
                diversity = np.mean([r[g][split]["diversity"] for r in results])
                lines.append(f"| {name} | " + " | ".join(cells) + f" | **{overall}** | {diversity:.2f} |")
            lines.append("")
    lines += ["| method | reward, first 10 steps | reward, last 10 steps | train s / run |", "|---|---|---|---|"]
    for name, seeds in raw["runs"].items():
        first = [np.mean(r["rewards"][:10]) for r in seeds.values()]
        last = [np.mean(r["rewards"][-10:]) for r in seeds.values()]
        seconds = np.mean([r["train_seconds"] for r in seeds.values()])
        lines.append(f"| {name} | {np.mean(first):.3f} | {np.mean(last):.3f} | {seconds:.0f} |")
    if "base_unified" not in raw:
        return lines
    lines += [
        "",
        "What the refiner appends to the test prompts (the train split's judged renders, the refinement its geneval "
        "renders drew): renders with extra words, mean extra words, the commonest appendices (count of renders)",
        "",
        "| card | renders with extra words | mean extra words | one-object prompts with extra words | commonest appendices |",
        "|---|---|---|---|---|",
    ]
    shown = {"base shapes-unified": [raw["base_unified"]]} if "base_unified" in raw else {}
    shown |= {
        f"{name} seed {seed}": [r]
        for name, seeds in raw["runs"].items()
        for seed, r in seeds.items()
        if "appended" in r
    }
    for name, (result,) in shown.items():
        a = result["appended"]
        one = np.mean([a["by_category"][c] for c in ("single_object", "colors")])
        tails = ", ".join(f"`{t}` {n}" for t, n in a["top_appendices"][:4]) or "none"
        lines.append(
            f"| {name} | {100 * a['with_extra_words']:.0f}% | {a['mean_extra_words']:.2f} | {100 * one:.0f}% | {tails} |"
        )
    return lines


def plot(raw: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, seeds in raw["runs"].items():
        curves = np.asarray([r["rewards"] for r in seeds.values()])
        window = max(1, min(10, curves.shape[1] // 5))
        smooth = np.asarray([np.convolve(c, np.ones(window) / window, mode="valid") for c in curves])
        steps = np.arange(window, curves.shape[1] + 1)
        ax.plot(steps, smooth.mean(0), label=name)
        ax.fill_between(steps, smooth.min(0), smooth.max(0), alpha=0.2)
    ax.set_xlabel("step (P×K = 16 rollouts each)")
    ax.set_ylabel("judge score of the rollouts")
    ax.set_title("shapes: RL on the analytic judge (mean and range over seeds)", fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def grid(card_id: str, path: pathlib.Path, seeds: int = 4) -> None:
    """One test prompt of each category (rows) drawn by the base card with ``seeds`` seeds (columns), at 4× size."""
    from PIL import Image, ImageDraw

    card = jp.cards.load(card_id)
    texts = [grammar.prompt_set(c, 3)[2].text for c in grammar.CATEGORIES]
    images = evaluation.render_prompts(card, [t for t in texts for _ in range(seeds)], list(range(seeds)) * len(texts))
    cell, label = 128, 210
    canvas = Image.new("RGB", (label + seeds * (cell + 4), len(texts) * (cell + 4)), "white")
    draw = ImageDraw.Draw(canvas)
    for row, text in enumerate(texts):
        draw.text((6, row * (cell + 4) + cell // 2 - 6), text, fill="black")
        for col in range(seeds):
            pixels = (np.asarray(images[row * seeds + col]) * 255).round().astype(np.uint8)
            canvas.paste(
                Image.fromarray(pixels).resize((cell, cell), Image.NEAREST),
                (label + col * (cell + 4), row * (cell + 4)),
            )
    canvas.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 steps, 1 prompt per category, prints only")
    parser.add_argument("--card", default="shapes-t2i", help="the base card: an id or a card folder")
    parser.add_argument(
        "--unified-card",
        default="shapes-unified",
        help="the joint run's card (a refiner LM in front of --card's generator): an id or a card folder",
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--prompts", type=int, default=24, help="prompts per category")
    parser.add_argument("--samples", type=int, default=2, help="seeds per prompt")
    parser.add_argument(
        "--guidance",
        type=float,
        nargs="+",
        default=None,
        help="the guidances every card is judged at (default: 1, the RL rollouts', and the card's own)",
    )
    parser.add_argument("--raw", type=pathlib.Path, default=RAW)
    parser.add_argument(
        "--replot", type=pathlib.Path, help="only rebuild the table and plot from this raw results file"
    )
    parser.add_argument(
        "--grid", action="store_true", help="only draw docs/img/shapes_grid.png (one prompt per category)"
    )
    args = parser.parse_args()
    if args.grid:
        grid(args.card, HERE.parent / "docs" / "img" / "shapes_grid.png")
        return
    if args.quick:
        args.steps, args.seeds, args.prompts, args.samples = 2, [0], 1, 2
    if args.guidance is None and not args.grid:
        args.guidance = list(dict.fromkeys([1.0, float(jp.cards.load(args.card).spec.loops[0].config.guidance)]))
    raw = json.loads(args.replot.read_text()) if args.replot else measure(args)
    if not args.quick and not args.replot:
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps(raw))
    body = "\n".join(
        [
            f"## {SECTION}",
            "",
            *raw["header"],
            "",
            *table(raw),
            "",
            "![RL reward curves](../docs/img/geneval_rewards.png)",
        ]
    )
    print(body)
    path = pathlib.Path(tempfile.mkdtemp()) / PLOT.name if args.quick else PLOT
    plot(raw, path)
    if not args.quick:
        write_section(RESULTS, SECTION, body)
        print(f"\nwrote the {SECTION} section of {RESULTS} and {PLOT}")


if __name__ == "__main__":
    main()
