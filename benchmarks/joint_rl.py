"""N-way refiner update benchmark: one ``jax.vmap`` over N stacked experts vs a Python loop.

``JointMultiExpertRL.update`` does the N refiner updates as ONE ``jax.vmap`` of ``expert_update`` (one
expert's gradient step) over the stacked params, references and optimiser states. This script times
that against the obvious alternative, N separately jitted single-expert updates called from Python,
as N grows (1, 2, 4, 8, 16), in one process, on the same rollout:

* ``vmap`` -- ``jax.jit(jax.vmap(method.expert_update))`` on the stacked state (what ``update`` does
  for the refiners under ``expert_map="vmap"``, without its metrics; each expert's step is guarded on its own);
* ``loop`` -- ``jax.jit(method.expert_update)`` called once per expert from a Python loop, on
  per-expert params / references / optimiser states / refinements / advantages sliced from the stacked
  ones **before** timing (a loop implementation would hold N separate trees; slicing is not timed);
  the N calls are dispatched back to back and waited on together.

For context, per N: ``scan`` (``jax.lax.map`` of ``expert_update`` over the stacked state in one jit:
no per-call cost and no batched math, which separates what a vmap saves by calling once from what
it saves by batching), ``dispatch`` (the loop's N calls of a jitted no-op taking the same per-expert
arguments: the calling cost alone), ``method.update`` (the library's whole refiner update: the vmap
plus metrics and the guard), the whole prompt-only ``method.step`` (rollout + update in one jit) and,
at the largest rollout, the joint step that also trains the generator.

Cards: a ``multi-expert`` card per N, freshly built (timing needs no trained weights), the bundled
generator and refiner LM sizes with ``text.max_len = 24`` (the composed prompt is prompt + N words)
and ``lm.max_len = 32``; slots cycle stroke, position, brightness; one new token per refiner;
``joint=False`` (the generator frozen); ``refiner_optimizer = Optimizer(1e-5)`` (see the check below). Reward: two image
statistics (no scorer needed to time an update), shared credit.

Before timing, the vmapped update is checked against the loop: new params, optimiser states, losses,
gradient norms and metrics equal within 1e-6 (relative to max(1, |value|); a mismatch raises). Every
case (rollout size × N) is compiled and checked first; then all are timed together in interleaved
rounds (cases and, within a case, contenders in rotating order), so background load falls on every N
and contender alike. Steady state: median wall ms (``block_until_ready`` on every result); every
repeat starts from the same state, so each does the same work. Compile: the first call (trace +
compile + one run).

    python benchmarks/joint_rl.py            # full run; refreshes the "joint_rl" section of RESULTS.md
    python benchmarks/joint_rl.py --quick    # smoke test: N in (1, 2), 1 prompt x 2 samples, 2 rounds, print only
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.cards import toy_multi_expert, toy_unified
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.digits.prompts import TEXT_WIDTH
from jaxpipe.prompts import Prompts
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.joint_rl import JointMultiExpertRL, JointMultiExpertRLConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.refine import RefinerConfig
from jaxpipe.training.rollout import Group, Sampling

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section  # noqa: E402

SECTION = "joint_rl"
EXPERTS = (1, 2, 4, 8, 16)
SIZES = ((1, 4), (4, 4))  # (prompts P, group size K): B = P·K rollout rows
NUM_STEPS = 8  # denoising steps of the rollout (the step column only)
QUICK_EXPERTS = (1, 2)
QUICK_SIZES = ((1, 2),)
QUICK_STEPS = 2
TEXT_LEN = 24  # the composed prompt is prompt + N words: N = 16 needs room
LM_LEN = 32
# Adam's first step is lr·g/(|g| + 1e-8): where |g| ~ 1e-8, float reordering between the vmap and the loop moves
# a weight by a fraction of lr (measured at N = 16: 3e-6 at lr 1e-4, 3e-7 at 1e-5); speed does not depend on lr
LEARNING_RATE = 1e-5
TOLERANCE = 1e-6
TIMING_BUDGET_S = 200.0  # all cases together, after compiling and checking
MIN_ROUNDS = 11
MAX_ROUNDS = 61
TARGET_RATIO = 1.5  # CPU: loop / vmap at N = 8
TARGET_N = 8
GPU_FACTOR = 2.0  # GPU: t_vmap(8) <= 2 · t_vmap(1)


# --------------------------------------------------------------------------------------------
# Cards, methods, batches.
# --------------------------------------------------------------------------------------------


def make_config(num_refiners: int, *, bundled: bool = True) -> toy_multi_expert.Config:
    """A ``multi-expert`` config with ``num_refiners`` refiners, the bundled (or test) sizes and room for
    the composed prompt: ``text.max_len = TEXT_LEN``, ``lm.max_len = LM_LEN``, slots cycling."""
    base = digit_cards.bundled_config("unified") if bundled else digit_cards.config("unified")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(toy_unified.Config) if f.name != "refine"}
    fields["text"] = dataclasses.replace(base.text, max_len=TEXT_LEN)
    fields["lm"] = dataclasses.replace(base.lm, max_len=LM_LEN)
    return digit_cards.config("multi-expert", **fields, num_refiners=num_refiners)


def reward_parts(artifacts, prompts) -> dict[str, jax.Array]:
    """Two cheap image statistics (speed does not depend on what the reward means)."""
    del prompts
    images = artifacts["image"]
    right = images[:, :, images.shape[2] // 2 :]
    return {"brightness": jnp.mean(images, axis=(1, 2, 3)), "position": jnp.mean(right, axis=(1, 2, 3))}


def make_method(card: Card, group: int, steps: int, *, joint: bool = False) -> JointMultiExpertRL:
    config = JointMultiExpertRLConfig(
        generator=FlowGRPOConfig(group=Group(group), sampling=Sampling(num_steps=steps, sampler="sde"), beta=0.04),
        refiner=RefinerConfig(skip=1),
        refiner_optimizer=Optimizer(LEARNING_RATE),
        joint=joint,
    )
    return JointMultiExpertRL(card, reward_parts, config)


def make_batch(card: Card, prompts: int, seed: int = 0) -> Prompts:
    """``Prompts`` of P ids ``(P, TEXT_LEN)``: the digit word of a random digit per prompt (the refiners add the
    rest), no metadata."""
    rng = np.random.default_rng(seed)
    captions = [digits.caption(int(d)) for d in rng.integers(0, 10, prompts)]
    return Prompts.from_texts(card, captions, width=TEXT_WIDTH)


# --------------------------------------------------------------------------------------------
# The two contenders and their check.
# --------------------------------------------------------------------------------------------


def expert_args(method: JointMultiExpertRL, state, ro) -> tuple:
    """``expert_update``'s arguments stacked on the expert axis (what ``update`` vmaps over)."""
    return (
        state.params["refiner"],
        state.copies["refiner_reference"],
        state.opt_state["refiner"],
        method.allowed,
        ro.refinement,
        ro.refiner_advantages,
    )


def slice_experts(args: tuple, n: int) -> list[tuple]:
    """Expert ``i``'s arguments for every ``i`` (concrete arrays, so slicing is never timed)."""
    return [jax.block_until_ready(jax.tree.map(lambda x, i=i: x[i], args)) for i in range(n)]


def check_same_update(stacked, per_expert: list, tol: float = TOLERANCE) -> float:
    """Max abs difference between the vmapped update's outputs (expert axis leading) and the per-expert
    ones; raises ``AssertionError`` past ``tol`` (relative to max(1, |value|), per output and expert)
    anywhere: params, optimiser state, loss, metrics, grad norm."""
    worst, bad = 0.0, []
    flat = jax.tree_util.tree_flatten_with_path(stacked)[0]
    for i, out in enumerate(per_expert):
        leaves = jax.tree.leaves(out)
        if len(leaves) != len(flat):
            raise AssertionError(f"expert {i}: {len(leaves)} output leaves, the vmapped update has {len(flat)}")
        for (path, ref), got in zip(flat, leaves):
            ref, got = np.asarray(ref[i]), np.asarray(got)
            if ref.shape != got.shape:
                bad.append(f"expert {i} {jax.tree_util.keystr(path)}: shape {got.shape} != {ref.shape}")
                continue
            err = float(np.max(np.abs(ref.astype(np.float64) - got))) if ref.size else 0.0
            worst = max(worst, err)
            if not err <= tol * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0):
                bad.append(f"expert {i} {jax.tree_util.keystr(path)}: max abs difference {err:.2e}")
    if bad:
        raise AssertionError("the vmapped update differs from the per-expert loop:\n  " + "\n  ".join(bad[:20]))
    return worst


# --------------------------------------------------------------------------------------------
# Timing.
# --------------------------------------------------------------------------------------------


def _timed(fn: Callable) -> tuple[float, object]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return (time.perf_counter() - start) * 1e3, out


@dataclasses.dataclass
class Case:
    """One (rollout size, N): its compiled contenders, their first-call times, the vmap == loop check and
    the steady-state times filled in by ``time_cases``."""

    prompts: int
    group: int
    experts: int
    contenders: dict  # name -> zero-argument callable returning what to wait on
    compile_s: dict  # vmap, loop (one expert), scan, update, step, joint -> first call, s
    max_diff: float  # vmap vs loop, max abs over every output
    times: dict = dataclasses.field(default_factory=dict)  # name -> ms per repeat


@dataclasses.dataclass
class Row:
    prompts: int
    group: int
    experts: int
    median: dict  # contender -> median ms
    best: dict  # contender -> fastest repeat, ms
    compile_s: dict
    max_diff: float
    repeats: int

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def ratio(self) -> float:
        return self.median["loop"] / self.median["vmap"]

    @property
    def best_ratio(self) -> float:
        return self.best["loop"] / self.best["vmap"]

    @classmethod
    def of(cls, case: Case) -> Row:
        median = {k: statistics.median(v) for k, v in case.times.items()}
        best = {k: min(v) for k, v in case.times.items()}
        repeats = min(map(len, case.times.values()))
        return cls(case.prompts, case.group, case.experts, median, best, case.compile_s, case.max_diff, repeats)


def prepare_case(card: Card, prompts: int, group: int, *, steps: int, context: bool, joint: bool) -> Case:
    """Compile every contender (first call timed) and check vmap == loop on one rollout. ``context``: also
    the scan, ``method.update`` and ``method.step``; ``joint``: and the joint step (generator trained too)."""
    n = card.spec.config.num_refiners
    method = make_method(card, group, steps)
    state, batch, key = method.init(), make_batch(card, prompts), jax.random.key(0)
    ro = jax.block_until_ready(method.rollout(state, batch, key))
    if not float(jnp.max(jnp.abs(ro.refiner_advantages))) > 0:
        raise AssertionError("the rollout's advantages are all zero: the update would be trivial")
    stacked = expert_args(method, state, ro)
    per_expert = slice_experts(stacked, n)
    vmapped = jax.jit(jax.vmap(method.expert_update))
    single = jax.jit(method.expert_update)
    scanned = jax.jit(lambda *args: jax.lax.map(lambda one: method.expert_update(*one), args))
    noop = jax.jit(lambda params, reference, opt, allowed, refinement, advantages: advantages[0])

    compile_s = {}
    t, out_vmap = _timed(lambda: vmapped(*stacked))
    compile_s["vmap"] = t / 1e3
    compile_s["loop"] = _timed(lambda: single(*per_expert[0]))[0] / 1e3
    jax.block_until_ready(noop(*per_expert[0]))
    max_diff = check_same_update(out_vmap, [single(*args) for args in per_expert])

    contenders = {
        "vmap": lambda: vmapped(*stacked),
        "loop": lambda: [single(*args) for args in per_expert],
        "dispatch": lambda: [noop(*args) for args in per_expert],
    }
    if context:
        compile_s["scan"] = _timed(lambda: scanned(*stacked))[0] / 1e3
        contenders["scan"] = lambda: scanned(*stacked)
        compile_s["update"] = _timed(lambda: method.update(state, ro))[0] / 1e3
        compile_s["step"] = _timed(lambda: method.step(state, batch, key))[0] / 1e3
        contenders["update"] = lambda: method.update(state, ro)
        contenders["step"] = lambda: method.step(state, batch, key)
    if joint:
        joint_method = make_method(card, group, steps, joint=True)
        joint_state = joint_method.init()
        compile_s["joint"] = _timed(lambda: joint_method.step(joint_state, batch, key))[0] / 1e3
        contenders["joint"] = lambda: joint_method.step(joint_state, batch, key)
    for go in contenders.values():  # warm: one untimed call each
        jax.block_until_ready(go())
    return Case(prompts, group, n, contenders, compile_s, max_diff)


def time_cases(cases: list[Case], *, budget_s: float, min_rounds: int, max_rounds: int) -> int:
    """Time every contender of every case in interleaved rounds: each round visits the cases in rotating
    order and, within a case, its contenders back to back in rotating order, so background load hits
    every N and every contender alike (and the two sides of a ratio a moment apart). Returns the rounds."""
    for case in cases:
        case.times = {k: [] for k in case.contenders}
    start, rounds = time.perf_counter(), 0
    for r in range(max_rounds):
        for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
            names = list(case.contenders)
            for k in names[r % len(names) :] + names[: r % len(names)]:
                case.times[k].append(_timed(case.contenders[k])[0])
        rounds = r + 1
        if rounds >= min_rounds and time.perf_counter() - start > budget_s:
            break
    return rounds


def fit_line(rows: list[Row], contender: str) -> tuple[float, float]:
    """Least-squares ``t(N) ≈ fixed + per_expert · N`` over ``rows`` (median ms): ``(fixed, per_expert)``."""
    ns = np.array([r.experts for r in rows], float)
    ts = np.array([r.median[contender] for r in rows], float)
    if len(set(ns)) < 2:
        return float("nan"), float("nan")
    slope, intercept = np.polyfit(ns, ts, 1)
    return float(intercept), float(slope)


# --------------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------------


def table(rows: list[Row], joint: bool) -> str:
    context = ("update", "step") + (("joint",) if joint else ())
    head = (
        "| P × K (rows) | N | vmap ms | loop ms | **loop / vmap** | best-of loop / vmap | vmap ms / N | loop ms / N "
        "| scan ms | dispatch ms | update ms | step ms"
        + (" | joint step ms" if joint else "")
        + " | compile s (vmap / one expert / scan / "
        + " / ".join(context)
        + ") | max abs diff | repeats |"
    )
    lines = [head, "|---|" + "---:|" * (head.count("|") - 2)]
    for r in rows:
        m, c = r.median, r.compile_s
        ms = lambda k, m=m: f"{m[k]:.2f}" if k in m else "–"
        lines.append(
            f"| {r.prompts} × {r.group} ({r.rows}) | {r.experts} | {m['vmap']:.2f} | {m['loop']:.2f} | "
            f"**{r.ratio:.2f}×** | {r.best_ratio:.2f}× | {m['vmap'] / r.experts:.2f} | {m['loop'] / r.experts:.2f} | "
            + " | ".join(ms(k) for k in ("scan", "dispatch") + context)
            + " | "
            + " / ".join(f"{c[k]:.1f}" if k in c else "–" for k in ("vmap", "loop", "scan") + context)
            + f" | {r.max_diff:.0e} | {r.repeats} |"
        )
    return "\n".join(lines)


def by_size(rows: list[Row]) -> dict[tuple[int, int], list[Row]]:
    out: dict[tuple[int, int], list[Row]] = {}
    for r in rows:
        out.setdefault((r.prompts, r.group), []).append(r)
    return out


def fits(rows: list[Row]) -> list[str]:
    """Per size: linear fits of vmap, loop, scan and dispatch, i.e. what a vmap removes (fixed vs per-expert cost)."""
    out = []
    for (p, k), group in by_size(rows).items():
        if len({r.experts for r in group}) < 2 or any("scan" not in r.median for r in group):
            continue
        (fv, sv), (fl, sl), (fs, ss), (fd, sd) = (fit_line(group, c) for c in ("vmap", "loop", "scan", "dispatch"))
        out.append(
            f"{p} × {k}: vmap ≈ {fv:.2f} + {sv:.2f}·N, loop ≈ {fl:.2f} + {sl:.2f}·N, scan ≈ {fs:.2f} + {ss:.2f}·N, "
            f"no-op calls ≈ {fd:.2f} + {sd:.2f}·N ms. Per expert, the loop pays {sl:.2f} ms, of which {sd:.2f} ms is the "
            f"call itself; the scan (one call, experts one after another) {ss:.2f} ms; the vmap {sv:.2f} ms. As N grows "
            f"loop / vmap tends to {sl / sv:.2f}×."
        )
    return out


def targets(rows: list[Row], backend: str) -> list[str]:
    """The issue's targets per size: CPU: loop / vmap ≥ 1.5× at N = 8 and vmap ms / N falling as N grows;
    GPU: t_vmap(8) ≤ 2 · t_vmap(1)."""
    out = []
    for (p, k), group in by_size(rows).items():
        at = {r.experts: r for r in group}
        size = f"{p} × {k}"
        if TARGET_N in at:
            r = at[TARGET_N]
            ok = r.ratio >= TARGET_RATIO
            out.append(
                f"{size}: loop / vmap at N = {TARGET_N} = {r.ratio:.2f}× (best-of {r.best_ratio:.2f}×; target ≥ "
                f"{TARGET_RATIO:g}×) -> {'met' if ok else 'NOT met'}"
            )
        per = [(n, at[n].median["vmap"] / n) for n in sorted(at)]
        if len(per) > 1:
            falling = all(b[1] < a[1] for a, b in zip(per, per[1:]))
            shown = ", ".join(f"{v:.2f}" for _, v in per)
            out.append(
                f"{size}: vmap ms / N over N = {', '.join(str(n) for n, _ in per)}: {shown} (target: falling) -> "
                f"{'met' if falling else 'NOT met'}"
            )
        if backend == "gpu" and 1 in at and TARGET_N in at:
            t1, t8 = at[1].median["vmap"], at[TARGET_N].median["vmap"]
            out.append(
                f"{size}: t_vmap({TARGET_N}) / t_vmap(1) = {t8 / t1:.2f} (GPU target ≤ {GPU_FACTOR:g}) -> "
                f"{'met' if t8 <= GPU_FACTOR * t1 else 'NOT met'}"
            )
    if backend != "gpu":
        out.append(f"GPU target t_vmap({TARGET_N}) ≤ {GPU_FACTOR:g} · t_vmap(1): not measured (backend: {backend})")
    return out


def describe(card: Card) -> str:
    cfg = card.spec.config
    lm, dit = cfg.lm, cfg.dit
    stacked = nnx.state(card[toy_multi_expert.COMPONENT], nnx.Param)
    per_expert = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(stacked))
    return (
        f"Refiner LM per expert: dim={lm.dim}, depth={lm.depth}, heads={lm.heads}, max_len={lm.max_len}, "
        f"{per_expert / 1e3:.0f} k parameters (Adam state ×2); generator DiT dim={dit.dim}, depth={dit.depth}; "
        f"text.max_len={cfg.text.max_len}; slots {tuple(name for name, _ in cfg.slots or ())}, "
        f"{cfg.refine.max_new_tokens} new token per refiner."
    )


def section_body(
    info: dict,
    rows: list[Row],
    about: str,
    loads: tuple[float, float],
    elapsed: float,
    quick: bool,
    joint: bool,
    rounds: int,
) -> str:
    busy = " (other processes were using the CPU: medians are noisy; see best-of)" if max(loads) >= 0.5 else ""
    fit_lines = fits(rows)
    fit_text = (
        "".join(
            ["Linear fits of the medians (`t(N) ≈ fixed + per-expert · N`, ms):\n\n"]
            + [f"- {f}\n" for f in fit_lines]
            + ["\n"]
        )
        if fit_lines
        else ""
    )
    return (
        "## joint_rl\n\n"
        "`python benchmarks/joint_rl.py`: the N refiner updates of `JointMultiExpertRL` as ONE `jax.vmap` vs a\n"
        "Python loop over N jitted single-expert updates, as N grows, side by side in one process on the same\n"
        "rollout. **vmap** = `jax.jit(jax.vmap(method.expert_update))` on the stacked params / references / Adam\n"
        "states / refinements / advantages (what `update` does for the refiners); **loop** =\n"
        "`jax.jit(method.expert_update)` called per expert on arguments sliced from the stacked ones *before*\n"
        "timing (slicing not timed; the N calls are dispatched back to back, then waited on). Context: **scan** =\n"
        "`jax.jit` of `jax.lax.map(method.expert_update)` over the stacked state (one call, the experts one after\n"
        "another inside it: no per-call cost, no batched math); **dispatch** = the loop's N calls of a jitted no-op\n"
        "on the same per-expert arguments (the calling cost alone); **update** = `method.update` (the vmap +\n"
        "metrics + non-finite guard); **step** = the whole prompt-only `method.step` (rollout: N refiners, compose,\n"
        "render, reward; then the update)"
        + ("; **joint step** = the same with the generator trained too (largest size only)" if joint else "")
        + ".\nBefore timing, vmap == loop is checked (new params, Adam states, losses, metrics, grad norms within\n"
        f"{TOLERANCE:g} · max(1, |value|); lr {LEARNING_RATE:g}, because Adam's first step lr·g/(|g| + 1e-8) turns\n"
        "float-reordering noise in gradients near 1e-8 into weight differences of a fraction of lr: 3e-6 at lr 1e-4).\n"
        "Every case is compiled first, then all are timed together in interleaved rounds (cases and contenders in\n"
        f"rotating order; {rounds} rounds): median wall ms; compile = first call (trace + compile + one run).\n\n"
        f"{about}\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in info.items())
        + f"\n- load average (1 min) before / after: {loads[0]:.2f} / {loads[1]:.2f}{busy}\n"
        f"- whole run: {elapsed:.0f} s{' (--quick)' if quick else ''}\n\n"
        f"{table(rows, joint)}\n\n"
        + fit_text
        + "Targets (CPU: loop / vmap ≥ 1.5× at N = 8, vmap ms / N falling as N grows; GPU: t(8) ≤ 2 · t(1)):\n\n"
        + "\n".join(f"- {t}" for t in targets(rows, jax.default_backend()))
        + "\n"
    )


def run(quick: bool, joint: bool, experts: tuple[int, ...] | None = None) -> tuple[list[Row], str, int]:
    """Every size × N: prepare (compile, check), then time all together. ``(rows, card description, rounds)``."""
    experts = experts or (QUICK_EXPERTS if quick else EXPERTS)
    sizes = QUICK_SIZES if quick else SIZES
    steps = QUICK_STEPS if quick else NUM_STEPS
    budget, least, most = (1.0, 1, 2) if quick else (TIMING_BUDGET_S, MIN_ROUNDS, MAX_ROUNDS)
    cases, about = [], ""
    for n in experts:
        card = jp.cards.build("multi-expert", config=make_config(n, bundled=not quick))
        about = describe(card)
        for prompts, group in sizes:
            case = prepare_case(
                card, prompts, group, steps=steps, context=not quick, joint=joint and (prompts, group) == sizes[-1]
            )
            cases.append(case)
            print(
                f"  prepared N={n} {prompts}x{group}: compile s "
                f"{', '.join(f'{k} {v:.1f}' for k, v in case.compile_s.items())} | vmap - loop max diff {case.max_diff:.1e}",
                flush=True,
            )
    rounds = time_cases(cases, budget_s=budget, min_rounds=least, max_rounds=most)
    rows = sorted((Row.of(c) for c in cases), key=lambda r: (r.rows, r.experts))
    for row in rows:
        m = row.median
        print(
            f"  N={row.experts} {row.prompts}x{row.group}: vmap {m['vmap']:.2f} ms | loop {m['loop']:.2f} ms | "
            f"loop/vmap {row.ratio:.2f}x (best-of {row.best_ratio:.2f}x) | "
            + " | ".join(f"{k} {v:.2f} ms" for k, v in m.items() if k not in ("vmap", "loop")),
            flush=True,
        )
    return rows, about, rounds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="N in (1, 2), 1 prompt x 2 samples, 2 rounds, test-sized generator, no scan / update / step; print only",
    )
    parser.add_argument("--no-joint", dest="joint", action="store_false", help="skip the joint-step context column")
    parser.add_argument("--experts", type=int, nargs="+", default=None, help=f"N values (default {EXPERTS})")
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=None,
        help=f"write the section here (default: {RESULTS.name} on full runs)",
    )
    args = parser.parse_args(argv)
    joint = args.joint and not args.quick
    load_before, wall = os.getloadavg()[0], time.perf_counter()
    info = machine_info(XLA_FLAGS=f"`{os.environ['XLA_FLAGS']}`" if os.environ.get("XLA_FLAGS") else "(unset)")
    print("machine:", ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    rows, about, rounds = run(args.quick, joint, tuple(args.experts) if args.experts else None)
    elapsed = time.perf_counter() - wall
    body = section_body(info, rows, about, (load_before, os.getloadavg()[0]), elapsed, args.quick, joint, rounds)
    print("\n" + body)
    out = args.results if args.results is not None else (None if args.quick else RESULTS)
    if out is not None:
        write_section(out, SECTION, body)
        print(f"wrote the {SECTION} section of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
