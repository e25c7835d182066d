"""One JointMultiExpertRL step for N = 4 on a 2×4 (data × expert) mesh vs one device; run in a subprocess
with XLA_FLAGS=--xla_force_host_platform_device_count=8 by tests/test_distributed.py. Prints JSON."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import distributed
from jaxpipe.cards import multi_expert, unified
from jaxpipe.training.joint_rl import JointMultiExpertRL, JointRLConfig


def main():
    assert len(jax.devices()) == 8, jax.devices()
    base = unified.build(seed=5)
    card = multi_expert.from_unified(base, 4)
    reward = lambda im, lab: {"stroke": jnp.mean(im, axis=(1, 2, 3)), "position": jnp.mean(im[:, :, 8:], axis=(1, 2, 3))}
    # small learning rates: Adam's first step is lr·g/(|g|+eps), so near-zero gradients that differ by float
    # reordering (mesh vs one device) move a weight by up to ~lr; the moments below compare the gradients directly
    config = JointRLConfig(
        group_size=2, skip=0, num_steps=2, sde_window=(0, 1), credit="per_expert", expert_terms=("stroke", "position") * 2,
        learning_rate=1e-5, lm_learning_rate=1e-5,
    )
    method = JointMultiExpertRL(card, reward, config)
    batch = {"ids": jnp.asarray(card.spec.tokenizer.encode(["seven", "one"], 8)), "labels": {}}
    key = jax.random.key(0)
    state = method.init()

    single, single_metrics = jax.jit(method.step_fn)(state, batch, key)

    mesh = distributed.make_mesh(data=2, expert=4)
    shardings = distributed.joint_state_sharding(mesh, state)
    placed = distributed.place(state, shardings)
    placed_batch = distributed.place(batch, distributed.batch_sharding(mesh))
    step = distributed.sharded_step(method.step_fn, mesh, state, batch)
    sharded, sharded_metrics = step(placed, placed_batch, key)

    leaf = jax.tree.leaves(sharded.refiners)[0]
    opt_leaf = [x for x in jax.tree.leaves(sharded.refiner_opt) if x.ndim >= 2][0]
    def max_diff(a, b):
        pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b))
        return max([float(jnp.max(jnp.abs(x - y))) for x, y in pairs if jnp.issubdtype(x.dtype, jnp.floating)] or [0.0])

    print(json.dumps({
        "refiners_diff": max_diff(single.refiners, sharded.refiners),
        "refiner_opt_diff": max_diff(single.refiner_opt, sharded.refiner_opt),
        "generator_diff": max_diff(single.generator, sharded.generator),
        "generator_opt_diff": max_diff(single.generator_opt, sharded.generator_opt),
        "metric_diffs": {k: abs(float(single_metrics[k]) - float(sharded_metrics[k])) for k in single_metrics},
        "refiner_spec": str(leaf.sharding.spec),
        "refiner_shard_shape": list(leaf.addressable_shards[0].data.shape),
        "refiner_shape": list(leaf.shape),
        "opt_spec": str(opt_leaf.sharding.spec),
        "generator_spec": str(jax.tree.leaves(sharded.generator)[0].sharding.spec),
        "devices": len(leaf.sharding.device_set),
        "moved": float(np.max(np.abs(np.asarray(leaf) - np.asarray(jax.tree.leaves(state.refiners)[0])))),
    }))


if __name__ == "__main__":
    main()
