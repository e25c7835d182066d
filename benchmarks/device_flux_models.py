"""The contenders of ``device.py``'s FLUX sections, and the check that they are the same network.

It times nothing: ``FluxSetup`` (a config at an image size, with its matmul FLOP count), the JAX model with
random bfloat16 weights made on the device and its two programs (one jitted ``denoise.step``, the fused
``denoise.run`` scan), diffusers' ``FluxTransformer2DModel`` filled the same way with its Euler loop, and
``parity_check`` (tiny config, float32, CPU: torch's weights loaded into jaxpipe's model, velocities within
``PARITY_TOL``). No float32 copy of the 12 B full-size parameters is ever made, on either side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np
from device_harness import log, timings
from flax import nnx

from jaxpipe.loops import denoise
from jaxpipe.nn import hf
from jaxpipe.nn.flux import FluxCond, FluxConfig, FluxTransformer, image_ids

PARITY_TOL = 1e-4


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
    d, mlp, t, n_img = cfg.inner_dim, 4 * cfg.inner_dim, setup.text_len, setup.image_tokens
    s = t + n_img
    attention = 4 * s * s * d
    double = 2 * (4 * d * d + 2 * d * mlp) * s + attention  # each stream's q/k/v/out + FFN on its own tokens
    single = 2 * (3 * d * d + d * mlp + (d + mlp) * d) * s + attention
    io = 2 * (cfg.in_channels * d * n_img + cfg.joint_attention_dim * d * t + d * cfg.output_channels * n_img)
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
    """Tokens ``(B, h/2·w/2, 4c)`` -> latents ``(B, h, w, c)``: ``pack``'s inverse."""
    b, _, c4 = tokens.shape
    return tokens.reshape(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 1, 4, 2, 5, 3).reshape(b, h, w, c4 // 4)


def torch_flux(cfg: FluxConfig, torch, device: str, dtype, seed: int = 0):
    """diffusers' ``FluxTransformer2DModel`` of ``cfg`` in ``dtype`` on ``device``: built on ``meta`` (free),
    cast there, then (unless ``device`` is ``"meta"``) ``to_empty`` (one allocation, in ``dtype``) and filled
    like ``random_like``."""
    from diffusers import FluxTransformer2DModel
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # its warning about .to(dtype) concerns from_pretrained's fp32 modules: none here
    # jaxpipe's own fields (dtype, layer scanning, remat) are no part of diffusers' config; a shape field lost here
    # would change the network, which parity_check catches
    accepted = inspect.signature(FluxTransformer2DModel.__init__).parameters
    kwargs = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name in accepted}
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
        out = tmodel(
            hidden_states=pack(torch.from_numpy(x)),
            encoder_hidden_states=torch.from_numpy(text),
            pooled_projections=torch.from_numpy(pooled),
            timestep=torch.from_numpy(sigma),
            img_ids=torch.from_numpy(image_ids(h // 2, w // 2)),
            txt_ids=torch.zeros(t, 3),
            guidance=torch.from_numpy(guidance),
            return_dict=False,
        )[0]
    ref = unpack(out, h, w).numpy()
    err, scale = float(np.max(np.abs(ours - ref))), float(np.max(np.abs(ref)))
    if not err <= PARITY_TOL * max(1.0, scale):
        raise AssertionError(f"diffusers' FLUX differs from jaxpipe's: max abs error {err:.2e} (|v| up to {scale:.2f})")
    return {"max_abs_err": err, "velocity_scale": scale, "config": "FluxConfig.tiny(), float32, CPU"}


def setup_of(args) -> FluxSetup:
    """The FLUX setup a run times: tiny under ``--quick``, else FLUX.1-dev at 1024²."""
    return QUICK_FLUX if args.quick else FULL_FLUX


def flux_facts(setup: FluxSetup) -> dict:
    """What the report says of ``setup``: sizes, tokens, steps, parameter count and bytes, FLOPs per step."""
    cfg = setup.config
    leaves = jax.tree.leaves(abstract_flux(cfg)[1])
    return {
        "name": setup.name,
        "dtype": cfg.dtype,
        "image": setup.image,
        "latents": [setup.batch, *setup.latent_shape],
        "image_tokens": setup.image_tokens,
        "text_tokens": setup.text_len,
        "steps": setup.steps,
        "batch": setup.batch,
        "params": int(sum(x.size for x in leaves)),
        "param_bytes": int(sum(x.size * x.dtype.itemsize for x in leaves)),
        "flops_per_step": flux_flops(setup),
        "width": cfg.inner_dim,
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
    """``jax_flux`` into ``jx`` (the caller frees it); the contender record: its seconds."""
    jx.update(jax_flux(setup))
    return {"init_s": jx.pop("init_s")}


def time_jax_step(jx: dict, setup: FluxSetup, repeats: int, attention: str | None = None) -> tuple[dict, object]:
    """The jitted ``denoise.step`` compiled ahead of time (``attention``: the implementation patched into
    ``jax.nn.dot_product_attention`` while tracing), its first call, then ``repeats`` timed calls from step 0."""
    params, state = jx["params"], jx["state"]
    fn, compile_s = aot(jx["programs"]["step"], params, state, attention=attention)
    first = timings(lambda: jax.block_until_ready(fn(params, state).x), 1)["best_s"]
    t = timings(lambda: jax.block_until_ready(fn(params, state).x), repeats)
    return {
        "compile_s": compile_s,
        "first_s": first,
        **t,
        "ms_per_step": t["median_s"] * 1e3,
        "tflops": flux_flops(setup) / t["median_s"] / 1e12,
    }, fn


def torch_flux_meta(setup: FluxSetup, torch) -> dict:
    """diffusers' model of ``setup`` on ``meta`` in bfloat16: its parameter count, and one step of the timed
    torch loop (``torch_euler``) run on ``meta`` inputs: the contender's code at full size, nothing allocated."""
    dtype = torch.bfloat16
    model = torch_flux(setup.config, torch, "meta", dtype)
    x, kwargs, timesteps, dts = torch_inputs(setup, torch, "cpu", dtype)
    meta = lambda t: t.to("meta")
    out = torch_euler(
        model, meta(x), {k: meta(v) for k, v in kwargs.items()}, [meta(timesteps[0])], dts[:1], torch, dtype
    )
    count = sum(p.numel() for p in model.parameters())
    log(
        f"diffusers FluxTransformer2DModel on meta: {count:,} params; one torch_euler step -> {tuple(out.shape)} {out.dtype}"
    )
    return {"torch_params": count, "torch_step_out": [list(out.shape), str(out.dtype)]}
