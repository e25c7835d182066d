"""RL-step benchmark: one fused jit vs jitted rollout + update vs a Python-driven rollout.

Two methods, each on its bundled card, with the ``digit-scorer`` reward on all four terms
(``scorer_reward(scorer, ("digit", "stroke", "position", "brightness"))``):

* ``FlowGRPO`` on ``flux-t2i``: P prompts (caption = digit + the three attribute words) × K SDE
  samples, every denoising step captured;
* ``UnifiedRL`` (joint) on ``unified``: P prompts (the digit word alone; the attribute labels are
  preferences) × K samples, K − 1 of them refined by the LM, then rendered and scored; both models
  are updated. When the ``unified`` checkpoint is not loadable the card is built from
  ``flux-t2i``'s components plus a fresh refiner LM of the bundled size (reported).

Three contenders per method and size run side by side in one process, on the same state, batch
and key; every repeat starts from the same state, so each does the same work:

* ``fused``  -- ``method.step``: rollout, reward, advantages and update in ONE jitted function;
* ``split``  -- ``method.rollout`` then ``method.update``, two jitted calls timed apart (this is
  the rollout / update split);
* ``driven`` -- what a non-fused implementation does: the card's program driven from Python one loop
  step at a time -- a jitted ``ar.step`` per token (UnifiedRL), a jitted ``denoise.step`` per denoising
  step, the capture records stacked in Python, the program's own nodes between the loops (text
  encoding, loop starts with the program's keys, refined prompt, decode; jitted ``program.enter``
  calls) and the reward scoring in jitted pieces -- then the same jitted ``method.update``.

Before anything is timed the driven rollout is checked against ``method.rollout`` with the same
key: tokens and text ids must be equal, and the trajectory, log-probs, images, rewards and
advantages equal within 1e-5 (relative to max(1, |value|)); a mismatch raises. Steady state: the
median wall ms of interleaved, rotating repeats (``block_until_ready`` on every result). Compile:
the first call (trace + compile + one run) of the fused step, of rollout + update, and of the
driven pieces.

    python benchmarks/rl_step.py            # full run; refreshes the "rl_step" section of RESULTS.md
    python benchmarks/rl_step.py --quick    # smoke test: 1 prompt x 2 samples, 2 steps, 2 repeats, prints only
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
from jaxpipe import program as programs
from jaxpipe.card import Card
from jaxpipe.cards import toy_unified
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.digits.prompts import TEXT_WIDTH
from jaxpipe.digits.rewards import REWARD_TERMS, scorer_reward
from jaxpipe.loops import ar, denoise
from jaxpipe.prompts import Prompts
from jaxpipe.training import rollout
from jaxpipe.training.grpo import FlowGRPOConfig
from jaxpipe.training.methods.flow_grpo import FlowGRPO, Rollout
from jaxpipe.training.methods.joint_rl import JointRollout, UnifiedRL, UnifiedRLConfig
from jaxpipe.training.refine import refine_rows, restrict
from jaxpipe.training.rollout import Group, Sampling

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the sibling report module, however this runs
from report import RESULTS, machine_info, write_section  # noqa: E402

SECTION = "rl_step"
SIZES = ((4, 4), (1, 4))  # (prompts P, group size K)
NUM_STEPS = 8
QUICK_SIZES = ((1, 2),)
QUICK_STEPS = 2
TOLERANCE = 1e-5
CASE_BUDGET_S = 30.0  # per method and size, after compiling and checking
MIN_REPEATS = 5
MAX_REPEATS = 15


# --------------------------------------------------------------------------------------------
# Cards and batches.
# --------------------------------------------------------------------------------------------


def load_cards() -> tuple[Card, Card, Card, str]:
    """``(flux-t2i, unified, digit-scorer, where the cards came from)``; when the ``unified`` checkpoint is
    not loadable, the card is ``flux-t2i``'s components plus a fresh refiner LM of the bundled size."""
    scorer = jp.cards.load("digit-scorer")
    t2i = jp.cards.load("flux-t2i")
    try:
        return t2i, jp.cards.load("unified"), scorer, "the bundled checkpoints"
    except (ValueError, OSError, KeyError) as err:
        fresh = jp.cards.build("unified", config=digit_cards.bundled_config("unified"))
        card = fresh.replace(**{k: t2i[k] for k in ("text_encoder", "transformer", "vae")})
        return (
            t2i,
            card,
            scorer,
            f"bundled flux-t2i; unified = its components + a fresh bundled-size refiner LM ({err})",
        )


def make_batch(card: Card, prompts: int, *, attribute_words: bool, seed: int = 0) -> Prompts:
    """``Prompts`` of P captions with metadata ``{term: (P,)}``: a random digit and random attribute labels per
    prompt; the caption names the attributes only when ``attribute_words`` (otherwise they are preferences)."""
    rng = np.random.default_rng(seed)
    labels = {"digit": rng.integers(0, 10, prompts)}
    labels.update({name: rng.integers(0, len(words), prompts) for name, words in digits.ATTRIBUTE_WORDS.items()})
    captions = [
        digits.caption(
            int(labels["digit"][i]), *((int(labels[a][i]) for a in digits.ATTRIBUTES) if attribute_words else ())
        )
        for i in range(prompts)
    ]
    return Prompts.from_texts(card, captions, {k: np.asarray(v, np.int32) for k, v in labels.items()}, width=TEXT_WIDTH)


# --------------------------------------------------------------------------------------------
# The Python-driven baseline.
# --------------------------------------------------------------------------------------------


def jitted_step(module: nnx.Module, loop_step: Callable, config) -> Callable:
    """``one(params, loop_state) -> (loop_state, record)``: a jitted loop ``step`` on ``module``'s weights.

    The module's graph is split once here and merged inside the jitted function, so a call flattens
    only the module's params and the loop state (no Python graph walk per step).
    """
    graphdef, _, rest = nnx.split(module, nnx.Param, ...)

    @jax.jit
    def one(params, state):
        return loop_step(nnx.merge(graphdef, params, rest), state, config)

    return one


def drive(one: Callable, params, state, num_steps: int, captured: tuple[int, int] | None):
    """Call ``one`` ``num_steps`` times from Python; ``(final state, records of steps in [lo, hi) stacked, or None)``."""
    records = []
    for i in range(num_steps):
        state, record = one(params, state)
        if captured is not None and captured[0] <= i < captured[1]:
            records.append(record)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *records) if records else None
    return state, stacked


class DrivenProgram:
    """What both driven rollouts share: the method's program entered at loop ``index`` on the card of a
    training state (``enter``: the component nodes before that loop and its start, with the program's
    own keys), and its ``Execution`` once the last loop is done (``execution``: the nodes after it).
    Both are traced inside the subclasses' jitted pieces."""

    def __init__(self, method, settings):
        self.method = method
        self.program = method.program
        self.settings = settings

    def enter(self, index, state, slots, loop_state=None):
        return programs.enter(self.program, index, self.settings, self.method.card(state), slots, loop_state)

    def execution(self, state, slots, captures) -> programs.Execution:
        final = captures[self.program.loops[-1].loop][0]
        slots, _ = self.enter(len(self.program.loops), state, slots, final)
        return programs.Execution(programs.artifacts(self.program, slots), slots, captures)


class DrivenFlowGRPO(DrivenProgram):
    """``FlowGRPO.rollout`` driven from Python: jitted start (repeat, the program's text encoding and
    denoise start with keys ``split(key, rows)``), one jitted ``denoise.step`` per step with the records
    stacked in Python, jitted finish (the program's decode, score)."""

    def __init__(self, method: FlowGRPO):
        super().__init__(method, programs.settings(**{method.loop.id: method.sampling}))
        self.sampling = method.sampling
        card = method.card(method.init())
        self._denoise = jitted_step(card[method.transformer], denoise.step, self.sampling)
        self._start = jax.jit(self._start_fn)
        self._finish = jax.jit(self._finish_fn)

    def _start_fn(self, state, batch, key):
        rows = batch.repeat(self.method.config.group.size)
        slots = rollout.text_slots(self.program, rows.ids, jax.random.split(key, len(rows)))
        return *self.enter(0, state, slots), rows

    def _finish_fn(self, state, slots, captures, rows):
        m = self.method
        run = self.execution(state, slots, captures)
        generated = rollout.generated(run, m.loop.id, rollout.rendered_artifact(self.program))
        scored = rollout.score_rollout(m.reward, rollout.artifacts_of(run, self.program), rows, m.config.group)
        return Rollout(generated, scored.rewards, scored.parts, scored.advantages)

    def rollout(self, state, batch, key) -> Rollout:
        slots, start, rows = self._start(state, batch, key)
        dit = state.params["generator"][self.method.transformer]
        final, trajectory = drive(self._denoise, dit, start, self.sampling.num_steps, self.sampling.captured_steps)
        return self._finish(state, slots, {self.method.loop.id: (final, trajectory)}, rows)


class DrivenUnifiedRL(DrivenProgram):
    """``UnifiedRL.rollout`` driven from Python: jitted start (repeat, the program's LM start with keys
    ``fold_in(key, 0)``), one jitted ``ar.step`` per token, jitted middle (the program's refined prompt,
    its encoding and the denoise start with keys ``fold_in(key, 1)``), one jitted ``denoise.step`` per
    step, jitted finish (decode, score); records stacked in Python."""

    def __init__(self, method: UnifiedRL):
        if not method.config.joint:
            raise ValueError("the driven baseline covers joint UnifiedRL (SDE rollout with capture)")
        super().__init__(
            method,
            programs.settings(**{toy_unified.REFINE_LOOP: method.ar_config, toy_unified.DENOISE_LOOP: method.sampling}),
        )
        self.sampling = method.sampling
        card = method.card(method.init())
        self._token = jitted_step(card["llm"], ar.step, method.ar_config)
        self._denoise = jitted_step(card["transformer"], denoise.step, self.sampling)
        self._start = jax.jit(self._start_fn)
        self._middle = jax.jit(lambda state, slots, lm_final: self.enter(1, state, slots, lm_final))
        self._finish = jax.jit(self._finish_fn)

    def _start_fn(self, state, batch, key):
        cfg = self.method.config
        group = cfg.generator.group.size
        rows = batch.repeat(group)
        refined = refine_rows(group, cfg.refiner.skip, len(rows))
        slots = rollout.text_slots(self.program, rows.ids, jax.random.split(key, len(rows)), refined)
        return *self.enter(0, state, slots), rows

    def _finish_fn(self, state, slots, captures, rows):
        m, cfg = self.method, self.method.config
        run = self.execution(state, slots, captures)
        refined = run.slots["refine"]  # the program input: refine_rows(K, skip, B)
        refinement = restrict(rollout.refinement(run, toy_unified.REFINE_LOOP), refined)
        generated = rollout.generated(run, toy_unified.DENOISE_LOOP)
        scored = rollout.score_rollout(m.reward, rollout.artifacts_of(run, self.program), rows, cfg.generator.group)
        return JointRollout(
            refinement,
            refined,
            run.slots["refined"],
            generated,
            scored.rewards,
            scored.parts,
            scored.advantages,
            scored.advantages,
        )  # UnifiedRL: the refiner shares the advantages

    def rollout(self, state, batch, key) -> JointRollout:
        slots, lm_start, rows = self._start(state, batch, key)
        tokens = self.method.ar_config.max_new_tokens
        lm_final, records = drive(self._token, state.params["refiner"]["llm"], lm_start, tokens, (0, tokens))
        slots, start = self._middle(state, slots, lm_final)
        gen = state.params["generator"]["transformer"]
        final, trajectory = drive(self._denoise, gen, start, self.sampling.num_steps, self.sampling.captured_steps)
        captures = {toy_unified.REFINE_LOOP: (lm_final, records), toy_unified.DENOISE_LOOP: (final, trajectory)}
        return self._finish(state, slots, captures, rows)


def check_same_rollout(reference, driven, tol: float = TOLERANCE) -> dict[str, float]:
    """Max abs difference per field of two rollouts; raises ``AssertionError`` past ``tol`` (relative to
    max(1, |reference|)) or on any integer / boolean difference."""
    errors = {}
    flat_ref = jax.tree_util.tree_flatten_with_path(reference)[0]
    flat_got, _ = jax.tree_util.tree_flatten(driven)
    if len(flat_ref) != len(flat_got):
        raise AssertionError(f"driven rollout has {len(flat_got)} leaves, the jitted one {len(flat_ref)}")
    bad = []
    for (path, ref), got in zip(flat_ref, flat_got):
        name = jax.tree_util.keystr(path)
        ref, got = np.asarray(ref), np.asarray(got)
        if ref.shape != got.shape:
            bad.append(f"{name}: shape {got.shape} != {ref.shape}")
            continue
        if not np.issubdtype(ref.dtype, np.floating):
            if not np.array_equal(ref, got):
                bad.append(f"{name}: {int(np.sum(ref != got))} entries differ")
            errors[name] = 0.0 if np.array_equal(ref, got) else float("inf")
            continue
        err = float(np.max(np.abs(ref - got))) if ref.size else 0.0
        errors[name] = err
        if not err <= tol * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0):
            bad.append(f"{name}: max abs difference {err:.2e}")
    if bad:
        raise AssertionError(
            "the Python-driven rollout differs from the jitted rollout (same key):\n  " + "\n  ".join(bad)
        )
    return errors


def summarise_errors(errors: dict[str, float]) -> dict[str, float]:
    """The largest difference per group of fields: trajectory, log-probs, images, rewards / advantages."""
    groups = {
        "trajectory": ("trajectory",),
        "log_prob": ("log_prob",),
        "images": ("images",),
        "reward/adv": ("rewards", "parts", "advantages"),
    }
    out = {}
    for group, needles in groups.items():
        hits = [
            e
            for name, e in errors.items()
            if any(n in name for n in needles) and (group == "log_prob" or "log_prob" not in name)
        ]
        out[group] = max(hits) if hits else 0.0
    return out


# --------------------------------------------------------------------------------------------
# Timing.
# --------------------------------------------------------------------------------------------


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return (time.perf_counter() - start) * 1e3, out


@dataclasses.dataclass
class Row:
    method: str
    prompts: int
    group: int
    steps: int
    median: (
        dict  # measure -> median ms: fused, split_rollout, split_update, split, driven_rollout, driven_update, driven
    )
    best: dict  # measure -> fastest repeat, ms
    compile_s: dict  # fused, split, driven -> first call, s
    parity: dict  # field group -> max abs difference driven vs jitted rollout
    repeats: int

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    def ratio(self, a: str, b: str, stat: str = "median") -> float:
        values = getattr(self, stat)
        return values[a] / values[b]


def bench_case(
    name: str, method, driven, batch: dict, key, *, steps: int, repeats: int, budget_s: float, min_repeats: int
) -> Row:
    """Compile each contender (timed), check the driven rollout, then time interleaved rounds."""
    state = method.init()
    compile_s = {}
    compile_s["fused"] = _timed(lambda: method.step(state, batch, key))[0] / 1e3  # first: nothing of it is cached
    t_roll, ro = _timed(lambda: method.rollout(state, batch, key))
    compile_s["split"] = (t_roll + _timed(lambda: method.update(state, ro))[0]) / 1e3
    t_drive, driven_ro = _timed(lambda: driven.rollout(state, batch, key))
    compile_s["driven"] = t_drive / 1e3  # its update is method.update, compiled above
    parity = summarise_errors(check_same_rollout(ro, driven_ro))

    def fused():
        return {"fused": _timed(lambda: method.step(state, batch, key))[0]}

    def two(prefix, roll):
        def go():
            t_r, out = _timed(lambda: roll(state, batch, key))
            t_u, _ = _timed(lambda: method.update(state, out))
            return {f"{prefix}_rollout": t_r, f"{prefix}_update": t_u, prefix: t_r + t_u}

        return go

    contenders = {"fused": fused, "split": two("split", method.rollout), "driven": two("driven", driven.rollout)}
    for go in contenders.values():  # warm: one untimed round
        go()
    times: dict[str, list[float]] = {}
    start = time.perf_counter()
    done = 0
    for r in range(repeats):
        order = list(contenders)[r % len(contenders) :] + list(contenders)[: r % len(contenders)]
        for k in order:
            for measure, ms in contenders[k]().items():
                times.setdefault(measure, []).append(ms)
        done = r + 1
        if done >= min_repeats and time.perf_counter() - start > budget_s:
            break
    median = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    return Row(name, len(batch), group_size(method), steps, median, best, compile_s, parity, done)


def group_size(method) -> int:
    """K, the samples per prompt of ``method``'s rollout (FlowGRPO's own group, UnifiedRL's generator's)."""
    config = method.config
    return (config.generator if hasattr(config, "generator") else config).group.size


# --------------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| method | P × K (rows) | steps | fused ms | split ms (rollout + update) | driven ms (rollout + update) "
        "| update share | **driven / fused** | split / fused | driven / jitted rollout | best-of driven / fused "
        "| compile s (fused / split / driven) | driven − jitted rollout (traj / log-prob / images / reward+adv) | repeats |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m, c, e = r.median, r.compile_s, r.parity
        lines.append(
            f"| {r.method} | {r.prompts} × {r.group} ({r.rows}) | {r.steps} | {m['fused']:.1f} | "
            f"{m['split']:.1f} ({m['split_rollout']:.1f} + {m['split_update']:.1f}) | "
            f"{m['driven']:.1f} ({m['driven_rollout']:.1f} + {m['driven_update']:.1f}) | "
            f"{100 * r.ratio('split_update', 'split'):.0f}% | **{r.ratio('driven', 'fused'):.2f}×** | {r.ratio('split', 'fused'):.2f}× | "
            f"{r.ratio('driven_rollout', 'split_rollout'):.2f}× | {r.ratio('driven', 'fused', 'best'):.2f}× | "
            f"{c['fused']:.1f} / {c['split']:.1f} / {c['driven']:.1f} | "
            f"{e['trajectory']:.0e} / {e['log_prob']:.0e} / {e['images']:.0e} / {e['reward/adv']:.0e} | {r.repeats} |"
        )
    return "\n".join(lines)


def describe(t2i: Card, uni: Card, source: str) -> str:
    dit, lm = t2i.spec.config.dit, uni["llm"].cfg
    return (
        f"Cards: {source}. flux-t2i: DiT dim={dit.dim}, depth={dit.depth}, {t2i.num_params() / 1e6:.2f} M parameters "
        f"in the card. unified: the same generator + refiner LM dim={lm.dim}, depth={lm.depth}, "
        f"{uni.spec.loop(toy_unified.REFINE_LOOP).config.max_new_tokens} new tokens per refinement, "
        f"{uni.num_params() / 1e6:.2f} M parameters in the card."
    )


def section_body(
    info: dict, rows: list[Row], about: str, loads: tuple[float, float], elapsed: float, quick: bool
) -> str:
    busy = " (other processes were using the CPU: medians are noisy; see best-of)" if max(loads) >= 0.5 else ""
    return (
        "## rl_step\n\n"
        "`python benchmarks/rl_step.py`: wall ms per RL step (rollout → reward → group advantages → update) for\n"
        "`FlowGRPO` on `flux-t2i` and joint `UnifiedRL` on `unified`, reward = `digit-scorer` on digit, stroke,\n"
        "position and brightness; P prompts × K samples, SDE on (and capture of) every denoising step. Contenders,\n"
        "side by side in one process on the same state, batch and key, interleaved repeats (median ms):\n"
        "**fused** = `method.step`, one jitted function (plus its Python-side batch checks); **split** = jitted\n"
        "`method.rollout` then jitted `method.update`, timed apart (the rollout / update split; update share =\n"
        "update / (rollout + update)); **driven** = the card's program driven from Python one\n"
        "loop step at a time (a jitted `ar.step` per token, a jitted `denoise.step` per denoising step, records\n"
        "stacked in Python, the program's nodes between the loops (`program.enter`: encode, loop starts, refined\n"
        "prompt, decode) and the scoring in jitted pieces), then the same jitted update.\n"
        "The driven rollout is checked against `method.rollout` (same key) before timing: integer fields equal, float\n"
        "fields within 1e-5 (max abs differences in the table). Compile = first call (trace + compile + one run) of\n"
        "the fused step / of rollout + update / of the driven rollout's pieces (its update is the split's, compiled).\n\n"
        f"{about}\n\n"
        + "\n".join(f"- {k}: {v}" for k, v in info.items())
        + f"\n- load average (1 min) before / after: {loads[0]:.2f} / {loads[1]:.2f}{busy}\n"
        f"- whole run: {elapsed:.0f} s{' (--quick)' if quick else ''}\n\n"
        f"{table(rows)}\n"
    )


METHODS = ("flowgrpo", "unified")


def rl_config(group: int, steps: int, **changes) -> FlowGRPOConfig:
    """FlowGRPO's settings at K = ``group`` and ``steps`` SDE steps, every step captured (no window), the other
    settings the defaults (``changes``: e.g. UnifiedRL's generator KL weight ``beta=0.04``)."""
    return FlowGRPOConfig(group=Group(group), sampling=Sampling(num_steps=steps, sampler="sde"), **changes)


def run(quick: bool, methods: tuple[str, ...] = METHODS) -> tuple[list[Row], str]:
    """Benchmark ``methods`` at every size: the rows and a description of the cards."""
    t2i, uni, scorer, source = load_cards()
    reward = scorer_reward(scorer, REWARD_TERMS)
    steps = QUICK_STEPS if quick else NUM_STEPS
    sizes = QUICK_SIZES if quick else SIZES
    budget, least, most = (1.0, 1, 2) if quick else (CASE_BUDGET_S, MIN_REPEATS, MAX_REPEATS)
    key = jax.random.key(0)
    rows = []
    for prompts, group in sizes:
        cases = {}
        if "flowgrpo" in methods:
            method = FlowGRPO(t2i, reward, rl_config(group, steps))
            cases["FlowGRPO"] = (method, DrivenFlowGRPO(method), make_batch(t2i, prompts, attribute_words=True))
        if "unified" in methods:
            method = UnifiedRL(uni, reward, UnifiedRLConfig(generator=rl_config(group, steps, beta=0.04)))
            cases["UnifiedRL (joint)"] = (
                method,
                DrivenUnifiedRL(method),
                make_batch(uni, prompts, attribute_words=False),
            )
        for name, (method, driven, batch) in cases.items():
            row = bench_case(
                name, method, driven, batch, key, steps=steps, repeats=most, budget_s=budget, min_repeats=least
            )
            rows.append(row)
            m = row.median
            print(
                f"  {name} {prompts}x{group}, {steps} steps ({row.repeats} repeats): fused {m['fused']:.1f} ms | "
                f"split {m['split_rollout']:.1f} + {m['split_update']:.1f} ms | driven {m['driven_rollout']:.1f} + "
                f"{m['driven_update']:.1f} ms | driven/fused {row.ratio('driven', 'fused'):.2f}x | compile s "
                f"{row.compile_s} | driven - jitted rollout {row.parity}",
                flush=True,
            )
    return rows, describe(t2i, uni, source)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="1 prompt x 2 samples, 2 steps, 2 repeats; print only (a smoke test)"
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=None,
        help=f"write the section here (default: {RESULTS.name} on full runs)",
    )
    args = parser.parse_args(argv)
    load_before, wall = os.getloadavg()[0], time.perf_counter()
    info = machine_info()
    print("machine:", ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    rows, about = run(args.quick, tuple(args.methods))
    elapsed = time.perf_counter() - wall
    body = section_body(info, rows, about, (load_before, os.getloadavg()[0]), elapsed, args.quick)
    print("\n" + body)
    out = args.results if args.results is not None else (None if args.quick else RESULTS)
    if out is not None:
        write_section(out, SECTION, body)
        print(f"wrote the {SECTION} section of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
