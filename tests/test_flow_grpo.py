"""FlowGRPO on the generator: C2 before the update, real updates toward the ML velocity, no-ops when they must be."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe import samplers
from jaxpipe.training.flow_grpo import FlowGRPO, FlowGRPOConfig, scorer_reward

CONFIG = FlowGRPOConfig(group_size=2, num_steps=3, sde_window=(0, 2), learning_rate=1e-4)


def brightness_reward(images, labels):
    return jnp.mean(images, axis=(1, 2, 3))


def constant_reward(images, labels):
    return jnp.ones(images.shape[0])


def batch(card):
    ids = jnp.asarray(card.spec.tokenizer.encode(["seven thick", "one thin"], 8))
    return {"ids": ids, "labels": {"digit": jnp.array([7, 1])}}


def leaves_equal(a, b):
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def method(t2i_card):
    return FlowGRPO(t2i_card, brightness_reward, CONFIG)


@pytest.fixture(scope="module")
def rollout(method, t2i_card):
    state = method.init()
    return state, method.rollout(state, batch(t2i_card), jax.random.key(0))


def test_recomputed_log_probs_equal_the_captured_ones(method, rollout):
    """C2, computed the way the trainer computes it (same teacher-forced batching)."""
    state, ro = rollout
    log_prob, _ = jax.jit(method.step_stats)(state.params, state.frozen, ro)
    assert log_prob.shape == (2, 4)
    np.testing.assert_allclose(jnp.exp(log_prob - ro.generated.trajectory.log_prob), 1.0, atol=1e-5)
    assert float(jnp.abs(ro.advantages).max()) > 0.5


def test_update_moves_the_velocity_toward_the_ml_velocity(method, rollout):
    state, ro = rollout
    new, metrics = method.update(state, ro)
    assert float(metrics["skipped"]) == 0.0
    assert not leaves_equal(new.params, state.params)
    assert leaves_equal(new.reference, state.reference)
    traj, cond = ro.generated.trajectory, ro.generated.cond
    old_dit = method.components(state.params, state.frozen)[method.transformer]
    new_dit = method.components(new.params, new.frozen)[method.transformer]
    agreement = 0.0
    for s in range(traj.x.shape[0]):
        v_old = old_dit(traj.x[s], traj.sigma[s], cond.context, cond.context_mask)
        v_new = new_dit(traj.x[s], traj.sigma[s], cond.context, cond.context_mask)
        v_ml = samplers.ml_velocity(traj.x[s], traj.sample[s], traj.sigma[s], traj.sigma_next[s])
        per_sample = jnp.sum((v_new - v_old) * (v_ml - v_old), axis=(1, 2, 3, 4))
        agreement += float(jnp.sum(ro.advantages * per_sample))
    assert agreement > 0  # advantage-weighted, the update moves v toward the realized samples' v_ml


def test_constant_reward_is_a_no_op(t2i_card):
    method = FlowGRPO(t2i_card, constant_reward, CONFIG)
    state = method.init()
    new, metrics = method.step(state, batch(t2i_card), jax.random.key(1))
    assert float(jnp.abs(metrics["reward_std"])) == 0.0
    assert leaves_equal(new.params, state.params)  # zero advantage and params == reference: nothing moves


def test_non_finite_reward_skips_the_update(t2i_card):
    method = FlowGRPO(t2i_card, lambda im, lab: jnp.full(im.shape[0], jnp.nan), CONFIG)
    state = method.init()
    new, metrics = method.step(state, batch(t2i_card), jax.random.key(2))
    assert float(metrics["skipped"]) == 1.0
    assert leaves_equal(new.params, state.params) and int(new.step) == 1


def test_scorer_reward_and_bad_configs():
    scorer = jp.cards.build("digit-scorer")
    reward = scorer_reward(scorer, ("digit", "stroke"))
    images = jnp.full((3, 16, 16, 1), 0.5)
    r = reward(images, {"digit": jnp.array([7, 1, 2]), "stroke": jnp.array([1, -1, 0])})
    assert r.shape == (3,) and bool(jnp.all((r >= 0) & (r <= 2)))
    with pytest.raises(ValueError, match="unknown reward term"):
        scorer_reward(scorer, ("sharpness",))
    with pytest.raises(ValueError, match="group_size"):
        FlowGRPOConfig(group_size=1)
    with pytest.raises(ValueError, match="sde_window"):
        FlowGRPOConfig(num_steps=4, sde_window=(3, 9))
