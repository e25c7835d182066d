"""The bfloat16 compute policy (``jaxpipe.precision``) and the N-way expert map policy.

In bfloat16: the rollout's log-probs recompute exactly under the rollout weights (C2), the trainable
master weights and Adam stay float32, the velocity of the bundled flux-t2i is within ~1% of float32
and comes out float32; bad names error. ``lax.map`` over the stacked experts == ``vmap``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe import precision
from jaxpipe.cards import toy_multi_expert
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.loops import ar
from jaxpipe.nn import DiTCond
from jaxpipe.prompts import Prompts
from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, RefinerConfig, Sampling
from jaxpipe.training.methods.joint_rl import (
    JointMultiExpertRL,
    JointMultiExpertRLConfig,
    map_experts,
    resolve_expert_map,
)

PROMPTS = ["seven thick", "one thin left", "three bright", "nine right dim"]


@pytest.fixture(scope="module")
def flux():
    return jp.cards.load("flux-t2i")


def floating_dtypes(tree) -> set:
    return {x.dtype for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def test_bfloat16_rollout_log_probs_recompute_exactly(flux):
    """C2 in bfloat16, the way the trainer recomputes (``step_stats``): the same bfloat16 program."""
    config = FlowGRPOConfig(group=Group(2), sampling=Sampling(num_steps=2, sampler="sde"), dtype="bfloat16")
    method = FlowGRPO(flux, lambda artifacts, prompts: jnp.mean(artifacts["image"], axis=(1, 2, 3)), config)
    assert set(precision.network_dtypes(method.spec.config).values()) == {"bfloat16"}
    state = method.init()
    # mixed precision: float32 master weights, reference and Adam moments; the forward casts them down
    assert floating_dtypes((state.params, state.copies["reference"], state.opt_state)) == {jnp.dtype(jnp.float32)}
    ro = method.rollout(state, Prompts.from_texts(flux, PROMPTS[:1]), jax.random.key(0))
    log_prob, mean = jax.jit(method.step_stats)(state.params["generator"], state.frozen, ro)
    traj = ro.generated.trajectory
    assert log_prob.dtype == traj.log_prob.dtype == ro.generated.images.dtype == jnp.float32
    np.testing.assert_allclose(jnp.exp(log_prob - traj.log_prob), 1.0, rtol=0, atol=1e-6)
    np.testing.assert_allclose(mean, traj.mean, rtol=0, atol=1e-6)


@pytest.mark.slow  # ~10 s, a closeness measurement (benchmarks/bf16.py); the suite keeps bfloat16 C2 exactness
def test_bfloat16_velocity_is_close_to_float32_and_float32_out(flux, tmp_path):
    bf16 = precision.with_dtype(flux, "bfloat16")
    assert precision.network_dtypes(bf16.spec.config) == {"dit": "bfloat16", "text": "bfloat16", "vae": "bfloat16"}
    assert floating_dtypes(bf16.components) == {jnp.dtype(jnp.float32)}  # params stay float32 (master weights)
    assert precision.with_dtype(bf16, "float32").spec.config == flux.spec.config
    only = precision.network_dtypes(precision.with_dtype(flux, "bfloat16", networks=("dit",)).spec.config)
    assert only == {"dit": "bfloat16", "text": "float32", "vae": "float32"}
    stored = precision.with_dtype(flux, "bfloat16", params="bfloat16")  # serving: half the memory
    assert floating_dtypes(stored["transformer"]) == {jnp.dtype(jnp.bfloat16)}
    assert floating_dtypes(stored["vae"].latent_mean) == {jnp.dtype(jnp.float32)}  # not a parameter
    reloaded = jp.cards.load_card(jp.cards.save_card(bf16, tmp_path / "bf16"))
    assert reloaded.spec.config == bf16.spec.config  # a checkpoint keeps the compute dtype

    images = jnp.asarray(digits.load_images("heldout")[0][:4])
    ids = jnp.asarray(flux.spec.tokenizer.encode(PROMPTS, 8))
    noise = jax.random.normal(jax.random.key(0), (4, 1, 8, 8, 4))
    sigma = jnp.array([1.0, 0.7, 0.4, 0.1])

    @jax.jit
    def velocity(card, vae):
        x0 = vae.encode(images)[:, None]  # the same float32 latents for both cards
        x = (1.0 - sigma[:, None, None, None, None]) * x0 + sigma[:, None, None, None, None] * noise
        return card["transformer"].velocity(x, sigma, DiTCond(card["text_encoder"](ids), ids != 0))

    v32, v16 = velocity(flux, flux["vae"]), velocity(bf16, flux["vae"])
    assert v16.dtype == jnp.float32
    l2 = float(jnp.linalg.norm(v16 - v32) / jnp.linalg.norm(v32))
    worst = float(jnp.max(jnp.abs(v16 - v32)) / jnp.max(jnp.abs(v32)))
    assert 0.0 < l2 < 2e-2 and worst < 3e-2, (l2, worst)  # measured: 1.3e-2 and 1.3e-2


def test_bad_names_error_clearly(flux):
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'bfloat16'\) \(got 'float16'\)"):
        precision.with_dtype(flux, "float16")
    with pytest.raises(ValueError, match=r"networks must name some of .*\['dit', 'text', 'vae'\]"):
        precision.with_dtype(flux, "bfloat16", networks=("llm",))
    with pytest.raises(ValueError, match="params must be one of"):
        precision.with_dtype(flux, "bfloat16", params="int8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        FlowGRPOConfig(dtype="bf16")
    with pytest.raises(ValueError, match=r"expert_map must be one of \('auto', 'vmap', 'map'\)"):
        JointMultiExpertRLConfig(expert_map="pmap")
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        map_experts(lambda x: x, "auto", jnp.zeros(3))
    assert resolve_expert_map("auto", "cpu", 1) == "map" and resolve_expert_map("auto", "gpu", 1) == "vmap"
    assert resolve_expert_map("auto", "cpu", 8) == "vmap" and resolve_expert_map("vmap", "cpu", 1) == "vmap"


@pytest.mark.slow  # ~12 s; the vmap policy is checked against per-expert updates by default (test_joint_rl.py)
def test_lax_map_over_experts_equals_vmap():
    """One refiner update step at N = 3: the ``lax.map`` policy gives the vmap's params, Adam states, losses."""
    card = digit_cards.multi_expert(jp.cards.load("unified"), 3)
    config = JointMultiExpertRLConfig(
        joint=False, refiner_optimizer=Optimizer(1e-4), refiner=RefinerConfig(clip_eps=100.0, beta=0.0)
    )  # a wide clip: every row learns
    method = JointMultiExpertRL(card, lambda artifacts, prompts: jnp.mean(artifacts["image"], axis=(1, 2, 3)), config)
    params = method.init().params["refiner"]  # the stacked refiners' parameters
    assert sorted(params) == [toy_multi_expert.COMPONENT]
    prompt = np.asarray(card.spec.tokenizer.encode(["seven", "one", "three", "nine"], 8))
    advantages = jax.random.normal(jax.random.key(1), (3, 4))

    @functools.partial(jax.jit, static_argnums=0)
    def update(how, params, allowed, advantages):
        # each expert's refinements: a prompt word, then one word of its own slot (its first allowed token)
        n, (b, t) = allowed.shape[0], prompt.shape
        tokens = jnp.broadcast_to(jnp.asarray(prompt), (n, b, t)).at[:, :, 1].set(jnp.argmax(allowed, axis=1)[:, None])
        mask = jnp.zeros((n, b, t), bool).at[:, :, 1].set(True)
        refinement = ar.Continuation(
            tokens, jnp.ones((n, b), jnp.int32), jnp.full((n, b), 2, jnp.int32), mask, jnp.where(mask, -2.0, 0.0)
        )
        opt = jax.vmap(method.refiner_tx.init)(params)
        return map_experts(method.expert_update, how, params, params, opt, allowed, refinement, advantages)

    by_vmap, by_map = (update(how, params, method.allowed, advantages) for how in ("vmap", "map"))  # update.Step each
    assert float(jnp.min(by_vmap.grad_norm)) > 0.0 and bool(jnp.all(by_vmap.finite))  # every expert gets a gradient
    assert by_vmap.loss.shape == (3,)
    got_leaves, want_leaves = jax.tree.leaves(by_map), jax.tree.leaves(by_vmap)
    assert len(got_leaves) == len(want_leaves)
    for got, want in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # float32 reordering on values up to ~15
    moved = max(
        float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(by_vmap.params), jax.tree.leaves(params))
    )
    assert moved > 1e-5
