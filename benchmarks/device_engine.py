"""``device.py``'s ``engine`` section: what batching requests in ``jp.Engine`` buys on one accelerator.

``Engine.run_many`` batched vs serial vs the fused ``jp.generate`` on the bundled ``flux-t2i`` card, for
N = 1, 4, 16, 64 requests of mixed step counts (``benchmarks/engine.py``'s ``measure``, which also checks that
the batched outputs are the serial ones), and the raw per-request denoise step cost by batch size.
"""

from __future__ import annotations

from device_harness import Budget, Plan, Section, log
from tqdm import tqdm

import jaxpipe as jp
from jaxpipe.digits import cards as digit_cards

ENGINE_SIZES, QUICK_ENGINE_SIZES = (1, 4, 16, 64), (2,)


def section_engine(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """``engine.measure`` per size (batched / serial / fused, C3-checked) and the raw step cost by batch."""
    import engine as eng

    if args.quick:
        card, source = eng._perturbed(jp.cards.build("flux-t2i"), 1), "random weights, test size"
    elif "flux-t2i" in jp.cards.available():
        card, source = jp.cards.load("flux-t2i"), "bundled checkpoint"
    else:
        card, source = (
            eng._perturbed(jp.cards.build("flux-t2i", config=digit_cards.bundled_config("flux-t2i")), 1),
            "random, bundled size",
        )
    sec["setup"] = {"card": "flux-t2i", "source": source, "about": eng.describe(card), "step_counts": list(eng.STEPS)}
    engine = jp.Engine(max_batch=64)
    engine.register(card)
    rows, skipped = [], {}
    sizes = QUICK_ENGINE_SIZES if args.quick else ENGINE_SIZES
    for n in tqdm(sizes, desc="engine", disable=None):
        refused = budget.refuse("engine_n", reserve)
        if refused:
            skipped[str(n)] = refused
            log(f"engine N={n}: skipped ({refused})")
            continue
        row = eng.measure(
            engine, n, 3 if args.quick else 5, budget_s=1.0 if args.quick else 8.0
        )  # 3: a resize may compile once
        rows.append(row)
        sec["rows"] = rows
        save()
        med = row["median"]
        log(
            f"engine N={n}: serial {med['serial'] * 1e3:.1f} ms, batched {med['batched'] * 1e3:.1f} ms, fused "
            f"{med['fused'] * 1e3:.1f} ms; batched/serial {row['ratio']:.2f}x; C3 passed {row['c3_passed']}"
        )
    sec["skipped_n"] = skipped
    if not args.quick and not budget.refuse("engine_n", reserve):
        sec["scaling_ms"] = {str(b): v for b, v in eng.step_scaling(card).items()}


def render_engine(sec: dict) -> list[str]:
    """The engine table: per N, serial / batched / fused medians, their ratios, compile times, the C3 check."""
    s, rows = sec.get("setup", {}), sec.get("rows", [])
    if not rows:
        return []
    lines = [
        f"### Engine: {s['card']} ({s['about']}; {s['source']}), mixed step counts {s['step_counts']}",
        "",
        (
            "| N | steps | serial ms | batched ms | fused ms | batched req/s | batched / serial | batched / fused | "
            "compile s (serial / batched / fused) | C3 passed | repeats |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        m, f = r["median"], r["first"]
        lines.append(
            f"| {r['n']} | {r['steps']} | {m['serial'] * 1e3:.1f} | {m['batched'] * 1e3:.1f} | {m['fused'] * 1e3:.1f} | "
            f"{r['n'] / m['batched']:.1f} | **{r['ratio']:.2f}×** | {r['ratio_fused']:.2f}× | "
            f"{f['serial']:.1f} / {f['batched']:.1f} / {f['fused']:.1f} | {r['c3_passed']} | {r['repeats']} |"
        )
    if sec.get("scaling_ms"):
        lines += [
            "",
            "Raw denoise cost, ms per request-step by batch: "
            + ", ".join(f"{b}: {v:.3f}" for b, v in sec["scaling_ms"].items()),
        ]
    return lines


def summary_engine(sections: dict) -> list[str]:
    """One line per N: batched against serial and against the fused path."""
    return [
        f"engine N={r['n']}: batched/serial {r['ratio']:.2f}x, batched/fused {r['ratio_fused']:.2f}x"
        for r in sections.get("engine", {}).get("rows", [])
    ]


def expected_engine(estimates: dict, quick: bool) -> float:
    """The start-up (card, engine), each N, and the step scaling."""
    return estimates["engine"] + estimates["engine_n"] * (len(QUICK_ENGINE_SIZES if quick else ENGINE_SIZES) + 1)


def plan_engine(p: Plan, reserve: float) -> None:
    """Each N, then the step scaling."""
    for n in ENGINE_SIZES:
        p.piece("engine_n", reserve, f"engine N={n}")
    p.piece("engine_n", reserve, "engine step scaling")


ENGINE_SECTION = Section(
    name="engine",
    run=section_engine,
    estimates={"engine": 20, "engine_n": 15},
    expected_s=expected_engine,
    plan=plan_engine,
    render=lambda sections: render_engine(sections.get("engine", {})),
    summary=summary_engine,
)
