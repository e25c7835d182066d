"""FlowGRPO on the generator: C2 before the update, real updates toward the ML velocity, no-ops when they must be."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe import samplers
from jaxpipe.training.flow_grpo import FlowGRPO, FlowGRPOConfig
from jaxpipe.digits.rewards import scorer_reward
from conftest import brightness_reward, leaves_equal, rl_batch

CONFIG = FlowGRPOConfig(group_size=2, num_steps=3, sde_window=(0, 2), learning_rate=1e-4)


def constant_reward(images, labels):
    return jnp.ones(images.shape[0])


@pytest.fixture(scope="module")
def method(t2i_card):
    return FlowGRPO(t2i_card, brightness_reward, CONFIG)


@pytest.fixture(scope="module")
def rollout(method, t2i_card):
    state = method.init()
    return state, method.rollout(state, rl_batch(t2i_card), jax.random.key(0))


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
    new, metrics = method.step(state, rl_batch(t2i_card), jax.random.key(1))
    assert float(jnp.abs(metrics["reward_std"])) == 0.0
    assert leaves_equal(new.params, state.params)  # zero advantage and params == reference: nothing moves


@pytest.mark.slow  # the shared finite guard (finetune.guarded_update) is tested by default in test_finetune.py
def test_non_finite_reward_skips_the_update(t2i_card):
    method = FlowGRPO(t2i_card, lambda im, lab: jnp.full(im.shape[0], jnp.nan), CONFIG)
    state = method.init()
    new, metrics = method.step(state, rl_batch(t2i_card), jax.random.key(2))
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


# ------------------------------------------------------------------------------------------ several updates per rollout


def test_one_minibatch_one_epoch_is_the_single_update_bit_for_bit(method, rollout):
    """The default schedule (1 × 1, every step) is exactly one ``generator_update`` on the whole rollout."""
    from jaxpipe.training.flow_grpo import generator_update

    from jaxpipe.training.finetune import guarded_update

    state, ro = rollout
    assert CONFIG.schedule.single
    new, metrics = method.update(state, ro, jax.random.key(3))

    @jax.jit
    def before_minibatches(s, ro):  # the update of every step before several updates per rollout existed
        models_of = lambda p: (method.components(p, s.frozen)[method.transformer],)
        params, opt_state, loss, metrics, grad_norm = generator_update(
            method.tx, models_of, s.params, s.reference, s.opt_state, ro.generated, ro.advantages, CONFIG, method.sampling)
        new = s._replace(params=params, opt_state=opt_state, step=s.step + 1)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = guarded_update(finite, new, s._replace(step=s.step + 1))
        return new, {**metrics, "grad_norm": grad_norm, "skipped": 1.0 - finite.astype(jnp.float32)}

    old, old_metrics = before_minibatches(state, ro)
    assert leaves_equal(new, old)
    assert all(float(metrics[k]) == float(v) for k, v in old_metrics.items()) and "ratio_mean_u0" not in metrics


def test_several_minibatches_move_the_ratio_and_the_clip_binds(t2i_card, rollout):
    """4 rows in 2 minibatches × 2 epochs: the first update is at the rollout weights (ratio 1, C2), the
    later ones are not, and with a large step the clipped objective clips."""
    state, ro = rollout
    config = dataclasses.replace(CONFIG, minibatches=2, inner_epochs=2, timestep_fraction=0.5, learning_rate=3e-3)
    method = FlowGRPO(t2i_card, brightness_reward, config)
    new, metrics = method.update(state, ro, jax.random.key(4))
    assert float(metrics["skipped"]) == 0.0 and not leaves_equal(new.params, state.params)
    assert abs(float(metrics["ratio_mean_u0"]) - 1.0) < 1e-5 and float(metrics["clip_frac_u0"]) == 0.0
    later = [float(metrics[f"ratio_mean_u{i}"]) for i in (1, 2, 3)]
    assert all(abs(r - 1.0) > 1e-4 for r in later), later
    assert max(float(metrics[f"clip_frac_u{i}"]) for i in (1, 2, 3)) > 0.0
    again, _ = method.update(state, ro, jax.random.key(4))  # the minibatch order is a pure function of the key
    assert leaves_equal(again.params, new.params)
    other, _ = method.update(state, ro, jax.random.key(5))
    assert not leaves_equal(other.params, new.params)


def test_minibatches_partition_the_rollout_and_steps_are_drawn_per_row():
    from jaxpipe.training import ppo

    schedule = ppo.Schedule(minibatches=4, inner_epochs=3)
    rows = np.asarray(ppo.minibatch_rows(jax.random.key(0), 16, schedule))
    assert rows.shape == (3, 4, 4)
    for epoch in rows:  # each row trained exactly once per epoch
        assert sorted(epoch.reshape(-1).tolist()) == list(range(16))
    assert not np.array_equal(rows[0], rows[1])  # reshuffled every epoch
    assert np.array_equal(np.asarray(ppo.minibatch_rows(jax.random.key(0), 16, schedule)), rows)
    single = np.asarray(ppo.minibatch_rows(jax.random.key(0), 6, ppo.Schedule(inner_epochs=2)))
    assert single.tolist() == [[list(range(6))]] * 2  # one minibatch keeps the rollout's order
    with pytest.raises(ValueError, match="must divide the rollout's 10 rows"):
        ppo.minibatch_rows(jax.random.key(0), 10, schedule)
    for bad in (dict(minibatches=0), dict(inner_epochs=-1), dict(timestep_fraction=0.0), dict(timestep_fraction=1.5)):
        with pytest.raises(ValueError):
            ppo.Schedule(**bad)
    assert ppo.Schedule(timestep_fraction=0.5).steps_kept(4) == 2 and ppo.Schedule(timestep_fraction=0.1).steps_kept(4) == 1

    S, B = 6, 5
    field = jnp.arange(S * B, dtype=jnp.float32).reshape(S, B)
    traj = jp.loops.denoise.Transition(*(field for _ in range(8)))
    kept = ppo.subsample_steps(traj, jax.random.key(1), 3)
    picked = np.asarray(kept.x)
    assert picked.shape == (3, B)
    for b in range(B):  # 3 distinct captured steps of row b, nothing from another row
        steps = (picked[:, b] - b) / B
        assert len(set(steps.tolist())) == 3 and set(steps.tolist()) <= set(range(S))
    assert len({tuple(picked[:, b] // B) for b in range(B)}) > 1  # drawn per row
