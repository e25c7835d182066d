"""The DMD2-distilled ``flux-t2i-turbo`` against its teacher ``flux-t2i``: quality, diversity, speed per step count.

Rows: the teacher at its 8 steps (its default guidance 2, and guidance 1), the teacher cut to 2 and 1
steps (guidance 2), and the student at 2 and 1 steps (guidance 1, its default: the guidance is
distilled in). Per row, from ``quality.t2i_quality`` (``--samples`` random prompts): digit accuracy on
plain-digit prompts, digit accuracy and all-attributes-right on full compositional prompts, each judged by
the ``digit-scorer`` (the RL reward's own weights, "scorer") and by the independent evaluators
(``digit-classifier`` + analytic readers, sharing no weights with the scorer, "independent"); diversity (mean pairwise L2 distance between the images of one prompt across seeds, in
[0, 1] pixels, ``--div-prompts`` prompts × ``--div-seeds`` seeds, at the row's steps and guidance);
and the time per image of a batch of ``--batch`` images (compile excluded; CPU).

    python benchmarks/distill.py                          # 200 samples: writes RESULTS.md section `distill`
    python benchmarks/distill.py --student DIR            # a student card folder other than the bundled one
    python benchmarks/distill.py --quick                  # smoke test: 20 samples, prints only
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.digits import data as digits
from jaxpipe.digits import quality

SECTION = "distill"


def diversity(card, *, num_steps: int, guidance: float, prompts: int, seeds: int, seed: int = 0) -> float:
    """Mean pairwise L2 distance between ``seeds`` images of each of ``prompts`` random full prompts."""
    rng = np.random.default_rng([seed, 2])
    captions = []
    for _ in range(prompts):
        labels = [int(rng.integers(0, 10))] + [
            int(rng.integers(0, len(digits.ATTRIBUTE_WORDS[a]))) for a in digits.ATTRIBUTES
        ]
        captions.append(digits.caption(*labels))
    batch = [c for c in captions for _ in range(seeds)]
    images = np.asarray(
        jp.generate(card, batch, seed=[500_000 + i for i in range(len(batch))], num_steps=num_steps, guidance=guidance)[
            "image"
        ],
        np.float64,
    ).reshape(prompts, seeds, -1)
    dist = np.linalg.norm(images[:, :, None] - images[:, None, :], axis=-1)
    iu = np.triu_indices(seeds, k=1)
    return float(dist[:, iu[0], iu[1]].mean())


def seconds_per_image(card, *, num_steps: int, guidance: float, batch: int) -> float:
    """Wall time per image of one batch of ``batch`` prompts, after a warm-up call of the same shapes."""
    prompts = ["seven thick"] * batch
    seeds = list(range(batch))
    np.asarray(jp.generate(card, prompts, seed=seeds, num_steps=num_steps, guidance=guidance)["image"])
    start = time.perf_counter()
    np.asarray(jp.generate(card, prompts, seed=seeds, num_steps=num_steps, guidance=guidance)["image"])
    return (time.perf_counter() - start) / batch


def measure(rows, scorer, args) -> list[dict]:
    out = []
    for name, card, steps, guidance in rows:
        q = quality.t2i_quality(card, scorer, samples=args.samples, seed=args.seed, num_steps=steps, guidance=guidance)
        row = {
            "model": name,
            "steps": steps,
            "guidance": guidance,
            "digit_accuracy": q["digit_accuracy"],
            "digit_accuracy_compositional": q["digit_accuracy_compositional"],
            "all_right": q["all_attributes_correct"],
            "independent": {k: q["independent"][k] for k in ("digit_accuracy", "digit_accuracy_compositional")}
            | {"all_right": q["independent"]["all_attributes_correct"]},
            "diversity": diversity(
                card, num_steps=steps, guidance=guidance, prompts=args.div_prompts, seeds=args.div_seeds
            ),
            "ms_per_image": 1e3 * seconds_per_image(card, num_steps=steps, guidance=guidance, batch=args.batch),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def table(results: list[dict]) -> str:
    lines = [
        "| model | steps | guidance | digit acc (plain), scorer / independent | digit acc (compositional), scorer / "
        "independent | all-right, scorer / independent | diversity | ms / image |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ind = r["independent"]
        lines.append(
            f"| {r['model']} | {r['steps']} | {r['guidance']:g} | {r['digit_accuracy']:.3f} / {ind['digit_accuracy']:.3f} | "
            f"{r['digit_accuracy_compositional']:.3f} / {ind['digit_accuracy_compositional']:.3f} | "
            f"{r['all_right']:.3f} / {ind['all_right']:.3f} | {r['diversity']:.3f} | {r['ms_per_image']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--student", default="flux-t2i-turbo", help="the student card (bundled id or folder)")
    parser.add_argument("--teacher", default="flux-t2i")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--div-prompts", type=int, default=10)
    parser.add_argument("--div-seeds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64, help="images per timed batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="20 samples, 3x3 diversity, prints only")
    parser.add_argument("--no-write", action="store_true", help="print only, leave RESULTS.md alone")
    parser.add_argument("--json", default=None, help="also write the raw rows to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.div_prompts, args.div_seeds, args.batch, args.no_write = 20, 3, 3, 8, True
    teacher, student, scorer = jp.cards.load(args.teacher), jp.cards.load(args.student), jp.cards.load("digit-scorer")
    g = teacher.spec.loop(teacher.spec.recipe[0]).config.guidance
    n = teacher.spec.loop(teacher.spec.recipe[0]).config.num_steps
    rows = [
        (args.teacher, teacher, n, g),
        (args.teacher, teacher, n, 1.0),
        (args.teacher, teacher, 2, g),
        (args.teacher, teacher, 1, g),
        (student.model_id, student, 2, 1.0),
        (student.model_id, student, 1, 1.0),
    ]
    start = time.perf_counter()
    results = measure(rows, scorer, args)
    body = (
        f"`python benchmarks/distill.py` — the DMD2 student `{student.model_id}` (guidance distilled in, served at "
        f"guidance 1) vs its teacher `{args.teacher}`; {args.samples} prompts per row (seed {args.seed}), judged by the "
        f"digit-scorer (scorer) and by the independent digit-classifier + readers (independent), "
        f"diversity over {args.div_prompts} prompts × {args.div_seeds} seeds, time per image in a batch of {args.batch} "
        f"(compile excluded).\n\n{table(results)}\n\n"
        f"Machine: {json.dumps(machine_info())}; benchmark wall time {time.perf_counter() - start:.0f} s.\n"
    )
    print(body)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if not args.no_write:
        write_section(RESULTS, SECTION, body)


if __name__ == "__main__":
    main()
