"""Does a real training job fit? XLA's own answer: compile its full-size step for a simulated mesh on this CPU
from abstract inputs (``jax.ShapeDtypeStruct``; no weight is allocated) and read ``memory_analysis()``.

Each job is one optimiser step of a denoiser RL method at a real size, as jaxpipe's trainers run it:

* ``grpo``: FlowGRPO's update (``training.grpo.generator_update``: the captured SDE window's log-probs and means
  recomputed under the trained weights and the frozen reference, the clipped PPO loss + KL, one guarded Adam step);
* ``nft``: DiffusionNFT's update (the current and old policies' velocities at re-noised clean samples,
  ``nft.nft_loss``, one guarded Adam step, the old policy's EMA).

The trained weights are float32 master copies (plus Adam's two moments, plus the reference / old copy); the
frozen ones are bfloat16; every forward computes in bfloat16. Full fine-tuning shards them over the mesh by the
network's ``LOGICAL_AXES`` (``distributed.FSDP`` or ``FSDP_TP``); LoRA trains only adapters (``nn.lora``) on one
device. The rollout itself (sampling, decoding, the reward) is inference and needs less; it is not compiled here.

For each job: per-device arguments / outputs / temporaries / total (arguments + outputs + temporaries − donated
aliases) and whether that fits an H200 (141 GB) and a TPU v5p (95 GB), and the compile wall time. XLA:CPU's buffer
assignment is an estimate of a GPU's or TPU's, not a measurement: see the notes the section keeps.

    python benchmarks/fit.py                      # every job at full size (tens of minutes on 2 cores)
    python benchmarks/fit.py --only flux-grpo-lora --results benchmarks/RESULTS.md
    python benchmarks/fit.py --quick              # the same jobs at test sizes (the smoke test)
"""

from __future__ import annotations

import os
import sys

DEVICES = 8
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # before JAX starts: the simulated mesh the sharded jobs compile for
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}".strip()
    )

import argparse
import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import report

from jaxpipe import distributed
from jaxpipe.loops import denoise
from jaxpipe.nn import flux, wan
from jaxpipe.training import grpo, update
from jaxpipe.training.methods import nft
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Generated, Group, Sampling

GB = 1e9
DEVICE_GB = {"H200": 141.0, "TPU v5p": 95.0}
WINDOW = 2  # SDE steps captured per rollout (FlowGRPO's window)
GROUP = 4  # K samples per prompt


@dataclasses.dataclass(frozen=True)
class Model:
    """A network at one size and the shapes of one training row."""

    name: str
    config: object  # FluxConfig | WanConfig
    latent: tuple[int, ...]  # one row's latents, channels last
    text: tuple[int, int]  # (tokens, width) of the text conditioning
    pooled: int = 0  # FLUX's pooled CLIP width
    tokens: int = 0  # the transformer's sequence length, for the table


def models(quick: bool) -> dict[str, Model]:
    """The networks the jobs train: FLUX.1-dev at 1024² and Wan 2.1 14B at 480p × 81 frames (or test sizes)."""
    if quick:
        return {
            "flux": Model(
                "FLUX tiny", flux.FluxConfig.tiny(num_layers=2, num_single_layers=2), (8, 8, 4), (8, 32), 32, 24
            ),
            "wan": Model("Wan tiny", wan.WanConfig.tiny(), (3, 8, 8, 4), (8, 32), tokens=48),
        }
    return {
        # 1024² -> 128² latents of 16 channels -> 64² packed tokens = 4,096 image + 512 T5 tokens
        "flux": Model("FLUX.1-dev", flux.FluxConfig.dev(), (128, 128, 16), (512, 4096), 768, 4096 + 512),
        # 480×832, 81 frames -> (1 + 80/4) = 21 latent frames of 60×104 -> 21·30·52 = 32,760 tokens
        "wan": Model("Wan 2.1 T2V 14B", wan.WanConfig.t2v_14b(), (21, 60, 104, 16), (512, 4096), tokens=32760),
    }


@dataclasses.dataclass(frozen=True)
class Job:
    """One training step to compile.

    Attributes:
      name: the row's id.
      model: a key of ``models``.
      method: ``"grpo"`` or ``"nft"``.
      data: the mesh's ``data`` (FSDP) size.
      tp: the mesh's ``model`` (tensor-parallel) size.
      prompts: prompts per step (rows = prompts · K).
      lora: adapter rank (0: full fine-tuning).
      remat: the blocks' remat policy.
      scan: blocks scanned (else unrolled).
      attention: the attention implementation.
    """

    name: str
    model: str
    method: str
    data: int = 1
    tp: int = 1
    prompts: int = 1
    lora: int = 0
    remat: str = "full"
    scan: bool = True
    attention: str = "chunked"

    @property
    def devices(self) -> int:
        return self.data * self.tp


def jobs() -> list[Job]:
    """Every job, in table order."""
    rows = []
    for method in ("grpo", "nft"):
        for remat in ("none", "full"):
            rows.append(Job(f"flux-{method}-fsdp8-{remat}", "flux", method, data=8, prompts=2, remat=remat))
            rows.append(Job(f"flux-{method}-lora64-{remat}", "flux", method, lora=64, remat=remat))
    rows.append(Job("flux-grpo-lora64-full-xla-attention", "flux", "grpo", lora=64, attention="xla"))
    rows.append(Job("flux-grpo-lora64-full-unrolled", "flux", "grpo", lora=64, scan=False))
    for remat in ("none", "full"):
        rows.append(Job(f"wan-grpo-fsdp2tp4-{remat}", "wan", "grpo", data=2, tp=4, prompts=2, remat=remat))
    # one prompt's K = 4 rows, one per FSDP shard: a video row's activations are what fill a device
    rows.append(Job("wan-grpo-fsdp4tp2-1prompt-full", "wan", "grpo", data=4, tp=2, prompts=1))
    return rows


def network(job: Job, model: Model, quick: bool):
    """The job's network, abstract (``nnx.eval_shape``), bfloat16, with adapters if it trains LoRA."""
    config = dataclasses.replace(model.config, dtype="bfloat16", scan_layers=job.scan, remat=job.remat)
    if hasattr(config, "attention"):
        config = dataclasses.replace(config, attention=job.attention)
    if job.model == "wan":
        net = wan.WanTransformer.abstract(config)
    else:
        net = nnx.eval_shape(lambda: flux.FluxTransformer(config, rngs=nnx.Rngs(0)))
    if job.lora:
        from jaxpipe.nn import lora

        rank = 2 if quick else job.lora
        net = nnx.eval_shape(lambda: lora.apply(net, lora.LoRAConfig(rank=rank, alpha=rank)))
    return net


def cond_of(job: Job, model: Model, rows: int):
    """The conditioning of ``rows`` training rows, abstract."""
    text = jax.ShapeDtypeStruct((rows, *model.text), jnp.bfloat16)
    if job.model == "wan":
        return wan.WanCond(text)
    return flux.FluxCond(
        text, jax.ShapeDtypeStruct((rows, model.pooled), jnp.bfloat16), jax.ShapeDtypeStruct((rows,), jnp.float32)
    )


def _master(state):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32), state)


def _cast(tree, dtype):
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def build(job: Job, quick: bool):
    """``(step, abstract arguments, in_shardings, donated argument indices)`` of the job's training step."""
    model = models(quick)[job.model]
    net = network(job, model, quick)
    if job.lora:
        from jaxpipe.nn import lora

    trainable = lora.LoRAParam if job.lora else nnx.Param
    graphdef, params, frozen = nnx.split(net, trainable, ...)
    params = _master(params)  # float32 master weights whatever the compute dtype
    rows = job.prompts * GROUP
    tx = Optimizer(1e-4).make()
    opt_state = jax.eval_shape(tx.init, params)
    mesh = distributed.make_mesh(job.data, 1, job.tp, devices=jax.devices()[: job.devices])
    table = wan.LOGICAL_AXES if job.model == "wan" else flux.LOGICAL_AXES
    rules = distributed.FSDP_TP if job.tp > 1 else distributed.FSDP
    shard = lambda tree: distributed.param_shardings(mesh, tree, table, rules)
    p_sh, f_sh = shard(params), shard(frozen)
    o_sh = distributed.opt_state_shardings(mesh, opt_state, params, p_sh)
    rows_sh = NamedSharding(mesh, P("data")) if rows % job.data == 0 else distributed.replicated(mesh)
    time_rows_sh = NamedSharding(mesh, P(None, "data")) if rows % job.data == 0 else distributed.replicated(mesh)
    cond = cond_of(job, model, rows)
    cond_sh = jax.tree.map(lambda _: rows_sh, cond)

    def models_of(p):
        return nnx.merge(graphdef, _cast(p, jnp.bfloat16), frozen_arg[0])

    frozen_arg = [None]  # the frozen weights are an argument of the step, bound when it is traced

    if job.method == "grpo":
        sampling = denoise.DenoiseConfig(num_steps=10, shift=3.0, sampler="sde", sde_window=(0, WINDOW))
        config = grpo.FlowGRPOConfig(group=Group(size=GROUP), sampling=Sampling(sampler="sde", num_steps=10))
        latents = jax.ShapeDtypeStruct((WINDOW, rows, *model.latent), jnp.float32)
        per_step = jax.ShapeDtypeStruct((WINDOW, rows), jnp.float32)
        trajectory = denoise.Transition(
            latents,
            latents,
            latents,
            per_step,
            per_step,
            per_step,
            per_step,
            jax.ShapeDtypeStruct((WINDOW, rows), jnp.int32),
        )
        generated = Generated(jax.ShapeDtypeStruct((rows, 1), jnp.float32), cond, trajectory)
        generated_sh = Generated(rows_sh, cond_sh, jax.tree.map(lambda _: time_rows_sh, trajectory))
        advantages = jax.ShapeDtypeStruct((rows,), jnp.float32)

        def step(params, reference, opt_state, frozen, generated, advantages):
            frozen_arg[0] = frozen
            out = grpo.generator_update(
                tx, models_of, params, reference, opt_state, generated, advantages, None, None, config, sampling
            )
            return out.params, out.opt_state, out.aux

        args = (params, params, opt_state, frozen, generated, advantages)
        shardings = (p_sh, p_sh, o_sh, f_sh, generated_sh, rows_sh)
    else:
        regression = denoise.DenoiseConfig()
        x0 = jax.ShapeDtypeStruct((rows, *model.latent), jnp.float32)
        weights = jax.ShapeDtypeStruct((rows,), jnp.float32)

        def step(params, old, opt_state, frozen, x0, cond, weights, key):
            frozen_arg[0] = frozen
            k_sigma, k_noise = jax.random.split(key)
            sigma = jax.random.uniform(k_sigma, (rows,))
            noise = jax.random.normal(k_noise, x0.shape)
            x_sigma = jax.vmap(lambda a, n, s: (1 - s) * a + s * n)(x0, noise, sigma)

            def loss(p):
                v_theta = denoise.velocity(models_of(p), x_sigma, sigma, cond, regression)
                v_old = denoise.velocity(models_of(old), x_sigma, sigma, cond, regression)
                return nft.nft_loss(v_theta, v_old, noise - x0, weights, 1.0)

            out = update.step(loss, tx, params, opt_state)
            old = jax.tree.map(lambda o, p: o + 0.5 * (p - o), old, out.params)
            return out.params, old, out.opt_state, out.aux

        key = jax.eval_shape(lambda: jax.random.key(0))
        args = (params, params, opt_state, frozen, x0, cond, weights, key)
        shardings = (p_sh, p_sh, o_sh, f_sh, rows_sh, cond_sh, rows_sh, distributed.replicated(mesh))
    donated = (0, 2) if job.method == "grpo" else (0, 1, 2)
    return step, args, shardings, donated, mesh, net


def measure(job: Job, quick: bool) -> dict:
    """Compile the job's step and read XLA's per-device memory and the compile time."""
    begin = time.perf_counter()
    step, args, shardings, donated, mesh, net = build(job, quick)
    built = time.perf_counter()
    jitted = jax.jit(step, in_shardings=shardings, donate_argnums=donated)
    lowered = jitted.lower(*args)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    mem = compiled.memory_analysis()
    arguments, outputs = mem.argument_size_in_bytes, mem.output_size_in_bytes
    temps, aliased = mem.temp_size_in_bytes, mem.alias_size_in_bytes
    total = arguments + outputs + temps - aliased
    trained = sum(a.size for a in jax.tree.leaves(args[0]))
    return {
        **dataclasses.asdict(job),
        "network": models(quick)[job.model].name,
        "parameters": sum(x.size for x in jax.tree.leaves(nnx.state(net, nnx.Param))),
        "trained_parameters": trained,
        "rows": job.prompts * GROUP,
        "arguments_gb": arguments / GB,
        "outputs_gb": outputs / GB,
        "temporaries_gb": temps / GB,
        "aliased_gb": aliased / GB,
        "total_gb": total / GB,
        "fits": {name: total / GB <= capacity for name, capacity in DEVICE_GB.items()},
        "build_s": built - begin,
        "trace_s": lowered_at - built,
        "compile_s": done - lowered_at,
    }


def render(results: list[dict], info: dict) -> str:
    """The ``fit`` section of RESULTS.md."""
    lines = [
        "## fit",
        "",
        f"`python benchmarks/fit.py`: {info['cpu']}, {info['cores']} cores, JAX {info['jax']}, {info['date']}; "
        f"{DEVICES} simulated CPU devices.",
        "",
        "Per device, GB, from XLA's `compiled.memory_analysis()` of the whole training step (one optimiser step; "
        "total = arguments + outputs + temporaries − donated aliases). Trained weights float32 + Adam + the "
        "reference / old copy; frozen weights and compute bfloat16; attention `chunked` unless said.",
        "",
        "| job | network | mesh (data × model) | rows | trained params | remat | scan | attention | arguments | "
        "temporaries | total | fits H200 (141) | fits v5p (95) | trace + compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error'][:120]} |" + " |" * 12)
            continue
        yes = lambda ok: "yes" if ok else "**no**"
        trained = (
            f"{r['trained_parameters'] / 1e9:.2f} B"
            if r["trained_parameters"] > 1e8
            else f"{r['trained_parameters'] / 1e6:.1f} M"
        )
        lines.append(
            f"| {r['name']} | {r['network']} | {r['data']} × {r['tp']} | {r['rows']} | {trained} | {r['remat']} | "
            f"{'yes' if r['scan'] else 'no'} | {r['attention']} | {r['arguments_gb']:.1f} | {r['temporaries_gb']:.1f} | "
            f"{r['total_gb']:.1f} | {yes(r['fits']['H200'])} | {yes(r['fits']['TPU v5p'])} | "
            f"{r['trace_s']:.0f} + {r['compile_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="test sizes: the same jobs and code paths")
    parser.add_argument("--only", default="", help="comma-separated job names (or prefixes of names)")
    parser.add_argument("--out", type=pathlib.Path, help="write the results as JSON")
    parser.add_argument("--results", type=pathlib.Path, help="write the fit section of this RESULTS.md")
    parser.add_argument("--from-json", type=pathlib.Path, help="render the section from a JSON of an earlier run")
    args = parser.parse_args(argv)
    wanted = [p for p in args.only.split(",") if p]
    results = json.loads(args.from_json.read_text()) if args.from_json else []
    names = {job.name for job in jobs()}
    for job in [] if args.from_json else jobs():
        # a whole job name selects that job alone; anything else is a prefix
        if wanted and not any(job.name == p or (p not in names and job.name.startswith(p)) for p in wanted):
            continue
        print(f"[fit] {job.name} ...", flush=True)
        try:
            row = measure(job, args.quick)
        except Exception as error:  # noqa: BLE001 - a job that cannot compile is a result, not a crash
            row = {**dataclasses.asdict(job), "error": f"{type(error).__name__}: {error}"}
        results.append(row)
        print(f"[fit] {json.dumps(row)}", flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    text = render(results, report.machine_info())
    print(text)
    if args.results:
        report.write_section(args.results, "fit", text)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
