"""Every check on 8 simulated CPU devices, in one process (started by tests/test_distributed.py with
XLA_FLAGS=--xla_force_host_platform_device_count=8): sharded == one device for

- one N = 4 ``JointMultiExpertRL`` step on a 2×4 (data × expert) mesh (refiners along ``expert``,
  the generator DiT by ``FSDP`` rules);
- one ``FlowGRPO`` step on a one-block ``flux-t2i`` card on a 2×1×4 (data × model) mesh, DiT by
  ``FSDP_TP`` rules (FSDP over ``data``, tensor parallel over ``model``);
- forward + backward of a simple loss through the digits DiT, a FLUX-shaped and a Wan-shaped
  transformer on the 2×1×4 mesh under ``FSDP_TP``, with every param's placement checked;
- ``abstract_sharded`` / ``memory_per_device`` / ``init_sharded`` against the real placement.

Prints one JSON line; writes the sharded steps' results to ``<argv[1]>/reference.npz``, the numbers
``two_process.py`` must reproduce.
"""

import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
import mesh_steps

from jaxpipe import compilation, distributed
from jaxpipe.nn import dit, flux, wan

RULES = distributed.FSDP_TP


def max_diff(a, b) -> float:
    """Largest absolute difference over the floating leaves (numpy: no per-shape compile)."""
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(
        [
            float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
            for x, y in pairs
            if jnp.issubdtype(x.dtype, jnp.floating)
        ]
        or [0.0]
    )


def named(tree) -> dict:
    """``{"/"-joined path: leaf}`` (an ``nnx.Variable``'s ``/value`` left out)."""
    return {
        jax.tree_util.keystr(p, simple=True, separator="/").removesuffix("/value"): x
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def specs(tree, *suffixes) -> dict[str, str]:
    """``{path: str(spec)}`` of the leaves whose path ends with one of ``suffixes``."""
    return {name: str(leaf.sharding.spec) for name, leaf in named(tree).items() if name.endswith(suffixes)}


def joint_checks():
    method, batch = mesh_steps.joint()
    state = method.init()
    single, single_metrics = jax.jit(method.step_fn)(state, batch, jax.random.key(mesh_steps.KEY))
    mesh = distributed.make_mesh(**mesh_steps.JOINT_MESH)
    sharded, sharded_metrics, _ = mesh_steps.run(method, batch, mesh, mesh_steps.joint_shardings)
    leaf = jax.tree.leaves(sharded.params["refiner"])[0]
    opt_leaf = next(x for x in jax.tree.leaves(sharded.opt_state["refiner"]) if x.ndim >= 2)
    return {
        "refiners_diff": max_diff(single.params["refiner"], sharded.params["refiner"]),
        "refiner_opt_diff": max_diff(single.opt_state["refiner"], sharded.opt_state["refiner"]),
        "generator_diff": max_diff(single.params["generator"], sharded.params["generator"]),
        "generator_opt_diff": max_diff(single.opt_state["generator"], sharded.opt_state["generator"]),
        "metric_diffs": {k: abs(float(single_metrics[k]) - float(sharded_metrics[k])) for k in single_metrics},
        "refiner_spec": str(leaf.sharding.spec),
        "refiner_shard_shape": list(leaf.addressable_shards[0].data.shape),
        "refiner_shape": list(leaf.shape),
        "opt_spec": str(opt_leaf.sharding.spec),
        "generator_specs": {
            **specs(sharded.params["generator"], "blocks/0/attn/q/kernel", "time_out/bias"),
            **specs(sharded.opt_state["generator"], "blocks/0/attn/q/kernel"),
        },
        "devices": len(leaf.sharding.device_set),
        "moved": float(np.max(np.abs(np.asarray(leaf) - np.asarray(jax.tree.leaves(state.params["refiner"])[0])))),
    }, (mesh, sharded, sharded_metrics)


def flow_checks():
    method, batch = mesh_steps.flow()
    state = method.init()
    single, single_metrics = jax.jit(method.step_fn)(state, batch, jax.random.key(mesh_steps.KEY))
    mesh = distributed.make_mesh(**mesh_steps.FLOW_MESH)
    sharded, sharded_metrics, placed = mesh_steps.run(method, batch, mesh, mesh_steps.flow_shardings)
    q = "transformer/blocks/0/attn/q/kernel"
    params, opt_state = sharded.params["generator"], sharded.opt_state["generator"]
    q_leaves = [x for tree in (params, opt_state) for k, x in named(tree).items() if k.endswith(q)]
    return {
        "params_diff": max_diff(single.params, sharded.params),
        "opt_diff": max_diff(single.opt_state, sharded.opt_state),
        "metric_diffs": {k: abs(float(single_metrics[k]) - float(sharded_metrics[k])) for k in single_metrics},
        "moved": max_diff(state.params, sharded.params),
        # placement in and out of the step: params and reference by the rules, Adam moments mirror them
        "params_specs": specs(params, q, "fc2/kernel", "time_out/kernel", "out/bias"),
        "reference_specs": specs(placed.copies["reference"], q),
        "opt_specs": specs(opt_state, q, "count"),
        "frozen_specs": sorted({str(x.sharding.spec) for x in jax.tree.leaves(sharded.frozen)}),
        "q_shard_shapes": [list(x.addressable_shards[0].data.shape) for x in q_leaves],  # params, Adam mu, nu
        "q_shape": list(q_leaves[0].shape),
    }, (mesh, sharded, sharded_metrics)


def networks():
    """``(name, factory, table, loss inputs (x, sigma, cond))`` of the three networks."""
    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    sigma = np.array([0.3, 0.7], np.float32)
    return [
        (
            "dit",
            lambda: dit.DiT(dit.DiTConfig(depth=1), rngs=nnx.Rngs(0)),
            dit.LOGICAL_AXES,
            (normal(2, 1, 4, 4, 4), sigma, dit.DiTCond(normal(2, 5, 32), np.ones((2, 5), bool))),
        ),
        (
            "flux",
            lambda: flux.FluxTransformer(flux.FluxConfig.tiny(), rngs=nnx.Rngs(0)),
            flux.LOGICAL_AXES,
            (
                normal(2, 4, 4, 4),
                sigma,
                flux.FluxCond(normal(2, 5, 32), normal(2, 32), np.array([3.5, 3.5], np.float32)),
            ),
        ),
        (
            "wan",
            lambda: wan.WanTransformer(
                wan.WanConfig.tiny(num_layers=1, image_dim=16, added_kv_proj_dim=32), rngs=nnx.Rngs(0)
            ),
            wan.LOGICAL_AXES,
            (normal(2, 2, 4, 4, 4), sigma, wan.WanCond(normal(2, 5, 32), normal(2, 3, 16))),
        ),
    ]


def network_checks(names):
    mesh = distributed.make_mesh(data=2, expert=1, model=4)
    rep = distributed.replicated(mesh)
    out = {}
    for seed, (name, factory, table, inputs) in enumerate(networks()):
        if name not in names:
            continue
        graphdef, params, rest = nnx.split(mesh_steps.random_weights(factory, seed), nnx.Param, ...)

        def loss(params, x, sigma, cond, graphdef=graphdef, rest=rest):
            v = nnx.merge(graphdef, params, rest).velocity(x, sigma, cond)
            return jnp.mean((v - 0.5) ** 2)

        value_and_grad = jax.value_and_grad(loss)
        single_loss, single_grads = jax.jit(value_and_grad)(params, *inputs)
        shardings = distributed.param_shardings(mesh, params, table, RULES)
        placed = distributed.place(params, shardings)
        sharded_loss, sharded_grads = jax.jit(
            value_and_grad, in_shardings=(shardings, rep, rep, rep), out_shardings=(rep, shardings)
        )(placed, *inputs)

        # every param is placed by its table entry, and its shards are the global shape divided as the spec says
        axes = jax.tree.leaves(distributed.logical_axes(params, table))
        wrong, sharded_bytes, total_bytes = [], 0, 0
        for (path, x), ax in zip(jax.tree_util.tree_flatten_with_path(placed)[0], axes):
            spec = distributed.mesh_spec(ax, x.shape, mesh, RULES)
            expected = [n // (mesh.shape[a] if a else 1) for n, a in zip(x.shape, tuple(spec) + (None,) * x.ndim)]
            if x.sharding.spec != spec or list(x.addressable_shards[0].data.shape) != expected:
                wrong.append(jax.tree_util.keystr(path, simple=True, separator="/"))
            total_bytes += x.nbytes
            sharded_bytes += x.nbytes if any(spec) else 0
        checked = {
            "dit": ("blocks/0/attn/q/kernel", "blocks/0/mlp/fc2/kernel", "time_out/kernel", "blocks/0/attn/out/bias"),
            "flux": (
                "transformer_blocks/stacked/attn/to_q/kernel",
                "single_transformer_blocks/stacked/proj_mlp/kernel",
            ),
            "wan": ("blocks/stacked/attn1/to_q/kernel", "blocks/stacked/ffn/net/2/kernel"),
        }[name]
        out[name] = {
            "loss": float(single_loss),
            "loss_diff": abs(float(single_loss) - float(sharded_loss)),
            "grad_diff": max_diff(single_grads, sharded_grads),
            "grad_scale": max(float(np.max(np.abs(g))) for g in jax.tree.leaves(single_grads)),
            "wrong_placements": wrong,
            "params": len(axes),
            "sharded_fraction": sharded_bytes / total_bytes,
            "specs": specs(sharded_grads, *checked),
            "shard_shapes": {
                k: [list(x.shape), list(x.addressable_shards[0].data.shape)]
                for k, x in named(placed).items()
                if k.endswith(checked)
            },
        }
        if name == "dit":
            out[name].update(abstract_checks(mesh, factory, table, placed))
    return out


def abstract_checks(mesh, factory, table, placed) -> dict:
    """The abstract model's shardings and byte count agree with the real placement; ``init_sharded`` builds
    the same weights straight into the same shards."""
    abstract = nnx.state(distributed.abstract_sharded(factory, mesh, table, RULES), nnx.Param)
    same_specs = all(a.sharding == x.sharding for a, x in zip(jax.tree.leaves(abstract), jax.tree.leaves(placed)))
    real = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(placed))
    built = nnx.state(distributed.init_sharded(factory, mesh, table, RULES), nnx.Param)
    fresh = jax.jit(lambda: nnx.state(factory(), nnx.Param))()
    return {
        "abstract_specs_match": bool(same_specs),
        "memory_per_device": distributed.memory_per_device(abstract),
        "real_bytes_per_device": int(real),
        "whole_bytes": int(sum(math.prod(x.shape) * 4 for x in jax.tree.leaves(abstract))),
        "init_sharded_diff": max_diff(built, fresh),
        "init_sharded_specs_match": all(
            b.sharding == a.sharding for b, a in zip(jax.tree.leaves(built), jax.tree.leaves(abstract))
        ),
    }


def main():
    assert len(jax.devices()) == 8, jax.devices()
    compilation.enable_cache()  # the suite's persistent cache ($JAXPIPE_CACHE_DIR), shared with its subprocesses
    # --all (the slow test): also the JointMultiExpertRL step and the FLUX- and Wan-shaped transformers (~45 s more
    # of compiles), and the reference the two processes must reproduce
    full = "--all" in sys.argv
    timings, joint = {}, None
    start = time.perf_counter()
    if full:
        joint, joint_result = joint_checks()
        timings["joint"] = time.perf_counter() - start
        start = time.perf_counter()
    flow, flow_result = flow_checks()
    timings["flow"] = time.perf_counter() - start
    start = time.perf_counter()
    nets = network_checks(("dit", "flux", "wan") if full else ("dit",))
    timings["networks"] = time.perf_counter() - start
    if full and len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
        np.savez(Path(sys.argv[1]) / "reference.npz", **mesh_steps.summary(joint_result, flow_result))
    timings["cpu"] = time.process_time()
    print(json.dumps({"joint": joint, "flow": flow, "networks": nets, "seconds": timings}))


if __name__ == "__main__":
    main()
