"""``device.py``'s ``flux`` and ``attention`` sections: one FLUX.1-dev image, jaxpipe against diffusers.

``flux``: FLUX.1-dev's transformer (random bfloat16 weights) at 1024², 28 Euler steps, timed as jaxpipe's
jitted ``denoise.step``, a Python loop of it, the fused ``lax.scan`` (``denoise.run``), and diffusers'
``FluxTransformer2DModel`` in torch bfloat16, eager and under ``torch.compile``, after checking that the torch
network is jaxpipe's. ``attention``: the jitted step again with cuDNN's fused attention patched into
``jax.nn.dot_product_attention``, to size what XLA's materialised attention scores cost; it is optional and
reported as a row of the flux table. The models themselves are in ``device_flux_models.py``.
"""

from __future__ import annotations

import functools
import gc
import time

import jax
import jax.numpy as jnp
from device_flux_models import (
    FULL_FLUX,
    QUICK_FLUX,
    abstract_flux,
    aot,
    flux_facts,
    flux_flops,
    flux_state,
    init_into,
    jax_programs,
    parity_check,
    random_like,
    setup_of,
    time_jax_step,
    torch_euler,
    torch_flux,
    torch_flux_meta,
    torch_inputs,
)
from device_harness import (
    Budget,
    Plan,
    Section,
    attempt,
    log,
    num,
    optional_module,
    timings,
)


def section_flux(args, budget: Budget, sec: dict, save, reserve: float) -> None:
    """Parity, then JAX step / fused / driven, torch eager / compiled, side by side; frees everything after."""
    setup = setup_of(args)
    cfg, steps = setup.config, setup.steps
    sec["setup"] = flux_facts(setup)
    runs = sec.setdefault("contenders", {})
    torch = optional_module("torch")
    diffusers = optional_module("diffusers") if torch else None
    no_torch = None if diffusers else f"{'torch' if torch is None else 'diffusers'} is not installed"
    attempt(runs, "parity", lambda: parity_check(torch), save, no_torch)

    jx, step = {}, {}
    if attempt(runs, "jax_init", functools.partial(init_into, jx, setup), save) is None:
        return
    reps = (5, 3, 3) if args.quick else (10, 3, 2)  # step, fused, driven / torch loops
    per_image = lambda t: {
        **t,
        "s_per_image": t["median_s"],
        "ms_per_step": t["median_s"] / steps * 1e3,
        "tflops": flux_flops(setup) * steps / t["median_s"] / 1e12,
    }

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
        return {
            "compile_s": compile_s,
            "first_s": first,
            **per_image(t),
            "finite": bool(jnp.all(jnp.isfinite(out))),
            "x_abs_max": float(jnp.max(jnp.abs(out))),
        }

    def jax_driven():
        def loop():
            s = jx["state"]
            for _ in range(steps):
                s = step["fn"](jx["params"], s)
            jax.block_until_ready(s.x)

        return per_image(timings(loop, reps[2]))

    attempt(runs, "jax_step", jax_step, save)
    attempt(runs, "jax_fused", jax_fused, save)
    attempt(
        runs,
        "jax_driven",
        jax_driven,
        save,
        "the jitted step failed" if "fn" not in step else budget.refuse("jax_driven", reserve),
    )
    jx.clear()
    step.clear()
    gc.collect()  # the JAX weights go before torch's arrive

    device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if torch is not None and device == "cpu" and args.quick:
        torch.set_num_threads(1)  # OpenMP threads stall when other processes hold the cores (see the denoise notes)
    if no_torch is None:
        sec["torch"] = {
            "device": device,
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        }
    tmade = {}

    def torch_loop(compile_mode: str | None):
        def go():
            dtype = torch.bfloat16
            if "model" not in tmade:
                start = time.perf_counter()
                tmade["model"] = torch_flux(cfg, torch, device, dtype)
                tmade["inputs"] = torch_inputs(setup, torch, device, dtype)
                tmade["build_s"] = time.perf_counter() - start
            model = (
                tmade["model"]
                if compile_mode is None
                else torch.compile(tmade["model"], mode=None if compile_mode == "default" else compile_mode)
            )
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
            return {
                "build_s": tmade["build_s"],
                "first_s": first,
                **per_image(t),
                **extra,
                "finite": bool(torch.isfinite(out).all()),
            }

        return go

    attempt(runs, "torch_eager", torch_loop(None), save, no_torch or budget.refuse("torch_eager", reserve))
    no_compile = no_torch or (
        None
        if (args.compile if args.compile is not None else device == "cuda")
        else "torch.compile on a CPU run is off (pass --compile)"
    )
    attempt(
        runs,
        "torch_compile",
        torch_loop(args.compile_mode),
        save,
        no_compile or budget.refuse("torch_compile", reserve),
    )
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


def dry_run(args) -> dict:
    """Build the FLUX section's models and programs abstractly (``nnx.eval_shape``, ``jit(...).lower`` on
    abstract params, torch on ``meta``): shapes, counts, FLOPs and memory, nothing allocated."""
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
        log(
            f"jit({name}) lowered on abstract params in {info[f'{name}_lower_s']:.1f} s: x {info[f'{name}_out']}, "
            f"XLA cost analysis {info[f'{name}_xla_flops']:.3e} FLOP"
        )
    info["flops_per_step"] = flux_flops(setup)
    heads, s = cfg.num_attention_heads, setup.text_len + setup.image_tokens
    info["xla_attention_scores_gb"] = setup.batch * heads * s * s * 4 / 1e9  # float32 logits of one layer
    torch = optional_module("torch")
    if torch is not None and optional_module("diffusers") is not None:
        try:
            meta = torch_flux_meta(setup, torch)
            info.update(meta)
        except Exception as err:  # noqa: BLE001 - a dry run reports what it could not check
            info["torch_meta_error"] = f"{type(err).__name__}: {err}"[:500]
    else:
        info["torch_meta_error"] = "torch / diffusers not installed"
    return info


FLUX_ROWS = {
    "jax_fused": "JAX fused `lax.scan` (`jit(denoise.run)`)",
    "jax_driven": "JAX Python loop of the jitted step",
    "jax_step": "JAX one jitted `denoise.step` (×steps)",
    "jax_step_cudnn": "JAX step, cuDNN attention patched in (×steps)",
    "torch_eager": "diffusers torch eager, Python loop",
    "torch_compile": "diffusers `torch.compile`, Python loop",
}


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
        (
            f"### {s['name']} transformer ({s['blocks']} blocks, width {s['width']}, {s['params']:,} params, "
            f"{s['param_bytes'] / 1e9:.3g} GB {s['dtype']}): {s['image']}² image -> latents {tuple(s['latents'])} -> "
            f"{s['image_tokens']} image + {s['text_tokens']} text tokens, batch {s['batch']}, {steps} Euler steps, "
            f"{s['flops_per_step'] / 1e12:.3g} TFLOP per step"
        ),
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
            f"| {label} | {num(r.get('compile_s'), '.1f')} | {num(r.get('first_s'), '.1f')} | {num(ms)} | "
            f"{num(ms * steps / 1e3 if ms else None, '.3f')} | {num(ms / fused if ms and fused else None)}× | "
            f"{num(r.get('tflops'), '.3g')} | {r.get('repeats', '–')} | {status} |"
        )
    p = runs.get("parity", {})
    init = runs.get("jax_init", {})
    lines += [
        "",
        f"JAX weights made on the device in {num(init.get('init_s'), '.1f')} s; torch model built and filled "
        f"in {num(runs.get('torch_eager', {}).get('build_s'), '.1f')} s. "
        + (
            f"Torch network checked against jaxpipe's ({p['config']}): max abs error {p['max_abs_err']:.1e} "
            f"(|v| up to {p['velocity_scale']:.2f})."
            if p.get("status") == "done"
            else f"Parity check: {p.get('status', 'not run')} {p.get('reason') or p.get('error', '')}."
        ),
    ]
    xla, fast = runs.get("jax_step", {}).get("ms_per_step"), runs["jax_step_cudnn"].get("ms_per_step")
    if xla and fast:
        lines.append(
            f"Attention: the jitted step takes {xla:.1f} ms with XLA's attention (jaxpipe's default) and "
            f"{fast:.1f} ms with cuDNN's fused attention: {xla / fast:.2f}×."
        )
    t = sec.get("torch")
    if t:
        lines.append(
            f"torch {t['torch']}, diffusers {t['diffusers']} on {t['gpu'] or t['device']} ({t['threads']} CPU threads)."
        )
    return lines


def summary_flux(sections: dict) -> list[str]:
    """One line per FLUX contender (the attention section's cuDNN step too): status, ms per step, ratio to fused."""
    out = []
    attention = sections.get("attention", {})
    runs = {**sections.get("flux", {}).get("contenders", {}), **attention.get("contenders", {})}
    fused = runs.get("jax_fused", {}).get("ms_per_step")
    for key in FLUX_ROWS:
        r = runs.get(key) or (attention if key == "jax_step_cudnn" else {})
        ms = r.get("ms_per_step")
        ratio = f" ({ms / fused:.2f}x jax fused)" if ms and fused else ""
        out.append(f"flux {key}: {r.get('status', 'not run')}" + (f", {ms:.2f} ms/step{ratio}" if ms else ""))
    return out


def flux_unavailable(args) -> str | None:
    """Why FLUX cannot run here: full size on a CPU."""
    if jax.default_backend() == "cpu" and not args.quick:
        return "FLUX.1-dev at 1024² on a CPU: use --quick or --dry-run here"
    return None


def attention_unavailable(args) -> str | None:
    """Why the cuDNN step cannot run here: FLUX's reasons, or no GPU."""
    if reason := flux_unavailable(args):
        return reason
    return "cuDNN attention needs a GPU" if jax.default_backend() != "gpu" else None


def plan_flux(p: Plan, reserve: float) -> None:
    """After the JAX step and fused scan (the section's start-up), its optional contenders in run order."""
    for optional in ("jax_driven", "torch_eager", "torch_compile"):
        p.piece(optional, reserve, optional)


FLUX_SECTION = Section(
    name="flux",
    run=section_flux,
    estimates={"flux": 150, "jax_driven": 10, "torch_eager": 45, "torch_compile": 120},
    plan=plan_flux,
    plan_note=", JAX step + fused",
    unavailable=flux_unavailable,
    render=lambda sections: render_flux(sections.get("flux", {}), sections.get("attention", {})),
    summary=summary_flux,
    dry_run=dry_run,
)
# Its numbers are a row of the flux table (render_flux, summary_flux): nothing of its own to render.
ATTENTION_SECTION = Section(
    name="attention",
    run=section_attention,
    estimates={"attention": 90},
    unavailable=attention_unavailable,
    optional=True,
)
