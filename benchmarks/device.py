"""One prepared GPU benchmark for a 15-minute lease of one H200; ``--quick`` runs it CPU-sized.

Sections, one process, contenders side by side, ratios reported:

* ``flux``: the FLUX.1-dev transformer (``FluxConfig.dev()`` sizes, random weights, bfloat16 params and
  activations) at 1024² (4096 image + 512 text tokens, batch 1): jaxpipe's jitted ``denoise.step``
  (velocity + Euler), a Python loop of it, the fused 28-step ``lax.scan`` (``denoise.run``), diffusers'
  ``FluxTransformer2DModel`` in torch bf16 eager (a Python loop of 28 Euler steps), the same under
  ``torch.compile`` (mode ``default`` unless ``--compile-mode``), and, for context, the jitted step with
  ``jax.nn.dot_product_attention(implementation="cudnn")`` patched in (jaxpipe uses XLA's attention,
  which materialises the scores). Weights are made on the device in bfloat16 (JAX: one jit of a few long
  ``jax.random`` draws cut into ``nnx.eval_shape``'s leaves; torch: built on ``meta``, ``to_empty``, filled
  in place), so no float32 copy of the 12 B parameters ever exists. Before timing, the torch network is
  checked to be jaxpipe's (tiny config, float32, CPU: torch weights loaded into JAX, velocities within 1e-4).
* ``train`` (not in the default run: ``--sections train attention`` is the lease's second command): the
  single-device FlowGRPO / NFT updates of ``benchmarks/fit.py`` (FLUX.1-dev at 1024², LoRA rank 64, scanned
  blocks, full remat, chunked attention) compiled, filled with random weights and run: XLA's memory estimate
  on the device against its measured peak, and the step time (``device_train.py``).
* ``experts``: the N-way refiner update of ``JointMultiExpertRL`` (N = 1, 2, 4, 8, 16) as one ``jax.vmap``,
  one ``lax.map`` (``JointRLConfig.expert_map`` = ``"vmap"`` / ``"map"``) and a Python loop of N jitted
  single-expert updates, checked equal before timing; which wins per N, and whether ``"auto"`` picks it.
* ``engine``: ``Engine.run_many`` batched vs serial (vs the fused ``jp.generate``) on the bundled
  ``flux-t2i`` card (``benchmarks/engine.py``'s ``measure``), and the raw per-request step cost by batch.

A ``--budget-s`` deadline (default 570 s) guards the lease: a section, or an optional contender, starts only
if its estimated seconds (plus those reserved for the sections after it) still fit; what does not fit is
recorded as skipped. A contender that raises is recorded as failed and the run goes on (exit status 1).
Results are written to the JSON after every contender, so a run cut short still leaves what it measured.

    python benchmarks/device.py --dry-run     # full sizes abstractly: shapes, counts, FLOPs, memory, the plan
    python benchmarks/device.py --quick       # CPU-sized (tiny FLUX, 4 steps, N in (1, 2)); prints only
    python benchmarks/device.py --out $OUT/device.json --results $OUT/RESULTS.md   # on the GPU machine
    python benchmarks/device.py --from-json device.json   # here: the "device" section of RESULTS.md from it

torch and diffusers are optional (the torch contenders are skipped, saying so, without them); the
``jaxpipe`` package never imports them.
"""

# The harness and the runner are device_harness.py; each section is its own module (device_flux.py,
# device_train.py, device_experts.py, device_engine.py), registered in SECTIONS below.

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

# Before JAX starts: take GPU memory as needed, at most half the card, so that torch has the other half.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
if "--quick" in sys.argv[1:]:  # a smoke test: its timings mean nothing, its compiles are most of its time (~2x less)
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the sibling benchmarks, and jaxpipe where it is not installed

import device_harness as harness  # before JAX's imports: its clock starts the budget, which counts them too

# isort: split
import device_engine
import device_experts
import device_flux
import device_train
from report import RESULTS, write_section

SECTION = "device"
DEFAULT_OUT = HERE.parent / "out" / "benchmarks" / "device.json"
# The sections in run order, which is also the JSON's and the report's. A new section is a module defining a
# device_harness.Section, listed here; an optional one (it runs only in time left over, no earlier section keeps
# time for it) goes after the rest, so that it cannot take time they were counting on.
SECTIONS: tuple[harness.Section, ...] = (
    device_flux.FLUX_SECTION,
    device_train.TRAIN_SECTION,
    device_experts.EXPERTS_SECTION,
    device_engine.ENGINE_SECTION,
    device_flux.ATTENTION_SECTION,
)
NAMES = tuple(s.name for s in SECTIONS)
# what one 10-minute command runs; `--sections train attention` is the second command of the same lease
DEFAULT = tuple(n for n in NAMES if n != "train")
# Expected seconds on one H200, compiles included (estimates from FLOP counts and compile times of similar
# graphs; replace with measured ones in the sections' modules): the budget starts a piece only if it still fits.
ESTIMATE_S = harness.estimates_of(SECTIONS)
INTRO = (  # the report's opening paragraph: one sentence per section
    "`python benchmarks/device.py`: one process on one accelerator, contenders side by side. FLUX: jaxpipe's",
    "FLUX.1 transformer (random bf16 weights) under the fused `lax.scan` vs a Python loop of its jitted step vs",
    "diffusers' `FluxTransformer2DModel` in torch bf16 (eager and `torch.compile`); ms per step = median wall time",
    "of whole runs / steps; compile = trace + XLA compile (JAX) or first run − steady run (torch). Train:",
    "`benchmarks/fit.py`'s single-device FlowGRPO / NFT updates of FLUX.1-dev (LoRA 64, full remat) run on the",
    "device: XLA's memory estimate against the measured peak, and the step time. Experts: the",
    "N refiner updates as one `jax.vmap`, one `lax.map` and a Python loop. Engine: `benchmarks/engine.py`'s",
    "`measure`. Sections that did not fit the time budget are listed as skipped.",
)


def render(data: dict) -> str:
    """The ``device`` section of RESULTS.md from a run's JSON ``data``."""
    return harness.render(data, SECTIONS, INTRO)


def summary(data: dict) -> str:
    """The few numbers that matter, for the end of the log."""
    return harness.summary(data, SECTIONS)


def dry_run(args: argparse.Namespace) -> dict:
    """Every section's full-size abstract checks (shapes, counts, FLOPs, memory; nothing allocated), then the
    time plan of the chosen sections; printed, and returned for the JSON."""
    info = {}
    for section in SECTIONS:
        if section.dry_run:
            info.update(section.dry_run(args))
    info["plan"] = harness.plan([s for s in SECTIONS if s.name in args.sections], args.budget_s)
    for key, value in info.items():
        print(f"  {key}: {value}")
    return info


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or render a saved run, or dry-run it) as the command line says.

    Returns:
      The exit status: 1 if a section or a contender failed, else 0.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="CPU-sized: tiny FLUX, 4 steps, N in (1, 2), 2 engine sizes"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="build the full-size FLUX setup abstractly and print the plan"
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=NAMES,
        default=list(DEFAULT),
        help=f"default {' '.join(DEFAULT)}; 'train' (~4 min on an H200) is a second run's",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=570.0,
        help="skip what no longer fits this many seconds after the start (the JSON keeps what ran)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help=f"the JSON (default: {DEFAULT_OUT} on full runs)"
    )
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=None,
        help=f"write the markdown section here (default: {RESULTS.name} on full runs)",
    )
    parser.add_argument("--no-results", action="store_true", help="write no markdown section")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time torch.compile (default: on a GPU only)",
    )
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    parser.add_argument("--from-json", type=pathlib.Path, default=None, help="only render a saved run's JSON")
    args = parser.parse_args(argv)
    results = None if args.no_results else args.results or (None if args.quick or args.dry_run else RESULTS)

    if args.from_json:
        data = json.loads(args.from_json.read_text())
        write_section(args.results or RESULTS, SECTION, render(data))
        print(f"wrote the {SECTION} section of {args.results or RESULTS} from {args.from_json}\n{summary(data)}")
        return 0
    info = harness.machine()
    harness.log("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    if args.dry_run:
        plan = dry_run(args)
        if args.out:
            harness.Run(args.out, {"machine": info, "dry_run": plan}).save()
        return 0

    out = args.out or (None if args.quick else DEFAULT_OUT)
    args_record = {
        "quick": args.quick,
        "sections": args.sections,
        "budget_s": args.budget_s,
        "compile": args.compile,
        "compile_mode": args.compile_mode,
        "argv": sys.argv[1:] if argv is None else argv,
    }
    run = harness.Run(out, {"machine": info, "args": args_record, "sections": {}})
    budget = harness.Budget(args.budget_s, {k: 1.0 for k in ESTIMATE_S} if args.quick else dict(ESTIMATE_S))
    harness.run_sections([s for s in SECTIONS if s.name in args.sections], args, run, budget)
    body = render(run.data)
    print("\n" + body)
    if results is not None:
        write_section(results, SECTION, body)
        print(f"wrote the {SECTION} section of {results}")
    if out is not None:
        print(f"wrote {out}")
    print("\n" + summary(run.data), flush=True)
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main())
