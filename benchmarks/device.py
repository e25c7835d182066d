"""One prepared GPU benchmark for a 15-minute lease of one H200; ``--quick`` runs it CPU-sized.

Three sections, one process, contenders side by side, ratios reported:

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

from __future__ import annotations

import os
import sys
import time

PROCESS_START = time.perf_counter()  # the budget counts the imports too

# Before JAX starts: take GPU memory as needed, at most half the card, so that torch has the other half.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
if "--quick" in sys.argv[1:]:  # a smoke test: its timings mean nothing, its compiles are most of its time (~2x less)
    os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")

import argparse
import contextlib
import dataclasses
import datetime
import functools
import gc
import importlib.util
import itertools
import json
import math
import pathlib
import statistics
import traceback

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the sibling benchmarks, and jaxpipe where it is not installed

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from report import RESULTS, machine_info, write_section
from tqdm import tqdm

from jaxpipe.loops import denoise
from jaxpipe.nn import hf
from jaxpipe.nn.flux import FluxCond, FluxConfig, FluxTransformer, image_ids
from jaxpipe.digits import cards as digit_cards
import jaxpipe as jp

SECTION = "device"
SECTIONS = ("flux", "experts", "engine", "attention")
OPTIONAL = ("attention",)  # runs only in what time is left: no earlier piece keeps time for it
DEFAULT_OUT = HERE.parent / "out" / "benchmarks" / "device.json"
PARITY_TOL = 1e-4
TIE = 1.05  # a policy within 5% of the faster one ties with it
EXPERTS, QUICK_EXPERTS = (1, 2, 4, 8, 16), (1, 2)
EXPERT_SIZE, QUICK_EXPERT_SIZE = (4, 4), (1, 2)  # (prompts, group): rollout rows per expert
ENGINE_SIZES, QUICK_ENGINE_SIZES = (1, 4, 16, 64), (2,)
# Expected seconds on one H200, compiles included (estimates from FLOP counts and compile times of similar
# graphs; replace with measured ones): the budget starts a piece only if it still fits.
ESTIMATE_S = {
    "flux": 150, "jax_driven": 10, "torch_eager": 45, "torch_compile": 120,
    "experts": 40, "experts_n": 15, "engine": 20, "engine_n": 15, "attention": 90,
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - PROCESS_START:6.1f}s] {message}", flush=True)


def _optional(name: str):
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


@dataclasses.dataclass
class Budget:
    """The run's wall-clock deadline; ``estimates`` are each piece's expected seconds."""

    seconds: float
    estimates: dict
    start: float = PROCESS_START

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def refuse(self, piece: str, reserve: float = 0.0) -> str | None:
        """Why ``piece`` may not start (its estimate + ``reserve`` exceed the time left), or None."""
        need = self.estimates.get(piece, 0.0)
        if self.left() >= need + reserve:
            return None
        return f"budget: {self.left():.0f} s left, {piece} needs ~{need:.0f} s + {reserve:.0f} s kept for later sections"


class Run:
    """The run's JSON record, saved to ``path`` (if any) after every change."""

    def __init__(self, path: pathlib.Path | None, data: dict):
        self.path, self.data = path, data

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_jsonable))
        tmp.replace(self.path)

    @property
    def failed(self) -> list[str]:
        out = []
        for name, sec in self.data["sections"].items():
            out += [name] if sec.get("status") == "failed" else []
            out += [f"{name}/{k}" for k, c in sec.get("contenders", {}).items() if c.get("status") == "failed"]
        return out


def _jsonable(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def attempt(into: dict, name: str, fn, save, refused: str | None = None) -> dict | None:
    """Run ``fn() -> dict`` as contender ``name``, recording done / skipped (``refused``) / failed in ``into``."""
    if refused:
        into[name] = {"status": "skipped", "reason": refused}
        log(f"{name}: skipped ({refused})")
        save()
        return None
    log(f"{name}: start")
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - one broken contender must not cost the rest of the lease
        into[name] = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:1500],
                      "traceback": traceback.format_exc()[-3000:], "elapsed_s": time.perf_counter() - start}
        log(f"{name}: FAILED {type(err).__name__}: {str(err)[:300]}")
        save()
        return None
    into[name] = {"status": "done", "elapsed_s": time.perf_counter() - start, **out}
    log(f"{name}: done in {into[name]['elapsed_s']:.1f} s " + _brief(out))
    save()
    return out


def _brief(out: dict) -> str:
    keys = ("compile_s", "ms_per_step", "s_per_image", "max_abs_err")
    return " ".join(f"{k}={out[k]:.4g}" for k in keys if isinstance(out.get(k), (int, float)))


def timings(fn, repeats: int) -> dict:
    """``fn`` (which waits for its result) run ``repeats`` times: median and best seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "best_s": min(times), "repeats": repeats}


# --------------------------------------------------------------------------------------------
# FLUX: sizes, the JAX model, the torch model.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FluxSetup:
    """A FLUX transformer config at an image size: latents ``(image/8, image/8, in_channels/4)`` packed 2×2
    into ``(image/16)²`` tokens, ``text_len`` T5 tokens, ``steps`` Euler steps, distilled ``guidance``."""

    name: str
    config: FluxConfig
    image: int
    text_len: int
    steps: int
    batch: int = 1
    guidance: float = 3.5
    shift: float = 3.0  # ~FLUX.1-dev's dynamic shift at 4096 tokens (exp(1.15)); speed does not depend on it

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        return (self.image // 8, self.image // 8, self.config.in_channels // 4)

    @property
    def image_tokens(self) -> int:
        return (self.image // 16) ** 2

    def loop_config(self) -> denoise.DenoiseConfig:
        return denoise.DenoiseConfig(num_steps=self.steps, shift=self.shift, sampler="ode", guidance=1.0)


FULL_FLUX = FluxSetup("FLUX.1-dev", FluxConfig.dev(dtype="bfloat16"), image=1024, text_len=512, steps=28)
QUICK_FLUX = FluxSetup("FLUX tiny", FluxConfig.tiny(dtype="bfloat16"), image=64, text_len=8, steps=4)


def flux_flops(setup: FluxSetup) -> float:
    """Matmul FLOPs of one velocity call (2 per multiply-add): per-token projections, joint attention
    (QKᵀ and PV over ``S = T + L`` tokens) and the per-sample adaLN / embedders."""
    cfg, b = setup.config, setup.batch
    d, mlp, t, l = cfg.inner_dim, 4 * cfg.inner_dim, setup.text_len, setup.image_tokens
    s = t + l
    attention = 4 * s * s * d
    double = 2 * (4 * d * d + 2 * d * mlp) * s + attention  # each stream's q/k/v/out + FFN on its own tokens
    single = 2 * (3 * d * d + d * mlp + (d + mlp) * d) * s + attention
    io = 2 * (cfg.in_channels * d * l + cfg.joint_attention_dim * d * t + d * cfg.output_channels * l)
    per_sample = 2 * d * d * (12 * cfg.num_layers + 3 * cfg.num_single_layers + 2 + 3)
    return float(b * (cfg.num_layers * double + cfg.num_single_layers * single + io + per_sample))


def random_like(abstract, key: jax.Array, chunk: int = 2**28):
    """Random params in ``abstract``'s shapes and dtypes (run it under ``jit``: drawn on the device, in the
    param dtype): kernels ``N(0, 1/fan_in)``, norm scales ``1 + 0.1·N``, biases ``0.02·N``, all non-zero.

    Leaves are cut from a few long draws of at most ``chunk`` values (a draw per leaf compiles ~5x slower
    on a CPU, and one draw for all 12 B would hold a second copy of the weights)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    batches, size = [[]], 0
    for i, (_, leaf) in enumerate(flat):
        if batches[-1] and (size + leaf.size > chunk or leaf.dtype != flat[batches[-1][0]][1].dtype):
            batches.append([])
            size = 0
        batches[-1].append(i)
        size += leaf.size
    leaves = [None] * len(flat)
    for b, batch in enumerate(batches):
        dtype = flat[batch[0]][1].dtype
        z = jax.random.normal(jax.random.fold_in(key, b), (sum(flat[i][1].size for i in batch),), dtype)
        offset = 0
        for i in batch:
            path, leaf = flat[i]
            value = z[offset : offset + leaf.size].reshape(leaf.shape)
            offset += leaf.size
            if leaf.ndim >= 2:
                value = value * (leaf.shape[0] ** -0.5)
            elif "scale" in jax.tree_util.keystr(path):
                value = 1 + 0.1 * value
            else:
                value = 0.02 * value
            leaves[i] = value.astype(dtype)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def abstract_flux(cfg: FluxConfig):
    """``(graphdef, abstract params)`` of a ``FluxTransformer``: shapes only, nothing allocated."""
    return nnx.split(nnx.eval_shape(lambda: FluxTransformer(cfg, rngs=nnx.Rngs(0))))


def flux_state(setup: FluxSetup, seed: int = 0) -> denoise.DenoiseState:
    """The initial denoise state: noise latents ``(B, *latent_shape)``, random T5 text / pooled CLIP, guidance."""
    cfg, b = setup.config, setup.batch
    rng = np.random.default_rng(seed)
    cond = FluxCond(
        text=jnp.asarray(rng.standard_normal((b, setup.text_len, cfg.joint_attention_dim), np.float32)),
        pooled=jnp.asarray(rng.standard_normal((b, cfg.pooled_projection_dim), np.float32)),
        guidance=jnp.full((b,), setup.guidance, jnp.float32),
    )
    keys = jax.random.split(jax.random.key(seed), b)
    return jax.block_until_ready(denoise.init(keys, setup.latent_shape, cond, setup.loop_config()))


def jax_programs(graphdef, config: denoise.DenoiseConfig) -> dict:
    """The JAX contenders as functions of ``(params, state)``, merging inside (no graph walk per call)."""
    return {
        "step": lambda params, state: denoise.step(nnx.merge(graphdef, params), state, config)[0],
        "fused": lambda params, state: denoise.run(nnx.merge(graphdef, params), state, config)[0],
    }


@contextlib.contextmanager
def attention_implementation(implementation: str):
    """While tracing, ``jax.nn.dot_product_attention`` (which ``jaxpipe.nn.flux_blocks`` calls) uses ``implementation``."""
    original = jax.nn.dot_product_attention
    jax.nn.dot_product_attention = functools.partial(original, implementation=implementation)
    try:
        yield
    finally:
        jax.nn.dot_product_attention = original


def aot(fn, *args, attention: str | None = None):
    """``(compiled, seconds)``: ``jax.jit(fn)`` lowered and compiled ahead of time for ``args``."""
    start = time.perf_counter()
    with attention_implementation(attention) if attention else contextlib.nullcontext():
        lowered = jax.jit(fn).lower(*args)
    return lowered.compile(), time.perf_counter() - start


def pack(x):
    """Latents ``(B, h, w, c)`` -> tokens ``(B, h/2·w/2, 4c)``, channel ``4c + 2dy + dx`` (``FluxTransformer.velocity``)."""
    b, h, w, c = x.shape
    return x.reshape(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 5, 2, 4).reshape(b, (h // 2) * (w // 2), 4 * c)


def unpack(tokens, h: int, w: int):
    b, _, c4 = tokens.shape
    return tokens.reshape(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 1, 4, 2, 5, 3).reshape(b, h, w, c4 // 4)


def torch_flux(cfg: FluxConfig, torch, device: str, dtype, seed: int = 0):
    """diffusers' ``FluxTransformer2DModel`` of ``cfg`` in ``dtype`` on ``device``: built on ``meta`` (free),
    cast there, then (unless ``device`` is ``"meta"``) ``to_empty`` (one allocation, in ``dtype``) and filled
    like ``random_like``."""
    from diffusers import FluxTransformer2DModel
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # its warning about .to(dtype) concerns from_pretrained's fp32 modules: none here
    kwargs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "dtype"}
    kwargs["axes_dims_rope"] = list(cfg.axes_dims_rope)
    with torch.device("meta"):
        model = FluxTransformer2DModel(**kwargs).to(dtype).eval().requires_grad_(False)
    if device == "meta":
        return model
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(generator=gen)
            if p.ndim >= 2:  # torch Linear weights are (out, in)
                p.mul_(p.shape[1] ** -0.5)
            elif name.endswith("weight"):  # the q/k RMSNorm scales
                p.mul_(0.1).add_(1.0)
            else:
                p.mul_(0.02)
    return model


def torch_inputs(setup: FluxSetup, torch, device: str, dtype, seed: int = 0) -> tuple:
    """``(x0 packed float32, model kwargs, per-step timesteps, per-step dt)`` on ``device``; dt as Python floats
    and every tensor made here, so the loop neither syncs nor recompiles."""
    cfg, b = setup.config, setup.batch
    gen = torch.Generator(device=device).manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen, device=device)
    h, w, _ = setup.latent_shape
    kwargs = {
        "encoder_hidden_states": rand(b, setup.text_len, cfg.joint_attention_dim).to(dtype),
        "pooled_projections": rand(b, cfg.pooled_projection_dim).to(dtype),
        "guidance": torch.full((b,), setup.guidance, device=device),
        "img_ids": torch.from_numpy(image_ids(h // 2, w // 2)).to(device),
        "txt_ids": torch.zeros(setup.text_len, 3, device=device),
    }
    from jaxpipe import samplers

    sigmas = np.asarray(samplers.flow_sigmas(setup.steps, setup.shift), np.float32)
    timesteps = [torch.full((b,), float(s), device=device) for s in sigmas[:-1]]
    dts = [float(s1 - s0) for s0, s1 in itertools.pairwise(sigmas)]
    return rand(b, setup.image_tokens, cfg.in_channels), kwargs, timesteps, dts


def torch_euler(model, x, kwargs: dict, timesteps, dts, torch, dtype):
    """The diffusers-style loop: packed float32 latents, ``x += dt·v`` per step (the model runs in ``dtype``)."""
    with torch.no_grad():
        for t, dt in zip(timesteps, dts):
            v = model(hidden_states=x.to(dtype), timestep=t, return_dict=False, **kwargs)[0]
            x = x + dt * v.float()
    return x


def parity_check(torch, seed: int = 0) -> dict:
    """The torch contender is jaxpipe's network: tiny FLUX in float32 on the CPU, torch weights (all random)
    loaded into JAX; ``velocity(x)`` vs ``unpack(torch(pack(x)))`` within ``PARITY_TOL``·max(1, |v|)."""
    cfg, b, h, w, t = FluxConfig.tiny(), 2, 8, 6, 5
    cpu = jax.devices("cpu")[0]
    tmodel = torch_flux(cfg, torch, "cpu", torch.float32, seed)
    tensors = {k: v.numpy() for k, v in tmodel.state_dict().items()}
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, h, w, cfg.in_channels // 4)).astype(np.float32)
    text = rng.standard_normal((b, t, cfg.joint_attention_dim)).astype(np.float32)
    pooled = rng.standard_normal((b, cfg.pooled_projection_dim)).astype(np.float32)
    sigma, guidance = np.array([0.3, 0.9], np.float32), np.array([3.5, 1.0], np.float32)
    with jax.default_device(cpu):
        model = hf.load_into(nnx.eval_shape(lambda: FluxTransformer(cfg, rngs=nnx.Rngs(0))), tensors)
        velocity = jax.jit(lambda m, *a: m.velocity(a[0], a[1], FluxCond(*a[2:])))
        ours = np.asarray(velocity(model, x, sigma, text, pooled, guidance))
    with torch.no_grad():
        out = tmodel(hidden_states=pack(torch.from_numpy(x)), encoder_hidden_states=torch.from_numpy(text),
                     pooled_projections=torch.from_numpy(pooled), timestep=torch.from_numpy(sigma),
                     img_ids=torch.from_numpy(image_ids(h // 2, w // 2)), txt_ids=torch.zeros(t, 3),
                     guidance=torch.from_numpy(guidance), return_dict=False)[0]
    ref = unpack(out, h, w).numpy()
    err, scale = float(np.max(np.abs(ours - ref))), float(np.max(np.abs(ref)))
    if not err <= PARITY_TOL * max(1.0, scale):
        raise AssertionError(f"diffusers' FLUX differs from jaxpipe's: max abs error {err:.2e} (|v| up to {scale:.2f})")
    return {"max_abs_err": err, "velocity_scale": scale, "config": "FluxConfig.tiny(), float32, CPU"}


# --------------------------------------------------------------------------------------------
# Sections.
# --------------------------------------------------------------------------------------------


def setup_of(args) -> FluxSetup:
    return QUICK_FLUX if args.quick else FULL_FLUX


def flux_facts(setup: FluxSetup) -> dict:
    cfg = setup.config
    leaves = jax.tree.leaves(abstract_flux(cfg)[1])
    return {
        "name": setup.name, "dtype": cfg.dtype, "image": setup.image, "latents": [setup.batch, *setup.latent_shape],
        "image_tokens": setup.image_tokens, "text_tokens": setup.text_len, "steps": setup.steps, "batch": setup.batch,
        "params": int(sum(x.size for x in leaves)), "param_bytes": int(sum(x.size * x.dtype.itemsize for x in leaves)),
        "flops_per_step": flux_flops(setup), "width": cfg.inner_dim,
        "blocks": f"{cfg.num_layers} double + {cfg.num_single_layers} single",
    }


def jax_flux(setup: FluxSetup) -> dict:
    """The JAX side: random bf16 params made on the device (one jit), the initial state, the two programs."""
    start = time.perf_counter()
    graphdef, abstract = abstract_flux(setup.config)
    params = jax.block_until_ready(jax.jit(functools.partial(random_like, abstract))(jax.random.key(0)))
    made = {"params": params, "state": flux_state(setup), "programs": jax_programs(graphdef, setup.loop_config())}
    return {**made, "init_s": time.perf_counter() - start}


def init_into(jx: dict, setup: FluxSetup) -> dict:
    jx.update(jax_flux(setup))
    return {"init_s": jx.pop("init_s")}


def time_jax_step(jx: dict, setup: FluxSetup, repeats: int, attention: str | None = None) -> tuple[dict, object]:
    """The jitted ``denoise.step`` compiled ahead of time (``attention``: the implementation patched into
    ``jax.nn.dot_product_attention`` while tracing), its first call, then ``repeats`` timed calls from step 0."""
    params, state = jx["params"], jx["state"]
    fn, compile_s = aot(jx["programs"]["step"], params, state, attention=attention)
    first = timings(lambda: jax.block_until_ready(fn(params, state).x), 1)["best_s"]
    t = timings(lambda: jax.block_until_ready(fn(params, state).x), repeats)
    return {"compile_s": compile_s, "first_s": first, **t, "ms_per_step": t["median_s"] * 1e3,
            "tflops": flux_flops(setup) / t["median_s"] / 1e12}, fn


def section_flux(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """Parity, then JAX step / fused / driven, torch eager / compiled, side by side; frees everything after."""
    setup = setup_of(args)
    cfg, steps = setup.config, setup.steps
    sec["setup"] = flux_facts(setup)
    runs = sec.setdefault("contenders", {})
    torch = _optional("torch")
    diffusers = _optional("diffusers") if torch else None
    no_torch = None if diffusers else f"{'torch' if torch is None else 'diffusers'} is not installed"
    attempt(runs, "parity", lambda: parity_check(torch), save, no_torch)

    jx, step = {}, {}
    if attempt(runs, "jax_init", functools.partial(init_into, jx, setup), save) is None:
        return
    reps = (5, 3, 3) if args.quick else (10, 3, 2)  # step, fused, driven / torch loops
    per_image = lambda t: {**t, "s_per_image": t["median_s"], "ms_per_step": t["median_s"] / steps * 1e3,
                           "tflops": flux_flops(setup) * steps / t["median_s"] / 1e12}

    def jax_step():
        out, step["fn"] = time_jax_step(jx, setup, reps[0])
        return out

    def jax_fused():
        params, state = jx["params"], jx["state"]
        fn, compile_s = aot(jx["programs"]["fused"], params, state)
        start = time.perf_counter()
        out = jax.block_until_ready(fn(params, state).x)
        first = time.perf_counter() - start
        t = timings(lambda: jax.block_until_ready(fn(params, state).x), reps[1])
        return {"compile_s": compile_s, "first_s": first, **per_image(t), "finite": bool(jnp.all(jnp.isfinite(out))),
                "x_abs_max": float(jnp.max(jnp.abs(out)))}

    def jax_driven():
        def loop():
            s = jx["state"]
            for _ in range(steps):
                s = step["fn"](jx["params"], s)
            jax.block_until_ready(s.x)

        return per_image(timings(loop, reps[2]))

    attempt(runs, "jax_step", jax_step, save)
    attempt(runs, "jax_fused", jax_fused, save)
    attempt(runs, "jax_driven", jax_driven, save,
            "the jitted step failed" if "fn" not in step else budget.refuse("jax_driven", reserve))
    jx.clear()
    step.clear()
    gc.collect()  # the JAX weights go before torch's arrive

    device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if torch is not None and device == "cpu" and args.quick:
        torch.set_num_threads(1)  # OpenMP threads stall when other processes hold the cores (see the denoise notes)
    if no_torch is None:
        sec["torch"] = {"device": device, "torch": torch.__version__, "diffusers": diffusers.__version__,
                        "threads": torch.get_num_threads(),
                        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}
    tmade = {}

    def torch_loop(compile_mode: str | None):
        def go():
            dtype = torch.bfloat16
            if "model" not in tmade:
                start = time.perf_counter()
                tmade["model"] = torch_flux(cfg, torch, device, dtype)
                tmade["inputs"] = torch_inputs(setup, torch, device, dtype)
                tmade["build_s"] = time.perf_counter() - start
            model = tmade["model"] if compile_mode is None else torch.compile(
                tmade["model"], mode=None if compile_mode == "default" else compile_mode)
            x0, kwargs, timesteps, dts = tmade["inputs"]
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

            def loop():
                out = torch_euler(model, x0, kwargs, timesteps, dts, torch, dtype)
                sync()
                return out

            start = time.perf_counter()
            out = loop()  # eager: lazy CUDA / cuBLAS set-up; compiled: the compile
            first = time.perf_counter() - start
            t = timings(loop, reps[2])
            extra = {"mode": compile_mode, "compile_s": first - t["median_s"]} if compile_mode else {}
            return {"build_s": tmade["build_s"], "first_s": first, **per_image(t), **extra,
                    "finite": bool(torch.isfinite(out).all())}
        return go

    attempt(runs, "torch_eager", torch_loop(None), save, no_torch or budget.refuse("torch_eager", reserve))
    no_compile = no_torch or (None if (args.compile if args.compile is not None else device == "cuda")
                              else "torch.compile on a CPU run is off (pass --compile)")
    attempt(runs, "torch_compile", torch_loop(args.compile_mode), save,
            no_compile or budget.refuse("torch_compile", reserve))
    tmade.clear()
    if no_torch is None:
        torch._dynamo.reset()  # compiled graphs hold the model's weights
        if device == "cuda":
            torch.cuda.empty_cache()
    gc.collect()
    jax.clear_caches()


def section_attention(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """The jitted step again with cuDNN's fused attention patched into ``jax.nn.dot_product_attention`` (jaxpipe
    calls it with XLA's default, which materialises the scores): the flux section's ``jax_step`` is the baseline."""
    setup = setup_of(args)
    sec["setup"] = flux_facts(setup)
    runs = sec.setdefault("contenders", {})
    jx = {}
    if attempt(runs, "jax_init", functools.partial(init_into, jx, setup), save) is None:
        return
    attempt(runs, "jax_step_cudnn", lambda: time_jax_step(jx, setup, 5 if args.quick else 10, "cudnn")[0], save)
    jx.clear()
    gc.collect()
    jax.clear_caches()


def section_experts(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """vmap vs lax.map vs a Python loop for the N refiner updates, checked equal, timed in interleaved rounds."""
    import joint_rl as jr

    from jaxpipe.training.methods.joint_rl import map_experts, resolve_expert_map

    ns = QUICK_EXPERTS if args.quick else EXPERTS
    prompts, group = QUICK_EXPERT_SIZE if args.quick else EXPERT_SIZE
    auto = resolve_expert_map("auto")
    sec["setup"] = {"experts": list(ns), "prompts": prompts, "group": group, "rows": prompts * group,
                    "auto": auto, "backend": jax.default_backend(), "devices": jax.device_count()}
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
        log(f"experts N={n}: prepared in {time.perf_counter() - start:.1f} s, compile s "
            + ", ".join(f"{k} {v:.1f}" for k, v in compile_s.items()) + f", max diff {diff:.1e}")
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
        rows.append({"n": case.experts, "median_ms": med, "best_ms": best, "compile_s": case.compile_s,
                     "max_diff": case.max_diff, "winner": winner, "policy_winner": policy, "auto_agrees": agrees})
        log(f"experts N={case.experts}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
            + f" -> {winner} wins; of the policies {policy}; auto picks {auto}: "
            + ("agrees" if agrees else "CONTRADICTS"))
    sec["rows"], sec["rounds"] = rows, rounds
    sec["verdict"] = expert_verdict(rows, auto) + (
        " (--quick: a CPU-sized card and two rounds; noise, not a verdict)" if args.quick else "")
    print(sec["verdict"], flush=True)


def expert_verdict(rows: list[dict], auto: str) -> str:
    backend = jax.default_backend()
    against = [r for r in rows if not r["auto_agrees"]]
    if not against:
        return (f"expert_map='auto' resolves to '{auto}' on this backend ({backend}, {jax.device_count()} device(s)), "
                f"and '{auto}' is the faster policy (or within {TIE - 1:.0%} of it) at every N measured: auto should "
                "(and does) pick it here.")
    ns = ", ".join(str(r["n"]) for r in against)
    other = against[-1]["policy_winner"]
    worst = max(r["median_ms"][auto] / r["median_ms"][r["policy_winner"]] for r in against)
    return (f"The measurement CONTRADICTS expert_map='auto' on this backend ({backend}): auto picks '{auto}', but "
            f"'{other}' is faster at N = {ns} (auto's choice up to {worst:.2f}× slower); auto should pick the measured "
            f"winner here (jaxpipe.training.methods.joint_rl.resolve_expert_map).")


def section_engine(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """``engine.measure`` per size (batched / serial / fused, C3-checked) and the raw step cost by batch."""
    import engine as eng

    import jaxpipe as jp

    if args.quick:
        card, source = eng._perturbed(jp.cards.build("flux-t2i"), 1), "random weights, test size"
    elif "flux-t2i" in jp.cards.available():
        card, source = jp.cards.load("flux-t2i"), "bundled checkpoint"
    else:
        card, source = eng._perturbed(jp.cards.build("flux-t2i", config=digit_cards.bundled_config("flux-t2i")), 1), "random, bundled size"
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
        row = eng.measure(engine, n, 3 if args.quick else 5, budget_s=1.0 if args.quick else 8.0)  # 3: a resize may compile once
        rows.append(row)
        sec["rows"] = rows
        save()
        med = row["median"]
        log(f"engine N={n}: serial {med['serial'] * 1e3:.1f} ms, batched {med['batched'] * 1e3:.1f} ms, fused "
            f"{med['fused'] * 1e3:.1f} ms; batched/serial {row['ratio']:.2f}x; C3 passed {row['c3_passed']}")
    sec["skipped_n"] = skipped
    if not args.quick and not budget.refuse("engine_n", reserve):
        sec["scaling_ms"] = {str(b): v for b, v in eng.step_scaling(card).items()}


# --------------------------------------------------------------------------------------------
# Dry run: the full-size setup abstractly.
# --------------------------------------------------------------------------------------------


def dry_run(args) -> dict:
    """Build the FLUX section's models and programs abstractly (``nnx.eval_shape``, ``jit(...).lower`` on
    abstract params, torch on ``meta``): shapes, counts, FLOPs, memory and the time plan, nothing allocated."""
    setup = QUICK_FLUX if args.quick else FULL_FLUX
    cfg, info = setup.config, {}
    graphdef, abstract = abstract_flux(cfg)
    leaves = jax.tree.leaves(abstract)
    info["params"] = int(sum(x.size for x in leaves))
    info["param_gb"] = sum(x.size * x.dtype.itemsize for x in leaves) / 1e9
    info["param_dtypes"] = sorted({str(x.dtype) for x in leaves})
    log(f"{setup.name}: {info['params']:,} params, {info['param_gb']:.2f} GB in {info['param_dtypes']}")
    made = jax.eval_shape(jax.jit(functools.partial(random_like, abstract)), jax.random.key(0))
    same = jax.tree.map(lambda a, b: a.shape == b.shape and a.dtype == b.dtype, made, abstract)
    info["init_matches_abstract"] = all(jax.tree.leaves(same))
    state = flux_state(setup)
    info["latents"], info["text"] = list(state.x.shape), list(state.cond.text.shape)
    for name, fn in jax_programs(graphdef, setup.loop_config()).items():
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(abstract, state)
        cost = lowered.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        info[f"{name}_lower_s"] = time.perf_counter() - start
        info[f"{name}_xla_flops"] = float(cost.get("flops", float("nan")))  # a scan's body is counted once
        out = lowered.out_info.x
        info[f"{name}_out"] = [list(out.shape), str(out.dtype)]
        log(f"jit({name}) lowered on abstract params in {info[f'{name}_lower_s']:.1f} s: x {info[f'{name}_out']}, "
            f"XLA cost analysis {info[f'{name}_xla_flops']:.3e} FLOP")
    info["flops_per_step"] = flux_flops(setup)
    heads, s = cfg.num_attention_heads, setup.text_len + setup.image_tokens
    info["xla_attention_scores_gb"] = setup.batch * heads * s * s * 4 / 1e9  # float32 logits of one layer
    torch = _optional("torch")
    if torch is not None and _optional("diffusers") is not None:
        try:
            meta = torch_flux_meta(setup, torch)
            info.update(meta)
        except Exception as err:  # noqa: BLE001 - a dry run reports what it could not check
            info["torch_meta_error"] = f"{type(err).__name__}: {err}"[:500]
    else:
        info["torch_meta_error"] = "torch / diffusers not installed"
    info["plan"] = plan(args.budget_s, args.sections)
    for key, value in info.items():
        print(f"  {key}: {value}")
    return info


def plan(budget_s: float, sections) -> list[str]:
    """What a GPU run would start or skip if every piece took its ``ESTIMATE_S`` (the run's own rules)."""
    est, t, out = ESTIMATE_S, 0.0, []
    order = [s for s in SECTIONS if s in sections]

    def piece(name: str, reserve: float, label: str) -> bool:
        nonlocal t
        fits = budget_s - t >= est[name] + reserve
        t += est[name] if fits else 0.0
        out.append(f"{label}: " + (f"ends ~{t:.0f} s" if fits else f"SKIPPED ({budget_s - t:.0f} s left)"))
        return fits

    for i, name in enumerate(order):
        reserve = sum(expected_s(est, s, False) for s in order[i + 1 :] if s not in OPTIONAL)
        if not piece(name, reserve, f"{name} (start{', JAX step + fused' if name == 'flux' else ''})"):
            continue
        if name == "flux":
            for optional in ("jax_driven", "torch_eager", "torch_compile"):
                piece(optional, reserve, optional)
        elif name == "experts":
            for n in EXPERTS:
                piece("experts_n", reserve, f"experts N={n}")
            t += max(5.0, min(30.0, budget_s - t - reserve - 10))
            out.append(f"experts timing rounds: end ~{t:.0f} s")
        elif name == "engine":
            for n in ENGINE_SIZES:
                piece("engine_n", reserve, f"engine N={n}")
            piece("engine_n", reserve, "engine step scaling")
    return out


def torch_flux_meta(setup: FluxSetup, torch) -> dict:
    """diffusers' model of ``setup`` on ``meta`` in bfloat16: its parameter count, and one step of the timed
    torch loop (``torch_euler``) run on ``meta`` inputs: the contender's code at full size, nothing allocated."""
    dtype = torch.bfloat16
    model = torch_flux(setup.config, torch, "meta", dtype)
    x, kwargs, timesteps, dts = torch_inputs(setup, torch, "cpu", dtype)
    meta = lambda t: t.to("meta")
    out = torch_euler(model, meta(x), {k: meta(v) for k, v in kwargs.items()}, [meta(timesteps[0])], dts[:1], torch, dtype)
    count = sum(p.numel() for p in model.parameters())
    log(f"diffusers FluxTransformer2DModel on meta: {count:,} params; one torch_euler step -> {tuple(out.shape)} {out.dtype}")
    return {"torch_params": count, "torch_step_out": [list(out.shape), str(out.dtype)]}


# --------------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------------


FLUX_ROWS = {
    "jax_fused": "JAX fused `lax.scan` (`jit(denoise.run)`)",
    "jax_driven": "JAX Python loop of the jitted step",
    "jax_step": "JAX one jitted `denoise.step` (×steps)",
    "jax_step_cudnn": "JAX step, cuDNN attention patched in (×steps)",
    "torch_eager": "diffusers torch eager, Python loop",
    "torch_compile": "diffusers `torch.compile`, Python loop",
}


def _f(value, fmt: str = ".2f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and math.isfinite(value) else "–"


def render_flux(sec: dict, attention: dict) -> list[str]:
    """The FLUX table; the attention section's cuDNN step is its row (or why it did not run)."""
    s, runs = sec.get("setup", {}), dict(sec.get("contenders", {}))
    if not s:
        return []
    cudnn = attention.get("contenders", {}).get("jax_step_cudnn")
    runs["jax_step_cudnn"] = cudnn or {"status": attention.get("status", "not run"), "reason": attention.get("reason")}
    steps = s["steps"]
    fused = runs.get("jax_fused", {}).get("ms_per_step")
    lines = [
        (f"### {s['name']} transformer ({s['blocks']} blocks, width {s['width']}, {s['params']:,} params, "
         f"{s['param_bytes'] / 1e9:.3g} GB {s['dtype']}): {s['image']}² image -> latents {tuple(s['latents'])} -> "
         f"{s['image_tokens']} image + {s['text_tokens']} text tokens, batch {s['batch']}, {steps} Euler steps, "
         f"{s['flops_per_step'] / 1e12:.3g} TFLOP per step"),
        "",
        "| contender | compile s | first run s | ms / step | s / image | time / JAX fused | TFLOP/s | repeats | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, label in FLUX_ROWS.items():
        r = runs.get(key, {})
        ms = r.get("ms_per_step")
        status = r.get("status", "not run")
        if status != "done" and (r.get("reason") or r.get("error")):
            status += f": {r.get('reason') or r.get('error')}"[:160]
        if key == "torch_compile" and r.get("mode"):
            label += f" (mode `{r['mode']}`)"
        lines.append(
            f"| {label} | {_f(r.get('compile_s'), '.1f')} | {_f(r.get('first_s'), '.1f')} | {_f(ms)} | "
            f"{_f(ms * steps / 1e3 if ms else None, '.3f')} | {_f(ms / fused if ms and fused else None)}× | "
            f"{_f(r.get('tflops'), '.3g')} | {r.get('repeats', '–')} | {status} |"
        )
    p = runs.get("parity", {})
    init = runs.get("jax_init", {})
    lines += ["", f"JAX weights made on the device in {_f(init.get('init_s'), '.1f')} s; torch model built and filled "
              f"in {_f(runs.get('torch_eager', {}).get('build_s'), '.1f')} s. "
              + (f"Torch network checked against jaxpipe's ({p['config']}): max abs error {p['max_abs_err']:.1e} "
                 f"(|v| up to {p['velocity_scale']:.2f})." if p.get("status") == "done"
                 else f"Parity check: {p.get('status', 'not run')} {p.get('reason') or p.get('error', '')}.")]
    xla, fast = runs.get("jax_step", {}).get("ms_per_step"), runs["jax_step_cudnn"].get("ms_per_step")
    if xla and fast:
        lines.append(f"Attention: the jitted step takes {xla:.1f} ms with XLA's attention (jaxpipe's default) and "
                     f"{fast:.1f} ms with cuDNN's fused attention: {xla / fast:.2f}×.")
    t = sec.get("torch")
    if t:
        lines.append(f"torch {t['torch']}, diffusers {t['diffusers']} on {t['gpu'] or t['device']} ({t['threads']} CPU threads).")
    return lines


def render_experts(sec: dict) -> list[str]:
    s, rows = sec.get("setup", {}), sec.get("rows", [])
    if not rows:
        return []
    lines = [
        f"### N-way refiner update: {s['prompts']} prompts × {s['group']} samples ({s['rows']} rows) per expert",
        "",
        s.get("about", ""),
        "",
        ("| N | vmap ms | map ms | loop ms | map / vmap | loop / vmap | fastest | faster policy | auto picks | "
         "compile s (vmap / map / one expert) | max abs diff |"),
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
    lines += ["", f"Medians of {sec.get('rounds')} interleaved rounds; vmap == map == loop checked within 1e-6 first."
              + (f" Skipped N: {', '.join(skipped)} (budget)." if skipped else ""), "", sec.get("verdict", "")]
    return lines


def render_engine(sec: dict) -> list[str]:
    s, rows = sec.get("setup", {}), sec.get("rows", [])
    if not rows:
        return []
    lines = [
        f"### Engine: {s['card']} ({s['about']}; {s['source']}), mixed step counts {s['step_counts']}",
        "",
        ("| N | steps | serial ms | batched ms | fused ms | batched req/s | batched / serial | batched / fused | "
         "compile s (serial / batched / fused) | C3 passed | repeats |"),
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
        lines += ["", "Raw denoise cost, ms per request-step by batch: "
                  + ", ".join(f"{b}: {v:.3f}" for b, v in sec["scaling_ms"].items())]
    return lines


def render(data: dict) -> str:
    quick = data["args"].get("quick")
    lines = [
        "## device",
        "",
        "`python benchmarks/device.py`: one process on one accelerator, contenders side by side. FLUX: jaxpipe's",
        "FLUX.1 transformer (random bf16 weights) under the fused `lax.scan` vs a Python loop of its jitted step vs",
        "diffusers' `FluxTransformer2DModel` in torch bf16 (eager and `torch.compile`); ms per step = median wall time",
        "of whole runs / steps; compile = trace + XLA compile (JAX) or first run − steady run (torch). Experts: the",
        "N refiner updates as one `jax.vmap`, one `lax.map` and a Python loop. Engine: `benchmarks/engine.py`'s",
        "`measure`. Sections that did not fit the time budget are listed as skipped.",
        "",
        *[f"- {k}: {v}" for k, v in data["machine"].items()],
        f"- budget: {data['args']['budget_s']:.0f} s; whole run: {data.get('elapsed_s', float('nan')):.0f} s"
        + (" (--quick: CPU-sized)" if quick else ""),
        "",
        "| section | status | started at s | took s | note |",
        "|---|---|---:|---:|---|",
    ]
    for name, sec in data["sections"].items():
        note = sec.get("reason") or sec.get("error", "")
        lines.append(f"| {name} | {sec.get('status')} | {_f(sec.get('start_s'), '.0f')} | {_f(sec.get('elapsed_s'), '.0f')} "
                     f"| {note[:200]} |")
    secs = data["sections"]
    for part in (render_flux(secs.get("flux", {}), secs.get("attention", {})), render_experts(secs.get("experts", {})),
                 render_engine(secs.get("engine", {}))):
        if part:
            lines += [""] + part
    return "\n".join(lines) + "\n"


def summary(data: dict) -> str:
    """The few numbers that matter, for the end of the log."""
    out = []
    secs = data["sections"]
    runs = {**secs.get("flux", {}).get("contenders", {}), **secs.get("attention", {}).get("contenders", {})}
    fused = runs.get("jax_fused", {}).get("ms_per_step")
    for key in FLUX_ROWS:
        r = runs.get(key) or (secs.get("attention", {}) if key == "jax_step_cudnn" else {})
        ms = r.get("ms_per_step")
        ratio = f" ({ms / fused:.2f}x jax fused)" if ms and fused else ""
        out.append(f"flux {key}: {r.get('status', 'not run')}" + (f", {ms:.2f} ms/step{ratio}" if ms else ""))
    for r in data["sections"].get("experts", {}).get("rows", []):
        out.append(f"experts N={r['n']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["median_ms"].items())
                   + f" ms -> {r['winner']}; auto {'agrees' if r['auto_agrees'] else 'CONTRADICTS'}")
    for r in data["sections"].get("engine", {}).get("rows", []):
        out.append(f"engine N={r['n']}: batched/serial {r['ratio']:.2f}x, batched/fused {r['ratio_fused']:.2f}x")
    out.append("failed: " + (", ".join(Run(None, data).failed) or "none"))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Main.
# --------------------------------------------------------------------------------------------


RUNNERS = {"flux": section_flux, "experts": section_experts, "engine": section_engine, "attention": section_attention}


def expected_s(estimates: dict, section: str, quick: bool) -> float:
    """A section's whole expected time: its start-up plus each N / size (and the experts' timing rounds)."""
    if section == "experts":
        return estimates["experts"] + estimates["experts_n"] * len(QUICK_EXPERTS if quick else EXPERTS) + 15
    if section == "engine":
        return estimates["engine"] + estimates["engine_n"] * (len(QUICK_ENGINE_SIZES if quick else ENGINE_SIZES) + 1)
    return estimates[section]


def unavailable(section: str, args) -> str | None:
    """Why ``section`` cannot run on this backend at all, or None."""
    cpu = jax.default_backend() == "cpu"
    if section in ("flux", "attention") and cpu and not args.quick:
        return "FLUX.1-dev at 1024² on a CPU: use --quick or --dry-run here"
    if section == "attention" and jax.default_backend() != "gpu":
        return "cuDNN attention needs a GPU"
    return None


def machine() -> dict:
    from importlib import metadata

    extra = {"device": jax.devices()[0].device_kind, "devices": jax.device_count()}
    for name in ("flax", "torch", "diffusers"):
        try:
            extra[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            extra[name] = "not installed"
    extra["XLA_FLAGS"] = os.environ.get("XLA_FLAGS") or "(unset)"
    return machine_info(**extra)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU-sized: tiny FLUX, 4 steps, N in (1, 2), 2 engine sizes")
    parser.add_argument("--dry-run", action="store_true", help="build the full-size FLUX setup abstractly and print the plan")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--budget-s", type=float, default=570.0,
                        help="skip what no longer fits this many seconds after the start (the JSON keeps what ran)")
    parser.add_argument("--out", type=pathlib.Path, default=None, help=f"the JSON (default: {DEFAULT_OUT} on full runs)")
    parser.add_argument("--results", type=pathlib.Path, default=None,
                        help=f"write the markdown section here (default: {RESULTS.name} on full runs)")
    parser.add_argument("--no-results", action="store_true", help="write no markdown section")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="time torch.compile (default: on a GPU only)")
    parser.add_argument("--compile-mode", default="default", help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    parser.add_argument("--from-json", type=pathlib.Path, default=None, help="only render a saved run's JSON")
    args = parser.parse_args(argv)
    results = None if args.no_results else args.results or (None if args.quick or args.dry_run else RESULTS)

    if args.from_json:
        data = json.loads(args.from_json.read_text())
        write_section(args.results or RESULTS, SECTION, render(data))
        print(f"wrote the {SECTION} section of {args.results or RESULTS} from {args.from_json}\n{summary(data)}")
        return 0
    info = machine()
    log("machine: " + ", ".join(f"{k}={v}" for k, v in info.items()))
    if args.dry_run:
        plan = dry_run(args)
        if args.out:
            Run(args.out, {"machine": info, "dry_run": plan}).save()
        return 0

    out = args.out or (None if args.quick else DEFAULT_OUT)
    args_record = {"quick": args.quick, "sections": args.sections, "budget_s": args.budget_s,
                   "compile": args.compile, "compile_mode": args.compile_mode, "argv": sys.argv[1:] if argv is None else argv}
    run = Run(out, {"machine": info, "args": args_record, "sections": {}})
    budget = Budget(args.budget_s, {k: 1.0 for k in ESTIMATE_S} if args.quick else dict(ESTIMATE_S))
    chosen = [s for s in SECTIONS if s in args.sections]
    for i, name in enumerate(chosen):
        reserve = sum(expected_s(budget.estimates, s, args.quick) for s in chosen[i + 1 :] if s not in OPTIONAL)
        sec = run.data["sections"].setdefault(name, {})
        sec["start_s"] = budget.seconds - budget.left()
        sec["start_utc"] = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
        refused = budget.refuse(name, reserve) or unavailable(name, args)
        if refused:
            sec.update(status="skipped", reason=refused)
            log(f"section {name}: skipped ({refused})")
            run.save()
            continue
        log(f"section {name}: start ({budget.left():.0f} s left, {reserve:.0f} s kept for later sections)")
        try:
            RUNNERS[name](args, budget, sec, run.save, reserve)
            sec["status"] = "done"
        except Exception as err:  # noqa: BLE001 - a broken section must not cost the others
            sec.update(status="failed", error=f"{type(err).__name__}: {err}"[:1500], traceback=traceback.format_exc()[-3000:])
            log(f"section {name}: FAILED {type(err).__name__}: {str(err)[:300]}")
        sec["elapsed_s"] = budget.seconds - budget.left() - sec["start_s"]
        log(f"section {name}: {sec['status']} in {sec['elapsed_s']:.1f} s")
        run.save()
    run.data["elapsed_s"] = time.perf_counter() - PROCESS_START
    run.save()
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
