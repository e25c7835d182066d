"""The sharded trainer steps that ``eight_devices.py`` (one process, 8 simulated CPU devices) and
``two_process.py`` (two processes × 4 CPU devices) both run: same cards, configs, batches, keys, meshes
and shardings, so their results must agree. Not a test module: imported by those scripts."""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxpipe as jp
from jaxpipe import distributed
from jaxpipe.digits import cards as digit_cards
from jaxpipe.nn import DiTConfig, dit
from jaxpipe.prompts import Prompts
from jaxpipe.training import (
    FlowGRPO,
    FlowGRPOConfig,
    Group,
    JointMultiExpertRL,
    JointMultiExpertRLConfig,
    Optimizer,
    RefinerConfig,
    Sampling,
)

JOINT_MESH = {"data": 2, "expert": 4}
FLOW_MESH = {"data": 2, "expert": 1, "model": 4}
JOINT_RULES = distributed.FSDP
FLOW_RULES = distributed.FSDP_TP
KEY = 0


def random_weights(factory, seed: int):
    """``factory()`` (a module or a card) built abstractly and filled from numpy: no eager init, no
    per-shape compile. Matrices ~ N(0, 1/fan_in); 1-D params 0.05·N(0, 1), plus 1 for norm scales;
    other variables 0 (1 for ``*_std`` statistics). Every layer is non-trivial (adaLN-zero layers
    start at exactly 0 and would hide sharding bugs)."""
    rng = np.random.default_rng(seed)
    graphdef, params, rest = nnx.split(nnx.eval_shape(factory), nnx.Param, ...)
    name = lambda path: jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")

    def param(path, s):
        noise = rng.standard_normal(s.shape).astype(s.dtype)
        if len(s.shape) >= 2:
            return jnp.asarray(noise / np.sqrt(math.prod(s.shape[:-1])))
        return jnp.asarray(float(name(path).endswith("scale")) + 0.05 * noise)

    other = lambda path, s: jnp.full(s.shape, float(name(path).endswith("std")), s.dtype)
    params = jax.tree_util.tree_map_with_path(param, params)
    return nnx.merge(graphdef, params, jax.tree_util.tree_map_with_path(other, rest))


def joint():
    """N = 4 ``JointMultiExpertRL`` on a ``multi-expert`` card from the ``unified`` one, its batch (P = 2)."""
    card = random_weights(lambda: digit_cards.multi_expert(jp.cards.build("unified"), 4), seed=5)

    def reward(artifacts, prompts):
        im = artifacts["image"]
        return {"stroke": jnp.mean(im, axis=(1, 2, 3)), "position": jnp.mean(im[:, :, 8:], axis=(1, 2, 3))}

    # small learning rates: Adam's first step is lr·g/(|g|+eps), so near-zero gradients that differ by float
    # reordering (mesh vs one device) move a weight by up to ~lr; the moments compare the gradients directly
    generator = FlowGRPOConfig(
        group=Group(2),
        sampling=Sampling(num_steps=2, sampler="sde", sde_window=(0, 1)),
        beta=0.04,
        optimizer=Optimizer(1e-5),
    )
    config = JointMultiExpertRLConfig(
        generator=generator,
        refiner=RefinerConfig(skip=0),
        refiner_optimizer=Optimizer(1e-5),
        credit="per_expert",
        expert_terms=("stroke", "position") * 2,
    )
    method = JointMultiExpertRL(card, reward, config)
    return method, Prompts.from_texts(card, ["seven", "one"], width=64)


def flow():
    """FlowGRPO on a one-block ``flux-t2i`` card, its batch (P = 2)."""
    card = random_weights(
        lambda: jp.cards.build("flux-t2i", config=digit_cards.config("flux-t2i", dit=DiTConfig(depth=1))), seed=1
    )
    config = FlowGRPOConfig(
        group=Group(2), sampling=Sampling(num_steps=2, sampler="sde", sde_window=(0, 1)), optimizer=Optimizer(1e-5)
    )
    method = FlowGRPO(card, lambda artifacts, prompts: jnp.mean(artifacts["image"], axis=(1, 2, 3)), config)
    return method, Prompts.from_texts(card, ["seven thick", "one thin"], {"digit": np.array([7, 1])}, width=64)


def joint_shardings(mesh, state):
    """Refiners along ``expert`` (as ever); the generator DiT, its reference and Adam state by FSDP rules."""
    return distributed.joint_state_sharding(mesh, state, dit.LOGICAL_AXES, JOINT_RULES)


def flow_shardings(mesh, state):
    return distributed.state_sharding(mesh, state, dit.LOGICAL_AXES, FLOW_RULES)


def local_rows(mesh, batch):
    """This process's rows of a global ``batch`` under ``batch_sharding(mesh)``."""
    rows = len(batch)
    spans = [
        range(rows)[index[0]]
        for index in distributed.batch_sharding(mesh).addressable_devices_indices_map((rows,)).values()
    ]
    start, stop = min(s.start for s in spans), max(s.stop for s in spans)
    return jax.tree.map(lambda x: np.asarray(x)[start:stop], batch)


def run(method, batch, mesh, shardings_of, *, multi_process: bool = False):
    """One sharded ``step_fn`` from ``method.init()``: ``(new state, metrics, placed state)``."""
    state = method.init()
    shardings = shardings_of(mesh, state)
    placed = distributed.place(state, shardings)
    if multi_process:
        placed_batch = distributed.feed(mesh, local_rows(mesh, batch))
    else:
        placed_batch = distributed.place(batch, distributed.batch_sharding(mesh))
    key = distributed.place(jax.random.key(KEY), distributed.replicated(mesh))
    step = distributed.sharded_step(method.step_fn, mesh, state, batch, shardings=shardings)
    new, metrics = step(placed, placed_batch, key)
    return new, metrics, placed


def gathered(mesh, trees: dict) -> dict[str, np.ndarray]:
    """``{name/path: numpy array}`` of ``{name: tree of global arrays on mesh}``, copied whole onto every
    device by ONE jitted identity (a per-leaf ``process_allgather`` would compile once per shape)."""
    copies = jax.jit(lambda t: t, out_shardings=distributed.replicated(mesh))(trees)
    return {
        jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value"): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(copies)[0]
    }


def summary(joint_run, flow_run) -> dict[str, np.ndarray]:
    """What the runs compare: both steps' metrics, updated weights and Adam states. ``*_run``:
    ``(mesh, new state, metrics)``."""
    (jmesh, jstate, jmetrics), (fmesh, fstate, fmetrics) = joint_run, flow_run
    joint = {
        "joint/metrics": jmetrics,
        "joint/refiners": jstate.params["refiner"],
        "joint/generator": jstate.params["generator"],
        "joint/refiner_opt": jstate.opt_state["refiner"],
    }
    flow = {"flow/metrics": fmetrics, "flow/params": fstate.params, "flow/opt_state": fstate.opt_state}
    return {**gathered(jmesh, joint), **gathered(fmesh, flow)}
