"""Re-judge finished digits RL runs: the starting card and the trained one, by the reward and by judges independent of it.

A ``jaxpipe train`` report judges its card with the evaluation of its time. This script rebuilds the
run's evaluation from its ``report.json`` (the same prompt distribution, evaluation settings and
sampling steps, through the same ``jaxpipe.digits.runs`` builder) and judges the bundled starting card
and the trained card in the run folder again: by the ``digit-scorer`` (the reward's own weights) and by
the independent evaluators (the ``digit-classifier`` card and the analytic readers). It writes
``judged.json`` beside the report and prints one line per headline number: scorer and independent,
before -> after, and the runs where the scorer's gain is not seen by the independent judges.

    python benchmarks/rejudge.py out/rl/flow_grpo out/rl/unified_joint ...   # ~1 min per run on 2 CPU cores
    python benchmarks/rejudge.py --reuse out/rl/*/                           # the table again from judged.json

Each run also becomes rows of the ``rejudge`` section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jaxpipe as jp
from jaxpipe.compilation import enable_cache
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import runs
from jaxpipe.digits.evaluation import EvalSettings
from jaxpipe.training import FlowGRPOConfig, JointMultiExpertRLConfig, Sampling
from jaxpipe.training.methods.mot_rl import SharedMoTRLConfig
from jaxpipe.training.methods.nft import DiffusionNFTConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling report module, however this runs
import report  # noqa: E402


def _spec(settings: dict) -> runs.PromptSpec:
    prompts = settings["prompts"]
    prefer = ",".join(f"{name}={word}" for name, word in prompts["prefer"].items())
    return runs.PromptSpec(
        terms=tuple(prompts["terms"]), mention=prompts["mention"], prefer=runs.parse_preferences(prefer)
    )


def rebuild(report: dict):
    """``(run, starting card)``: the ``Run`` whose evaluation and headline judged ``report``, and its bundled start."""
    settings, method = report["settings"], report["method"]
    spec, evaluation = _spec(settings), EvalSettings(**settings["evaluation"])
    scorer = jp.cards.load("digit-scorer")
    steps = settings["config"].get("num_steps", 8)
    sampling = dict(num_steps=steps)
    if method == "flow-grpo":
        card = jp.cards.load(settings["model"])
        config = FlowGRPOConfig(sampling=Sampling(sampler="sde", **sampling))
        return runs.flow_grpo_run(card, scorer, config, spec, evaluation=evaluation), card
    if method == "nft":
        card = jp.cards.load(settings["model"])
        config = DiffusionNFTConfig(sampling=Sampling(**sampling))
        return runs.nft_run(card, scorer, config, spec, evaluation=evaluation), card
    if method.startswith("unified"):
        card = jp.cards.load(settings["model"])
        return runs.unified_run(card, scorer, JointMultiExpertRLConfig(), spec, evaluation=evaluation), card
    if method.startswith("joint"):
        card = digit_cards.multi_expert(jp.cards.load("unified"), settings["refiners"])
        return runs.joint_run(card, scorer, JointMultiExpertRLConfig(), spec, evaluation=evaluation), card
    if method == "mot":
        card = jp.cards.load(settings["model"])
        return runs.mot_run(card, scorer, SharedMoTRLConfig(), spec, evaluation=evaluation), card
    raise ValueError(f"no evaluation to rebuild for a {method!r} run")


def rejudge(folder: Path, cache: dict) -> dict:
    """Judge the run in ``folder`` before and after (``cache``: starting card id -> its judgement, reused)."""
    report = json.loads((folder / "report.json").read_text())
    run, start = rebuild(report)
    key = json.dumps(
        [
            report["method"].split(" (")[0],
            report["settings"]["prompts"],
            report["settings"]["evaluation"],
            report["settings"].get("refiners"),
        ]
    )
    t0 = time.perf_counter()
    if key not in cache:
        cache[key] = run.evaluate(start)
    before = cache[key]
    after = run.evaluate(jp.cards.load(folder))
    judged = {
        "run": report["method"],
        "steps": report["steps"],
        "headline": run.headline(before, after),
        "diversity": {
            "before": before["diversity"],
            "after": after["diversity"],
            "relative_change": (after["diversity"] - before["diversity"]) / before["diversity"],
        },
        "before": before,
        "after": after,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (folder / "judged.json").write_text(json.dumps(judged, indent=2) + "\n")
    return judged


def lines(folder: Path, judged: dict) -> list[str]:
    out = [
        f"== {folder} ({judged['run']}, {judged['steps']} steps; diversity "
        f"{100 * judged['diversity']['relative_change']:+.1f}%)"
    ]
    for name, value in judged["headline"].items():
        if isinstance(value, dict) and value.get("before") is not None and "change" in value:
            out.append(
                f"  {name:44s} {100 * value['before']:5.1f} -> {100 * value['after']:5.1f}% ({100 * value['change']:+.1f})"
            )
        elif isinstance(value, str):
            out.append(f"  {value}")
    return out


def table(judged: dict[Path, dict]) -> str:
    """The ``rejudge`` section: one row per headline number of each run, scorer and independent side by side."""
    rows = [
        "| run | steps | measure | scorer: before → after | independent: before → after | scorer gain − independent gain | diversity | reward vs independent |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for folder, j in judged.items():
        head = j["headline"]
        verdict = "**reward hacking**" if head["reward_vs_independent"].startswith("REWARD HACKING") else "agree"
        for name, value in head.items():
            twin = head.get(f"{name} (independent)")
            if twin is None or not isinstance(value, dict) or value.get("change") is None:
                continue
            rows.append(
                f"| `{folder.name}` ({j['run']}) | {j['steps']} | {name} | {100 * value['before']:.1f} → {100 * value['after']:.1f}% "
                f"| {100 * twin['before']:.1f} → {100 * twin['after']:.1f}% | {100 * (value['change'] - twin['change']):+.1f} "
                f"| {100 * j['diversity']['relative_change']:+.1f}% | {verdict} |"
            )
    info = ", ".join(f"{k} {v}" for k, v in report.machine_info().items())
    return (
        "## rejudge\n\nThe README's RL runs judged before and after by the digit-scorer (the reward) and by the "
        "independent evaluators (digit-classifier + analytic readers), 200 prompts at guidance 1, eval seed 0 "
        f"(`python benchmarks/rejudge.py DIR ...`). A gap above {100 * runs.HACKING_GAP:.0f} points is flagged as "
        f"reward hacking.\n\n{info}\n\n" + "\n".join(rows) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "folders", nargs="+", type=Path, help="run folders written by jaxpipe train (report.json + card)"
    )
    parser.add_argument("--reuse", action="store_true", help="read each folder's judged.json instead of judging again")
    args = parser.parse_args()
    enable_cache()
    cache: dict = {}
    judged = {}
    for folder in args.folders:
        folder = Path(folder)
        reuse = args.reuse and (folder / "judged.json").is_file()
        judged[folder] = json.loads((folder / "judged.json").read_text()) if reuse else rejudge(folder, cache)
        print("\n".join(lines(folder, judged[folder])), flush=True)
    report.write_section(report.RESULTS, "rejudge", table(judged))


if __name__ == "__main__":
    main()
