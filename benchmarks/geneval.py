"""GenEval on the shapes world: the base ``shapes-t2i`` card against the official RL recipes trained on it.

The contenders are the named presets (``jaxpipe.training.presets``) as their official configs run them, but for
the prompts per step a 2-core machine can render (4 × K 24 = 96 images): FlowGRPO ``geneval`` (CFG in the
policy at the card's served guidance), FlowGRPO-Fast ``fast-nocfg`` (guidance 1, SDE on 2 steps) and
DiffusionNFT ``geneval`` (CFG-free), and joint refiner + generator RL (UnifiedRL on ``shapes-unified``, its
generator half the ``fast-nocfg`` recipe). All train on the same prompt stream (train-split prompts, the test
prompts left out: none names a held-out colour-shape pair) with the same step keys, for ``--steps`` steps, so at
equal images seen, from ``--reward``: ``geneval`` (FlowGRPO's rule-based GenEval reward on the judge's
detections, ``shapes.rewards.geneval_reward``) or ``judge`` (the fraction of the judge's checks passed).

Each card is judged as GenEval's table is (``shapes.evaluation.geneval``): per category, the fraction of images
right by GenEval's rule (at least the named objects; counting exact) with its 95% interval, ``overall`` the
mean of the six; the strict rule (exactly the named objects, nothing else) beside it; at least
``--min-images`` images per category and split; on the test prompts and on the held-out colour-shape pairs,
at the served guidance and at 1. The base card is judged over ``--base-seed-sets`` sets of generation seeds
(its own spread); a method's cells are the mean ± half the range over its training seeds. Along each run the
EMA evaluation card is judged every ``--eval-every`` steps (the accuracy curves against images seen and
wall-clock), and before it the gradient signal-to-noise of its configuration is measured
(``training.gradient_noise``, 4 rollouts at the base weights).

    python benchmarks/geneval.py                 # RESULTS.md section + docs/img/geneval_curves.png
    python benchmarks/geneval.py --quick         # smoke test: 2 steps, few images, prints only
    python benchmarks/geneval.py --grid          # only docs/img/shapes_grid.png: the base card on one prompt per category

Raw results go to ``out/benchmarks/geneval.json`` (rewritten after every run: an interrupted sweep keeps what it did).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.shapes import evaluation, grammar
from jaxpipe.shapes.runs import REWARDS, training_prompts
from jaxpipe.training import gradient_noise, presets
from jaxpipe.training.fit import fit
from jaxpipe.training.methods.flow_grpo import FlowGRPO
from jaxpipe.training.methods.joint_rl import UnifiedRL, UnifiedRLConfig
from jaxpipe.training.methods.nft import DiffusionNFT

SECTION = "geneval"
HERE = pathlib.Path(__file__).resolve().parent
PLOT = HERE.parent / "docs" / "img" / "geneval_curves.png"
RAW = HERE.parent / "out" / "benchmarks" / "geneval.json"
NUM_STEPS = 8
"""Sampling steps every card is judged at (the card's served default)."""


PRESET_OF = {
    "flow-grpo": ("flow-grpo", "geneval"),
    "flow-grpo-fast": ("flow-grpo", "fast-nocfg"),
    "nft": ("nft", "geneval"),
    "unified-rl": ("flow-grpo", "fast-nocfg"),  # its generator half
}
"""Each contender's preset ``(method, name)``."""
CONTENDERS = tuple(PRESET_OF)


def contender(name: str, card, unified, reward, prompts_per_step: int):
    """``(start card, trainer, preset)`` of contender ``name``."""
    if name not in PRESET_OF:
        raise ValueError(f"unknown contender {name!r}; choose from {CONTENDERS}")
    preset = presets.get(*PRESET_OF[name], prompts_per_step=prompts_per_step)
    if name == "unified-rl":
        generator = dataclasses.replace(preset.config, eval_ema=None)
        return unified, UnifiedRL(unified, reward, UnifiedRLConfig(generator=generator)), preset
    trainer = FlowGRPO if preset.method == "flow-grpo" else DiffusionNFT
    return card, trainer(card, reward, preset.config), preset


def judge_card(card, args, guidances, *, seed_set: int = 0, splits=grammar.SPLITS) -> dict:
    """``{str(guidance): {split: geneval table}}`` and the seconds it took."""
    start = time.perf_counter()
    out = {
        str(g): {
            split: evaluation.geneval(
                card,
                split=split,
                prompts=args.prompts,
                samples=2,
                min_images=args.min_images,
                seed_set=seed_set,
                num_steps=NUM_STEPS,
                guidance=g,
            )
            for split in splits
        }
        for g in guidances
    }
    out["seconds"] = time.perf_counter() - start
    return out


def _point(result: dict, served: str) -> dict:
    """A curve point: overall by GenEval's rule and by the strict rule at the served guidance, both splits."""
    return {
        split: {"overall": result[served][split]["overall"], "strict": result[served][split]["strict"]["overall"]}
        for split in grammar.SPLITS
    }


def train(name: str, seed: int, card, unified, pool, args, served: float) -> dict:
    """One contender's run: its gradient signal-to-noise, the curve every ``--eval-every`` steps, the final table."""
    start_card, method, preset = contender(name, card, unified, REWARDS[args.reward], args.prompts_per_step)
    batches = pool.batches(start_card, args.prompts_per_step, seed=seed)
    first = next(batches)
    batches = itertools.chain([first], batches)
    noise = gradient_noise.measure(method, first, jax.random.fold_in(jax.random.key(seed), 2**31 - 1))
    print(f"{name} seed {seed}: {noise.message()}", flush=True)
    evaluated = getattr(method, "eval_card", method.card)
    state, history, curve, seconds = method.init(), [], [], 0.0
    chunks = list(range(0, args.steps, args.eval_every)) + [args.steps]
    for begin, end in zip(chunks, chunks[1:]):
        started = time.perf_counter()
        state, rows = fit(
            method.step,
            state,
            batches,
            steps=end - begin,
            key=jax.random.fold_in(jax.random.key(seed), begin),
            desc=f"{name} seed {seed} steps {begin}-{end}",
            progress=not args.quick,
        )
        jax.block_until_ready(state)
        seconds += time.perf_counter() - started
        history += rows
        if end < args.steps:
            judged = judge_card(evaluated(state), args, [served])
            curve.append(
                {"step": end, "images": end * preset.images_per_step, "seconds": seconds, **_point(judged, str(served))}
            )
            print(f"  step {end}: {curve[-1]}", flush=True)
    result = judge_card(evaluated(state), args, args.guidance)
    curve.append(
        {
            "step": args.steps,
            "images": args.steps * preset.images_per_step,
            "seconds": seconds,
            **_point(result, str(served)),
        }
    )
    result.update(
        rewards=[row["reward_mean"] for row in history],
        train_seconds=seconds,
        images_per_step=preset.images_per_step,
        gradient_snr=noise.to_json(),
        curve=curve,
        preset=f"{preset.method} {preset.name}",
    )
    return result


def measure(args, raw: dict) -> dict:
    started = time.perf_counter()
    card = jp.cards.load(args.card)
    unified = jp.cards.load(args.unified_card) if "unified-rl" in args.methods else None
    served = float(card.spec.loops[0].config.guidance)
    pool = training_prompts(args.prompts)
    raw.setdefault("runs", {})
    if "base" not in raw:
        raw["base"] = {str(s): judge_card(card, args, args.guidance, seed_set=s) for s in args.base_seed_sets}
        _save(raw, args)
    for seed in args.seeds:
        for name in args.methods:
            if str(seed) in raw["runs"].get(name, {}):
                continue  # done in an earlier, interrupted sweep
            result = train(name, seed, card, unified, pool, args, served)
            raw["runs"].setdefault(name, {})[str(seed)] = result
            _save(raw, args)
            top = result[str(served)]
            print(
                f"{name} seed {seed}: overall {top['train']['overall']:.3f} (test) {top['heldout']['overall']:.3f} "
                f"(held out) at guidance {served:g}, trained in {result['train_seconds']:.0f} s",
                flush=True,
            )
    machine = machine_info()
    command = (
        f"`python benchmarks/geneval.py --steps {args.steps} --seeds {' '.join(map(str, args.seeds))} "
        f"--methods {' '.join(args.methods)} --reward {args.reward}{' --resume' if args.resume else ''}`"
    )
    raw.setdefault("sittings", []).append(f"{command} ({time.perf_counter() - started:.0f} s)")
    raw["header"] = [
        f"Measured {machine['date']} on {machine['cpu']} ({machine['cores']} cores): "
        + "; then ".join(raw["sittings"])
        + " (a resumed sitting runs only what the raw results lack).",
        f"Every card judged at guidance {' and '.join(f'{g:g}' for g in args.guidance)} ({served:g} is the served one), "
        f"{NUM_STEPS} sampling steps, {args.prompts} prompts per category (single object and colours: all 12 seen / 6 "
        f"held-out pairs), at least {args.min_images} images per category and split; the base card over generation seed "
        f"sets {', '.join(map(str, args.base_seed_sets))}. RL: the presets at {args.prompts_per_step} prompts × K 24 = "
        f"{args.prompts_per_step * 24} images per step (the official runs: 48 prompts, 1,152 images), {args.steps} steps, "
        f"reward `{args.reward}`, from {len(pool)} train-split prompts (no test prompt, no held-out pair), the same "
        "prompt stream and step keys for every method of a seed; FlowGRPO and NFT are judged by their EMA evaluation "
        "weights (the presets' `eval_ema`), UnifiedRL by its last ones.",
    ]
    _save(raw, args)
    return raw


def _save(raw: dict, args) -> None:
    if not args.quick:
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps(raw))


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.0f}"
    return f"{100 * np.mean(values):.0f} ± {100 * (max(values) - min(values)) / 2:.0f}"


def table(raw: dict) -> list[str]:
    """Per guidance and split: rows base / methods, columns the categories by GenEval's rule, overall with its 95%
    interval (base: the interval of its first seed set; its cells the mean ± half the range over seed sets), strict."""
    lines = []
    base = list(raw["base"].values())
    guidances = [k for k in base[0] if k != "seconds"]
    for g in guidances:
        for split, title in (
            ("train", "test prompts (seen colour-shape pairs)"),
            ("heldout", "held-out colour-shape pairs"),
        ):
            lines += [
                f"**{title}, guidance {g}** — % right by GenEval's rule (mean ± half the range over seed sets / "
                "training seeds); overall's 95% interval; the strict rule (exactly the named objects) beside it",
                "",
                "| card | " + " | ".join(grammar.CATEGORIES) + " | overall | 95% interval | strict | diversity |",
                "|---" * (len(grammar.CATEGORIES) + 5) + "|",
            ]
            rows = {f"base shapes-t2i ({len(base)} seed sets)": base}
            rows |= {name: list(seeds.values()) for name, seeds in raw["runs"].items()}
            for name, results in rows.items():
                tables = [r[g][split] for r in results if g in r]
                if not tables:
                    continue
                cells = [_spread([t["accuracy"][c] for t in tables]) for c in grammar.CATEGORIES]
                low, high = np.mean([t["overall_interval"] for t in tables], axis=0)
                lines.append(
                    f"| {name} | " + " | ".join(cells) + f" | **{_spread([t['overall'] for t in tables])}** | "
                    f"{100 * low:.0f}–{100 * high:.0f} | {_spread([t['strict']['overall'] for t in tables])} | "
                    f"{np.mean([t['diversity'] for t in tables]):.2f} |"
                )
            lines.append("")
    lines += [
        "| method | preset | images / step | gradient SNR | reward, first 10 steps | reward, last 10 steps | train s / run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, seeds in raw["runs"].items():
        runs = list(seeds.values())
        first = np.mean([np.mean(r["rewards"][:10]) for r in runs])
        last = np.mean([np.mean(r["rewards"][-10:]) for r in runs])
        snrs = [r["gradient_snr"]["snr"] for r in runs]
        snr = f"{np.mean(snrs):.3g}" + (f" ± {(max(snrs) - min(snrs)) / 2:.2g}" if len(snrs) > 1 else "")
        lines.append(
            f"| {name} | {runs[0]['preset']} | {runs[0]['images_per_step']} | {snr} | {first:.3f} | {last:.3f} | "
            f"{np.mean([r['train_seconds'] for r in runs]):.0f} |"
        )
    return lines


def plot(raw: dict, path: pathlib.Path) -> None:
    """Overall by GenEval's rule at the served guidance against images seen, test and held-out, each method's
    mean over seeds (and its range), the base card's band over its seed sets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = list(raw["base"].values())
    served = max(k for k in base[0] if k != "seconds")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, split, title in zip(axes, grammar.SPLITS, ("test prompts", "held-out pairs")):
        values = [b[served][split]["overall"] for b in base]
        ax.axhspan(min(values), max(values) + 1e-3, color="grey", alpha=0.3, label="base (seed sets)")
        for name, seeds in raw["runs"].items():
            curves = [r["curve"] for r in seeds.values()]
            images = [0] + [p["images"] for p in curves[0]]
            ys = np.asarray([[np.mean(values)] + [p[split]["overall"] for p in c] for c in curves])
            ax.plot(images, ys.mean(0), marker="o", label=name)
            if len(ys) > 1:
                ax.fill_between(images, ys.min(0), ys.max(0), alpha=0.2)
        ax.set_title(f"{title}, guidance {served}", fontsize=10)
        ax.set_xlabel("images seen")
    axes[0].set_ylabel("GenEval overall (GenEval's rule)")
    axes[1].legend(fontsize=8)
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
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 steps, few images, prints only")
    parser.add_argument("--card", default="shapes-t2i", help="the base card: an id or a card folder")
    parser.add_argument("--unified-card", default="shapes-unified", help="the joint run's card: an id or a card folder")
    parser.add_argument("--methods", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    parser.add_argument("--reward", default="geneval", choices=sorted(REWARDS))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=50, help="judge the run's card every N steps (its curve)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--prompts-per-step", type=int, default=presets.PROMPTS_PER_STEP)
    parser.add_argument("--prompts", type=int, default=24, help="prompts per category")
    parser.add_argument("--min-images", type=int, default=100, help="images per category and split, at least")
    parser.add_argument("--base-seed-sets", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--guidance", type=float, nargs="+", default=None, help="default: the card's served one and 1")
    parser.add_argument("--raw", type=pathlib.Path, default=RAW)
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --raw, do the rest")
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
        args.steps, args.eval_every, args.seeds, args.prompts, args.min_images = 2, 1, [0], 1, 0
        args.prompts_per_step, args.base_seed_sets = 1, [0, 1]
    if args.guidance is None:
        served = float(jp.cards.load(args.card).spec.loops[0].config.guidance)
        args.guidance = list(dict.fromkeys([served, 1.0]))
    if args.replot:
        raw = json.loads(args.replot.read_text())
    else:
        raw = json.loads(args.raw.read_text()) if args.resume and args.raw.is_file() else {}
        raw = measure(args, raw)
    body = "\n".join(
        [f"## {SECTION}", "", *raw["header"], "", *table(raw), "", "![GenEval curves](../docs/img/geneval_curves.png)"]
    )
    print(body)
    path = pathlib.Path(tempfile.mkdtemp()) / PLOT.name if args.quick else PLOT
    plot(raw, path)
    if not args.quick:
        write_section(RESULTS, SECTION, body)
        print(f"\nwrote the {SECTION} section of {RESULTS} and {PLOT}")


if __name__ == "__main__":
    main()
