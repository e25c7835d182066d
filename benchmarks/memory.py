"""Memory per device of the real models under jaxpipe's sharding plans, computed from their abstract
full-size builds (``nnx.eval_shape``: nothing is allocated) — the README's memory table.

For each model and mesh: **serve** = every component's parameters in bfloat16; **RL** = FlowGRPO's
state: the trained transformer(s) as float32 master weights + Adam's two moments + the frozen
float32 reference (16 bytes a parameter), the frozen text encoder(s) and autoencoder in bfloat16.
Parameters are placed by each network's ``LOGICAL_AXES`` through ``distributed.FSDP_TP``
(``embed`` over ``data``, ``heads`` / ``mlp`` / ``vocab`` over ``model``; a dim a mesh axis does not
divide stays whole), exactly as ``distributed.state_sharding(..., frozen_tables=...)`` places a
trainer's state. Activations, the rollout's latents and XLA's workspace come on top.

    python benchmarks/memory.py            # prints the markdown table
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
from flax import nnx
from jax.sharding import AbstractMesh

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jaxpipe import distributed  # noqa: E402
from jaxpipe.nn import autoencoder_kl, clip, flux, hf, t5, wan, wan_vae  # noqa: E402

GB = 1e9
MESHES = {  # label -> (data, model)
    "1 device": (1, 1),
    "8 (FSDP 8)": (8, 1),
    "8 (FSDP 2 × TP 4)": (2, 4),
    "64 (FSDP 8 × TP 8)": (8, 8),
}


def _abstract(build, config):
    config = dataclasses.replace(config, dtype="bfloat16")
    if build is wan.WanTransformer:
        return wan.WanTransformer.abstract(config)
    return nnx.eval_shape(lambda: build(config, rngs=nnx.Rngs(0)))


def models():
    """name -> (trained [(network, table)], frozen [(network, table)]) abstract bf16 builds."""
    t5_xxl = (_abstract(t5.T5Encoder, t5.T5EncoderConfig.t5_xxl()), t5.LOGICAL_AXES)
    umt5_xxl = (_abstract(t5.T5Encoder, t5.T5EncoderConfig.umt5_xxl()), t5.LOGICAL_AXES)
    clip_l = (_abstract(clip.CLIPTextEncoder, clip.CLIPTextEncoderConfig.vit_l14()), clip.LOGICAL_AXES)
    flux_vae = (_abstract(autoencoder_kl.AutoencoderKL, autoencoder_kl.AutoencoderKLConfig.flux()), autoencoder_kl.LOGICAL_AXES)
    wan21_vae = (_abstract(wan_vae.WanVAE, wan_vae.WanVAEConfig.wan21()), wan_vae.LOGICAL_AXES)
    wan_14b = (_abstract(wan.WanTransformer, wan.WanConfig.t2v_14b()), wan.LOGICAL_AXES)
    return {
        "FLUX.1-dev": ([(_abstract(flux.FluxTransformer, flux.FluxConfig.dev()), flux.LOGICAL_AXES)], [t5_xxl, clip_l, flux_vae]),
        "Wan2.1-T2V-1.3B": ([(_abstract(wan.WanTransformer, wan.WanConfig.t2v_1_3b()), wan.LOGICAL_AXES)], [umt5_xxl, wan21_vae]),
        "Wan2.1-T2V-14B": ([wan_14b], [umt5_xxl, wan21_vae]),
        "Wan2.2-T2V-A14B (2 experts)": ([wan_14b, wan_14b], [umt5_xxl, wan21_vae]),
    }


def _bytes(network, table, mesh, dtype: str) -> float:
    """Bytes per device of ``network``'s parameters stored in ``dtype`` and placed by ``table`` under FSDP_TP."""
    params = nnx.state(network, nnx.Param)
    shardings = distributed.param_shardings(mesh, params, table, distributed.FSDP_TP)
    as_dtype = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, dtype), params)
    return distributed.memory_per_device(as_dtype, shardings)


def table() -> list[tuple[str, int, dict[str, tuple[float, float]]]]:
    """``[(model, parameters, {mesh label: (serve GB, RL GB) per device})]``."""
    rows = []
    for name, (trained, frozen) in models().items():
        count = sum(hf.count_params(net) for net, _ in trained + frozen)
        cells = {}
        for label, (data, model) in MESHES.items():
            mesh = AbstractMesh((data, 1, model), distributed.AXES)
            frozen_bf16 = sum(_bytes(n, t, mesh, "bfloat16") for n, t in frozen)
            serve = sum(_bytes(n, t, mesh, "bfloat16") for n, t in trained) + frozen_bf16
            # params, Adam's mu and nu, and the reference: four float32 copies of the trained transformer(s)
            rl = sum(4 * _bytes(n, t, mesh, "float32") for n, t in trained) + frozen_bf16
            cells[label] = (serve / GB, rl / GB)
        rows.append((name, count, cells))
    return rows


def markdown(rows) -> str:
    head = "| model (all components) | params | " + " | ".join(f"{m}: serve / RL" for m in MESHES) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(MESHES)]
    for name, count, cells in rows:
        values = " | ".join(f"{s:.1f} / {r:.1f}" for s, r in cells.values())
        lines.append(f"| {name} | {count / 1e9:.2f} B | {values} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(table()))
    print("\nGB per device: serve = bf16 parameters; RL = FlowGRPO state (trained: fp32 master + Adam mu, nu + fp32 "
          "reference; frozen: bf16). Activations not included.")
