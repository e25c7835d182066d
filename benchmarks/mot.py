"""Quality of the Mixture-of-Transformers cards, judged like ``flux-t2i``.

- ``bagel-mot``: text -> image all-attributes-right at guidance 1 and at the card's default;
  image -> caption accuracy per attribute on held-out digits; thinking vs no thinking on
  partial prompts (caption prefixes: the digit, + stroke, + position);
- ``"shared"`` vs ``"modality"`` routing at **equal compute** (the same dim / depth / heads: every
  token runs one attention and one FFN of the same size; modality holds twice the transformer
  parameters): the same measures for a ``"shared"``-routed card trained by the same command;
- ``cosmos3``: text -> video motion and digit accuracy, with and without reasoning a motion;
- parameter counts (shared vs expert) per policy.

    python -m jaxpipe.digits.pretrain.mot --routing shared --model-id bagel-mot-shared --out out/cards/bagel-mot-shared
    python benchmarks/mot.py [--shared out/cards/bagel-mot-shared] [--samples 200]
    python benchmarks/mot.py --quick     # smoke test: 4 samples, prints only (no RESULTS.md, no raw file)

Writes the ``mot`` section of RESULTS.md and prints it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from flax import nnx
from report import RESULTS, machine_info, write_section

import jaxpipe as jp
from jaxpipe.cards import toy_mot
from jaxpipe.digits import quality
from jaxpipe.nn.mot import MoT, Routing

SECTION = "mot"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def card_rows(card, scorer, samples: int) -> dict:
    """Every bagel-style measure of one card."""
    default = card.spec.loop(toy_mot.IMAGE_LOOP).config.guidance
    out = {"t2i_g1": quality.t2i_quality(card, scorer, samples=samples, guidance=1.0)}
    if default != 1.0:
        out["t2i_default"] = quality.t2i_quality(card, scorer, samples=samples)
    out["understanding"] = quality.understanding_quality(card, samples=samples)
    out["thinking"] = quality.thinking_quality(card, scorer, samples=samples, guidance=1.0)
    out["params"] = card["transformer"].param_counts()
    return out


def bagel_table(results: dict) -> list[str]:
    lines = [
        "| card | routing | transformer params (shared / each expert) | all right, g 1 / default (scorer) | all right, g 1 / "
        "default (independent) | digit (plain prompt), g 1, scorer / independent | "
        "caption: digit / stroke / position / brightness / all | think vs no think: prompt right | thought complete | image follows thought |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        p, t, u, k = r["params"], r["t2i_g1"], r["understanding"], r["thinking"]
        acc, d = u["accuracy"], r.get("t2i_default", t)
        lines.append(
            f"| `{name}` | {r['routing']} | {p['shared']:,} / {p['understanding']:,} | {pct(t['all_attributes_correct'])} / "
            f"{pct(d['all_attributes_correct'])} (g {d['guidance']:g}) | {pct(t['independent']['all_attributes_correct'])} / "
            f"{pct(d['independent']['all_attributes_correct'])} | "
            f"{pct(t['digit_accuracy'])} / {pct(t['independent']['digit_accuracy'])} | {pct(acc['digit'])} / {pct(acc['stroke'])} / {pct(acc['position'])} / "
            f"{pct(acc['brightness'])} / {pct(u['all_right'])} | {pct(k['think']['prompt_right'])} vs "
            f"{pct(k['no_think']['prompt_right'])} | {pct(k['think']['thought_complete'])} | {pct(k['think']['follows_thought'])} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument(
        "--shared", type=pathlib.Path, help="a bagel-mot card trained with --routing shared (equal compute)"
    )
    parser.add_argument("--raw", type=pathlib.Path, default=pathlib.Path("out/benchmarks/mot.json"))
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 samples, prints only")
    args = parser.parse_args()
    if args.quick:
        args.samples = 4
    start = time.perf_counter()
    scorer = jp.cards.load("digit-scorer")
    results = {}
    cards = {"bagel-mot": jp.cards.load("bagel-mot")}
    if args.shared:
        cards[f"{args.shared.name}"] = jp.cards.load(args.shared)
    for name, card in cards.items():
        print(f"{name} ...", flush=True)
        results[name] = {"routing": card["transformer"].cfg.routing.policy, **card_rows(card, scorer, args.samples)}
    video = {}
    if "cosmos3" in jp.cards.available():
        print("cosmos3 ...", flush=True)
        video = quality.t2v_quality(jp.cards.load("cosmos3"), scorer, samples=max(args.samples // 2, 1))
    counts = {}
    base = jp.cards.load("bagel-mot")["transformer"].cfg
    for label, routing in (
        ("shared", "shared"),
        ("modality", "modality"),
        ("partial: FFNs routed", Routing.ffn_only(base.depth)),
        ("partial: first 2 layers shared", Routing.first_shared(base.depth, 2)),
    ):
        abstract = nnx.eval_shape(
            lambda routing=routing: MoT(dataclasses.replace(base, routing=routing), rngs=nnx.Rngs(0))
        )
        counts[label] = abstract.param_counts()
    if not args.quick:
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps({"bagel": results, "cosmos3": video, "params": counts}, indent=1))

    lines = [
        f"`python benchmarks/mot.py{' --shared ' + str(args.shared) if args.shared else ''}`: {args.samples} samples per "
        "measure, judged by `digit-scorer` (scorer; eval seed 0, 8 steps) and, for the generated images' all right, digit "
        "and video digits, also by the independent evaluators (digit-classifier + analytic readers, no weights shared "
        "with the scorer; independent). All right: full compositional prompts at guidance 1 "
        "(as `flux-t2i`'s C4 table) and at the card's default guidance; caption: image -> caption on held-out digits "
        "drawn with random attributes (greedy); think vs no think (guidance 1): partial prompts (caption prefixes: the "
        "digit, + stroke, + position), the same seeds, the digit and every named attribute right; thought complete: "
        "the thought names every attribute and keeps the prompt; image follows thought: the scorer reads every "
        "attribute the thought names. Shared vs modality at equal compute (same dim / depth / heads, the same "
        "command and steps; modality holds twice the transformer parameters).",
        "",
        *[f"- {k}: {v}" for k, v in machine_info().items()],
        f"- whole run: {time.perf_counter() - start:.0f} s",
        "",
        *bagel_table(results),
        "",
        "Parameters of the bundled MoT's transformer layers per routing policy (io = embeddings and heads):",
        "",
        "| policy | shared | understanding expert | generation expert | io | total |",
        "|---|---|---|---|---|---|",
        *[
            f"| {k} | {c['shared']:,} | {c['understanding']:,} | {c['generation']:,} | {c['io']:,} | {c['total']:,} |"
            for k, c in counts.items()
        ],
    ]
    if video:
        f, d = video["full"], video["digit_only"]
        lines += [
            "",
            f"`cosmos3` ({video['samples']} videos per row, guidance {video['guidance']}, {video['num_steps']} steps):",
            "",
            "| prompts | moves as told | digit, first frame (scorer / independent) | digit, last frame (scorer / independent) "
            "| reasoned a motion | follows its reasoning |",
            "|---|---|---|---|---|---|",
            f"| digit + motion | {pct(f['motion_accuracy'])} | {pct(f['first_frame_digit_accuracy'])} / "
            f"{pct(f['independent']['first_frame_digit_accuracy'])} | {pct(f['last_frame_digit_accuracy'])} / "
            f"{pct(f['independent']['last_frame_digit_accuracy'])} | — | — |",
            f"| digit only | — | {pct(d['first_frame_digit_accuracy'])} / {pct(d['independent']['first_frame_digit_accuracy'])} | "
            f"{pct(d['last_frame_digit_accuracy'])} / {pct(d['independent']['last_frame_digit_accuracy'])} | "
            f"{pct(d['reasoned_a_motion'])} | {pct(d['follows_its_reasoning'])} |",
        ]
    body = "\n".join(["## mot", "", *lines])
    print(body)
    if not args.quick:
        write_section(RESULTS, SECTION, body)


if __name__ == "__main__":
    main()
