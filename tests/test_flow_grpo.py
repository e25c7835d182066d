"""FlowGRPO on the generator: C2 before the update, real updates toward the ML velocity, no-ops when they must be."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import brightness_reward, leaves_equal, rl_batch

import jaxpipe as jp
from jaxpipe import rewards, samplers
from jaxpipe.digits.rewards import scorer_reward
from jaxpipe.prompts import Prompts
from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, Sampling, ppo

CONFIG = FlowGRPOConfig(
    group=Group(2), sampling=Sampling(num_steps=3, sampler="sde", sde_window=(0, 2)), optimizer=Optimizer(1e-4)
)


def constant_reward(artifacts, prompts):
    return jnp.ones(artifacts["image"].shape[0])


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
    log_prob, _ = jax.jit(method.step_stats)(state.params["generator"], state.frozen, ro)
    assert log_prob.shape == (2, 4)
    np.testing.assert_allclose(jnp.exp(log_prob - ro.generated.trajectory.log_prob), 1.0, atol=1e-5)
    assert float(jnp.abs(ro.advantages).max()) > 0.5


def test_update_moves_the_velocity_toward_the_ml_velocity(method, rollout):
    state, ro = rollout
    new, metrics = method.update(state, ro)
    assert float(metrics["skipped"]) == 0.0
    assert not leaves_equal(new.params, state.params)
    assert leaves_equal(new.copies["reference"], state.copies["reference"])
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


CFG_CONFIG = dataclasses.replace(CONFIG, sampling=dataclasses.replace(CONFIG.sampling, guidance=4.0))


def test_cfg_policy_c2_holds_at_guidance_4_and_detaching_the_unconditional_branch_changes_only_gradients(t2i_card):
    """The rollout at guidance 4 keeps its unconditional conditioning; recomputing the CFG-combined
    velocity through the rollout weights gives ratio 1 (C2), and the official code's
    ``noise_pred_uncond.detach()`` changes the gradient, never a log-prob."""
    method = FlowGRPO(t2i_card, brightness_reward, CFG_CONFIG)
    assert method.sampling.guidance == 4.0
    state = method.init()
    ro = method.rollout(state, rl_batch(t2i_card), jax.random.key(0))
    assert ro.generated.uncond is not None
    params, frozen = state.params["generator"], state.frozen
    log_prob, _ = jax.jit(method.step_stats)(params, frozen, ro)
    np.testing.assert_allclose(jnp.exp(log_prob - ro.generated.trajectory.log_prob), 1.0, atol=1e-5)

    models_of = method.models_of(frozen)

    def grad_of(detach):
        def objective(p):
            lp, _ = jp.training.rollout.generator_stats(
                models_of(p), ro.generated, method.sampling, detach_uncond=detach
            )
            return jnp.sum(lp * ro.advantages[None])

        return jax.jit(jax.value_and_grad(objective))(params)

    (plain, g_plain), (detached, g_detached) = grad_of(False), grad_of(True)
    assert float(plain) == float(detached)
    assert not leaves_equal(g_plain, g_detached)
    # guidance 1 recomputes from a rollout without an unconditional branch; at 4 one is required
    with pytest.raises(ValueError, match="holds no unconditional conditioning"):
        jp.training.rollout.generator_stats(models_of(params), ro.generated._replace(uncond=None), method.sampling)


@pytest.mark.slow  # ~8 s: another update compile; a constant group's zero advantages and FlowGRPO's zero loss and gradient at
# zero advantage are test_losses' (default tier)
def test_constant_reward_is_a_no_op(t2i_card):
    method = FlowGRPO(t2i_card, constant_reward, CONFIG)
    state = method.init()
    new, metrics = method.step(state, rl_batch(t2i_card), jax.random.key(1))
    assert float(jnp.abs(metrics["reward_std"])) == 0.0
    assert leaves_equal(new.params, state.params)  # zero advantage and params == reference: nothing moves


@pytest.mark.slow  # the shared finite guard (training.update) is tested by default in test_finetune.py
def test_non_finite_reward_skips_the_update(t2i_card):
    method = FlowGRPO(t2i_card, lambda artifacts, prompts: jnp.full(artifacts["image"].shape[0], jnp.nan), CONFIG)
    state = method.init()
    new, metrics = method.step(state, rl_batch(t2i_card), jax.random.key(2))
    assert float(metrics["skipped"]) == 1.0
    assert leaves_equal(new.params, state.params) and int(new.step) == 1


def test_scorer_reward_and_bad_configs(t2i_card):
    scorer = jp.cards.build("digit-scorer")
    reward = scorer_reward(scorer, ("digit", "stroke"))
    images = jnp.full((3, 16, 16, 1), 0.5)
    prompts = Prompts.from_texts(
        t2i_card, ["seven thick", "one", "two thin"], {"digit": [7, 1, 2], "stroke": [1, -1, 0]}
    )
    parts = reward({"image": images}, prompts)
    assert sorted(parts) == ["digit", "stroke"] and bool(jnp.all(parts["stroke"][1] == 0.0))  # -1: not rewarded
    r = rewards.score(reward, {"image": images}, prompts)[0]
    assert r.shape == (3,) and bool(jnp.all((r >= 0) & (r <= 2)))
    np.testing.assert_array_equal(r, parts["digit"] + parts["stroke"])  # the total is the parts' sum
    with pytest.raises(ValueError, match="unknown reward term"):
        scorer_reward(scorer, ("sharpness",))
    with pytest.raises(ValueError, match="group size"):
        FlowGRPOConfig(group=Group(1))
    with pytest.raises(ValueError, match="sde_window"):
        FlowGRPOConfig(sampling=Sampling(num_steps=4, sampler="sde", sde_window=(3, 9)))
    with pytest.raises(ValueError, match="sampler='sde'"):
        FlowGRPOConfig(sampling=Sampling(sampler="ode"))


# ------------------------------------------------------------------------------------------ several updates per rollout


@pytest.mark.slow  # ~9 s; the suite keeps the minibatch partition and the clip-binding tests below
def test_one_minibatch_one_epoch_is_the_single_update_bit_for_bit(method, rollout):
    """The default schedule (1 × 1, every step) is exactly one ``grpo.generator_update`` on the whole rollout
    (no rows, no key), guarded by ``training.update``: same weights, Adam state and metrics."""
    from jaxpipe.training import update
    from jaxpipe.training.grpo import generator_update

    state, ro = rollout
    assert CONFIG.ppo.single
    new, metrics = method.update(state, ro, jax.random.key(3))

    @jax.jit
    def before_minibatches(s, ro):  # the update of every step before several updates per rollout existed
        def models_of(p):
            return (method.components({"generator": p}, s.frozen)[method.transformer],)

        out = generator_update(
            method.tx,
            models_of,
            s.params["generator"],
            s.copies["reference"],
            s.opt_state["generator"],
            ro.generated,
            ro.advantages,
            None,
            None,
            CONFIG,
            method.sampling,
        )
        new = s._replace(params={"generator": out.params}, opt_state={"generator": out.opt_state}, step=s.step + 1)
        return new, {**out.aux, "grad_norm": out.grad_norm, "skipped": update.skipped(out.finite)}, out.loss

    old, old_metrics, loss = before_minibatches(state, ro)
    assert leaves_equal(new, old)
    assert set(metrics) == set(old_metrics) and "ratio_mean_u0" not in metrics
    assert all(float(metrics[k]) == float(v) for k, v in old_metrics.items())
    assert bool(jnp.isfinite(loss))


@pytest.mark.slow  # ~10 s: a second update compile (several minibatches); one-minibatch updates are the default tier's
def test_several_minibatches_move_the_ratio_and_the_clip_binds(t2i_card, rollout):
    """4 rows in 2 minibatches × 2 epochs: the first update is at the rollout weights (ratio 1, C2), the
    later ones are not, and with a large step the clipped objective clips."""
    state, ro = rollout
    config = dataclasses.replace(
        CONFIG, ppo=ppo.Schedule(minibatches=2, inner_epochs=2, timestep_fraction=0.5), optimizer=Optimizer(3e-3)
    )
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
    assert (
        ppo.Schedule(timestep_fraction=0.5).steps_kept(4) == 2
        and ppo.Schedule(timestep_fraction=0.1).steps_kept(4) == 1
    )

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


class _Unhashable:
    """A reward object that cannot be hashed: its trainers share nothing."""

    __hash__ = None

    def __call__(self, artifacts, prompts):
        return brightness_reward(artifacts, prompts)


def test_trainers_built_alike_share_their_compiled_step(method, rollout, t2i_card):
    """A second trainer from the same card, reward and equal config (a seed sweep) reuses the first one's jitted
    functions: its step compiles nothing. Any other argument, or one that cannot be hashed, shares nothing."""
    state, _ = rollout
    twin = FlowGRPO(t2i_card, brightness_reward, dataclasses.replace(CONFIG))  # equal by value, another object
    assert twin._step is method._step and twin._rollout_jit is method._rollout_jit and twin.update is method.update
    method.step(state, rl_batch(t2i_card), jax.random.key(1))
    compiled = method._step._cache_size()
    new_state, metrics = twin.step(twin.init(), rl_batch(t2i_card), jax.random.key(2))
    assert method._step._cache_size() == compiled and float(metrics["skipped"]) == 0.0
    other = FlowGRPO(t2i_card, brightness_reward, dataclasses.replace(CONFIG, beta=0.5))
    assert other._step is not method._step
    assert FlowGRPO(t2i_card, constant_reward, CONFIG)._step is not method._step
    unhashable = _Unhashable()
    assert FlowGRPO(t2i_card, unhashable, CONFIG)._step is not FlowGRPO(t2i_card, unhashable, CONFIG)._step


def argument_bytes(lowered) -> int:
    """Bytes of a lowered function's array arguments (PRNG keys, which have no byte size, left out)."""
    leaves = jax.tree.leaves(lowered.args_info)
    arrays = [a for a in leaves if not jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)]
    return sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape)) for a in arrays)


def test_a_reward_model_s_weights_are_arguments_of_the_compiled_step_not_constants(t2i_card):
    """A reward that holds weights (here the digit scorer's network) reaches the jitted step as an argument:
    the lowered step carries its bytes among the arguments and none among its constants, unlike the same
    step with the reward closed over (its weights baked into the program)."""
    from jaxpipe.rewards import weighted

    reward = scorer_reward(jp.cards.build("digit-scorer"))
    method = FlowGRPO(t2i_card, reward, CONFIG)
    weights = weighted.weights_of(reward)
    held = sum(x.nbytes for x in jax.tree.leaves(weights))
    assert held > 100_000 and method.reward_weights is weights
    state, batch, key = method.init(), rl_batch(t2i_card), jax.random.key(0)
    passed = method._step.lower(state, batch, key, weights)
    closed = jax.jit(lambda s, b, k: method.step_fn(s, b, k)).lower(state, batch, key)
    assert argument_bytes(passed) - argument_bytes(closed) == held
    assert len(closed.as_text()) - len(passed.as_text()) > held  # the closed-over weights, printed as constants
    bound = weighted.bind(reward, jax.tree.map(jnp.zeros_like, weights))
    images = jnp.full((2, 16, 16, 1), 0.5)
    prompts = Prompts.from_texts(t2i_card, ["seven", "one"], {"digit": [7, 1]})
    assert not np.allclose(bound({"image": images}, prompts)["digit"], reward({"image": images}, prompts)["digit"])
    with pytest.raises(ValueError, match="holds no weights"):
        weighted.bind(brightness_reward, weights)
