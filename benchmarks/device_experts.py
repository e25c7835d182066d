"""``device.py``'s ``experts`` section: which way to run ``JointMultiExpertRL``'s N refiner updates is fastest.

For N = 1, 2, 4, 8, 16 experts, the N-way refiner update as one ``jax.vmap``, one ``lax.map``
(``JointRLConfig.expert_map`` = ``"vmap"`` / ``"map"``) and a Python loop of N jitted single-expert updates,
checked equal, then timed in interleaved rounds (``benchmarks/joint_rl.py``'s timing): which wins per N, and
whether ``expert_map="auto"`` picks the faster policy on this backend.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
from device_harness import Budget, Plan, Section, log
from tqdm import tqdm

import jaxpipe as jp

TIE = 1.05  # a policy within 5% of the faster one ties with it
EXPERTS, QUICK_EXPERTS = (1, 2, 4, 8, 16), (1, 2)
EXPERT_SIZE, QUICK_EXPERT_SIZE = (4, 4), (1, 2)  # (prompts, group): rollout rows per expert


def section_experts(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """vmap vs lax.map vs a Python loop for the N refiner updates, checked equal, timed in interleaved rounds."""
    import joint_rl as jr

    from jaxpipe.training.methods.joint_rl import map_experts, resolve_expert_map

    ns = QUICK_EXPERTS if args.quick else EXPERTS
    prompts, group = QUICK_EXPERT_SIZE if args.quick else EXPERT_SIZE
    auto = resolve_expert_map("auto")
    sec["setup"] = {
        "experts": list(ns),
        "prompts": prompts,
        "group": group,
        "rows": prompts * group,
        "auto": auto,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
    }
    # One card with the most experts and one rollout; N experts = the first N of its stacked refiners (every
    # expert has the same shapes, and expert_update does not depend on N): one rollout compile instead of five.
    card = jp.cards.build("multi-expert", config=jr.make_config(max(ns), bundled=not args.quick))
    sec["setup"]["about"] = jr.describe(card)
    method = jr.make_method(card, group, 2)  # denoise steps of the rollout only; the update's cost does not see them
    state, batch = method.init(), jr.make_batch(card, prompts)
    ro = jax.block_until_ready(method.rollout(state, batch, jax.random.key(0)))
    every = jr.expert_args(method, state, ro)
    single = jax.jit(method.expert_update)  # the loop's update: the same shapes at every N, compiled once
    log(f"experts: card with N={max(ns)} built, rollout done")
    cases, skipped = [], {}
    for n in tqdm(ns, desc="experts", disable=None):
        refused = budget.refuse("experts_n", reserve)
        if refused:
            skipped[str(n)] = refused
            log(f"experts N={n}: skipped ({refused})")
            continue
        start = time.perf_counter()
        stacked = jax.block_until_ready(jax.tree.map(lambda x, n=n: x[:n], every))
        per_expert = jr.slice_experts(stacked, n)
        mapped = {m: jax.jit(functools.partial(map_experts, method.expert_update, m)) for m in ("vmap", "map")}
        compile_s, outs = {}, {}
        for m, fn in mapped.items():
            ms, outs[m] = jr._timed(functools.partial(fn, *stacked))
            compile_s[m] = ms / 1e3
        compile_s["loop"] = jr._timed(functools.partial(single, *per_expert[0]))[0] / 1e3  # ~0 after N = 1
        looped = [single(*a) for a in per_expert]
        diff = max(jr.check_same_update(outs[m], looped) for m in mapped)  # raises past 1e-6
        contenders = {
            "vmap": lambda f=mapped["vmap"], a=stacked: f(*a),
            "map": lambda f=mapped["map"], a=stacked: f(*a),
            "loop": lambda f=single, a=per_expert: [f(*x) for x in a],
        }
        for go in contenders.values():
            jax.block_until_ready(go())
        cases.append(jr.Case(prompts, group, n, contenders, compile_s, diff))
        log(
            f"experts N={n}: prepared in {time.perf_counter() - start:.1f} s, compile s "
            + ", ".join(f"{k} {v:.1f}" for k, v in compile_s.items())
            + f", max diff {diff:.1e}"
        )
    sec["skipped_n"] = skipped
    if not cases:
        raise RuntimeError("no N fitted the budget")
    window = (1.0, 1, 2) if args.quick else (max(5.0, min(30.0, budget.left() - reserve - 10)), 5, 41)
    rounds = jr.time_cases(cases, budget_s=window[0], min_rounds=window[1], max_rounds=window[2])
    rows = []
    for case in cases:
        med = {k: statistics.median(v) for k, v in case.times.items()}
        best = {k: min(v) for k, v in case.times.items()}
        winner = min(med, key=med.get)
        policy = min(("vmap", "map"), key=med.get)
        agrees = med[auto] <= TIE * med[policy]  # within TIE of the faster policy: a tie, not a contradiction
        rows.append(
            {
                "n": case.experts,
                "median_ms": med,
                "best_ms": best,
                "compile_s": case.compile_s,
                "max_diff": case.max_diff,
                "winner": winner,
                "policy_winner": policy,
                "auto_agrees": agrees,
            }
        )
        log(
            f"experts N={case.experts}: "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
            + f" -> {winner} wins; of the policies {policy}; auto picks {auto}: "
            + ("agrees" if agrees else "CONTRADICTS")
        )
    sec["rows"], sec["rounds"] = rows, rounds
    sec["verdict"] = expert_verdict(rows, auto) + (
        " (--quick: a CPU-sized card and two rounds; noise, not a verdict)" if args.quick else ""
    )
    print(sec["verdict"], flush=True)


def expert_verdict(rows: list[dict], auto: str) -> str:
    """The section's conclusion: whether ``expert_map="auto"``'s choice is the faster policy at every N measured."""
    backend = jax.default_backend()
    against = [r for r in rows if not r["auto_agrees"]]
    if not against:
        return (
            f"expert_map='auto' resolves to '{auto}' on this backend ({backend}, {jax.device_count()} device(s)), "
            f"and '{auto}' is the faster policy (or within {TIE - 1:.0%} of it) at every N measured: auto should "
            "(and does) pick it here."
        )
    ns = ", ".join(str(r["n"]) for r in against)
    other = against[-1]["policy_winner"]
    worst = max(r["median_ms"][auto] / r["median_ms"][r["policy_winner"]] for r in against)
    return (
        f"The measurement CONTRADICTS expert_map='auto' on this backend ({backend}): auto picks '{auto}', but "
        f"'{other}' is faster at N = {ns} (auto's choice up to {worst:.2f}× slower); auto should pick the measured "
        f"winner here (jaxpipe.training.methods.joint_rl.resolve_expert_map)."
    )


def render_experts(sec: dict) -> list[str]:
    """The experts table: per N, the three contenders' medians, ratios, winners and compile times."""
    s, rows = sec.get("setup", {}), sec.get("rows", [])
    if not rows:
        return []
    lines = [
        f"### N-way refiner update: {s['prompts']} prompts × {s['group']} samples ({s['rows']} rows) per expert",
        "",
        s.get("about", ""),
        "",
        (
            "| N | vmap ms | map ms | loop ms | map / vmap | loop / vmap | fastest | faster policy | auto picks | "
            "compile s (vmap / map / one expert) | max abs diff |"
        ),
        "|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for r in rows:
        m, c = r["median_ms"], r["compile_s"]
        lines.append(
            f"| {r['n']} | {m['vmap']:.2f} | {m['map']:.2f} | {m['loop']:.2f} | {m['map'] / m['vmap']:.2f}× | "
            f"{m['loop'] / m['vmap']:.2f}× | {r['winner']} | {r['policy_winner']} | {s['auto']} "
            f"({'agrees' if r['auto_agrees'] else '**contradicts**'}) | {c['vmap']:.1f} / {c['map']:.1f} / {c['loop']:.1f} | "
            f"{r['max_diff']:.0e} |"
        )
    skipped = sec.get("skipped_n") or {}
    lines += [
        "",
        f"Medians of {sec.get('rounds')} interleaved rounds; vmap == map == loop checked within 1e-6 first."
        + (f" Skipped N: {', '.join(skipped)} (budget)." if skipped else ""),
        "",
        sec.get("verdict", ""),
    ]
    return lines


def summary_experts(sections: dict) -> list[str]:
    """One line per N: the three medians, the winner, and whether ``"auto"`` agrees."""
    return [
        f"experts N={r['n']}: "
        + ", ".join(f"{k} {v:.2f}" for k, v in r["median_ms"].items())
        + f" ms -> {r['winner']}; auto {'agrees' if r['auto_agrees'] else 'CONTRADICTS'}"
        for r in sections.get("experts", {}).get("rows", [])
    ]


def expected_experts(estimates: dict, quick: bool) -> float:
    """The start-up (card, rollout), each N, and the timing rounds."""
    return estimates["experts"] + estimates["experts_n"] * len(QUICK_EXPERTS if quick else EXPERTS) + 15


def plan_experts(p: Plan, reserve: float) -> None:
    """Each N, then the timing rounds, which take what is left of their window (as ``section_experts`` does)."""
    for n in EXPERTS:
        p.piece("experts_n", reserve, f"experts N={n}")
    p.wait(max(5.0, min(30.0, p.budget_s - p.t - reserve - 10)), "experts timing rounds")


EXPERTS_SECTION = Section(
    name="experts",
    run=section_experts,
    estimates={"experts": 40, "experts_n": 15},
    expected_s=expected_experts,
    plan=plan_experts,
    render=lambda sections: render_experts(sections.get("experts", {})),
    summary=summary_experts,
)
