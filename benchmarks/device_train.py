"""``device.py``'s ``train`` section: a real-size RL update on one accelerator, and how far ``fit.py``'s estimate is.

The single-device jobs of ``benchmarks/fit.py`` — FlowGRPO and DiffusionNFT updates of FLUX.1-dev at 1024²
(4 rows, an SDE window of 2 for FlowGRPO), LoRA rank 64, the blocks scanned with full remat, chunked
attention — compiled for the device, filled with random weights made on it, and run: XLA's
``memory_analysis()`` on this backend (the number ``fit.py`` reads from XLA:CPU), the device's measured
peak (``memory_stats()["peak_bytes_in_use"]``), and the step's median time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from device_harness import Budget, Plan, Section, log, num, timings

GB = 1e9
JOBS = ("flux-grpo-lora64-full", "flux-nft-lora64-full")


def _filled(abstract, shardings, key: jax.Array):
    """Random arrays in ``abstract``'s shapes, dtypes and shardings, made on the devices (one jitted draw per leaf):
    floats ``N(0, 0.02²)``, PRNG keys from ``key``, integers 0."""
    leaves, treedef = jax.tree.flatten(abstract)

    def make():
        out = []
        for i, leaf in enumerate(leaves):
            k = jax.random.fold_in(key, i)
            if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                out.append(jax.random.split(k, leaf.shape) if leaf.shape else k)
            elif jnp.issubdtype(leaf.dtype, jnp.floating):
                out.append((0.02 * jax.random.normal(k, leaf.shape, jnp.float32)).astype(leaf.dtype))
            else:
                out.append(jnp.zeros(leaf.shape, leaf.dtype))
        return jax.tree.unflatten(treedef, out)

    return jax.jit(make, out_shardings=shardings)()


def run_job(name: str, quick: bool) -> dict:
    """Compile, fill and time one of ``fit.py``'s jobs on the default device."""
    import fit

    job = next(j for j in fit.jobs() if j.name == name)
    step, args, shardings, donated, _, net = fit.build(job, quick)
    jitted = jax.jit(step, in_shardings=shardings, donate_argnums=donated)
    compiled = jitted.lower(*args).compile()
    mem = compiled.memory_analysis()
    estimate = mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes - mem.alias_size_in_bytes
    state = list(_filled(args, shardings, jax.random.key(0)))

    def once():
        out = compiled(*state)
        jax.block_until_ready(out)
        # the donated arguments are consumed: the step's outputs are the next step's inputs
        for slot, value in zip(donated, out):
            state[slot] = value

    once()
    times = timings(once, 2 if quick else 3)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return {
        "job": name,
        "rows": job.prompts * fit.GROUP,
        "lora": job.lora,
        "remat": job.remat,
        "xla_estimate_gb": estimate / GB,
        "temporaries_gb": mem.temp_size_in_bytes / GB,
        "peak_gb": None if peak is None else peak / GB,
        **times,
    }


def section_train(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """Each single-device job of ``fit.py``: XLA's memory estimate on this backend, the measured peak, the step time."""
    rows, skipped = [], {}
    for name in JOBS:
        refused = budget.refuse("train_job", reserve)
        if refused:
            skipped[name] = refused
            log(f"train {name}: skipped ({refused})")
            continue
        try:
            row = run_job(name, args.quick)
        except Exception as err:  # noqa: BLE001 - one job that does not fit must not cost the other
            row = {"job": name, "error": f"{type(err).__name__}: {err}"[:600]}
        rows.append(row)
        sec["rows"] = rows
        save()
        log(f"train {name}: {row}")
    sec["skipped"] = skipped


def render_train(sec: dict) -> list[str]:
    """One row per job: XLA's estimate, the measured peak and their ratio, the step time."""
    rows = sec.get("rows", [])
    if not rows:
        return []
    lines = [
        "### Real-size RL updates on one device (`fit.py`'s single-device jobs: FLUX.1-dev, 1024², LoRA 64, full remat)",
        "",
        "| job | rows | XLA estimate GB | measured peak GB | peak / estimate | step s (median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['job']} | failed: {r['error'][:200]} | | | | |")
            continue
        ratio = r["peak_gb"] / r["xla_estimate_gb"] if r.get("peak_gb") else None
        lines.append(
            f"| {r['job']} | {r['rows']} | {num(r['xla_estimate_gb'], '.1f')} | {num(r.get('peak_gb'), '.1f')} | "
            f"{num(ratio)} | {num(r['median_s'])} |"
        )
    return lines


def summary_train(sections: dict) -> list[str]:
    """One line per job."""
    return [
        f"train {r['job']}: "
        + (
            r["error"][:120]
            if "error" in r
            else f"estimate {r['xla_estimate_gb']:.1f} GB, peak {num(r.get('peak_gb'), '.1f')} GB, {r['median_s']:.2f} s/step"
        )
        for r in sections.get("train", {}).get("rows", [])
    ]


def plan_train(p: Plan, reserve: float) -> None:
    """Each job."""
    for name in JOBS:
        p.piece("train_job", reserve, f"train {name}")


TRAIN_SECTION = Section(
    name="train",
    run=section_train,
    estimates={"train": 5, "train_job": 120},
    expected_s=lambda estimates, quick: estimates["train"] + estimates["train_job"] * len(JOBS),
    plan=plan_train,
    render=lambda sections: render_train(sections.get("train", {})),
    summary=summary_train,
)
