"""The denoise loop: pure step, fused scan, capture, SDE window, guidance, per-request sigmas."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_flags import USERS_EMITTERS

from jaxpipe.loops import denoise
from jaxpipe.loops.denoise import DenoiseConfig
from jaxpipe.nn import DiTCond

PROMPTS = ["seven thick", "one thin left", "three bright"]


def setup(card, config, seeds=(0, 1, 2), with_uncond=False):
    ids = jnp.asarray(card.spec.tokenizer.encode(PROMPTS[: len(seeds)], 8))
    cond = DiTCond(card["text_encoder"](ids), ids != 0)
    uncond = DiTCond(card["text_encoder"](jnp.zeros_like(ids)), jnp.zeros_like(ids, bool)) if with_uncond else None
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    return denoise.init(keys, card.spec.loop("t2i_denoise").latent_shape, cond, config, uncond)


def _fused(model, state, config, capture=False):
    return denoise.run(model, state, config, capture=capture)


def _one_step(model, state, config):
    return denoise.step(model, state, config)


fused = jax.jit(_fused, static_argnames=("config", "capture"))
one_step = jax.jit(_one_step, static_argnames="config")
# the same, compiled with the emitters users run: a fused scan and driven steps are compared bit for bit under them
users_fused = jax.jit(_fused, static_argnames=("config", "capture"), compiler_options=USERS_EMITTERS)
users_one_step = jax.jit(_one_step, static_argnames="config", compiler_options=USERS_EMITTERS)


def driven(model, state, config, step=one_step):
    records = []
    for _ in range(config.num_steps):
        state, rec = step(model, state, config)
        records.append(rec)
    return state, records


@pytest.mark.parametrize(
    "config",
    [DenoiseConfig(num_steps=6), DenoiseConfig(num_steps=6, sampler="sde"), DenoiseConfig(num_steps=5, shift=3.0)],
    ids=["ode", "sde", "ode-shift"],
)
def test_fused_scan_equals_stepwise_bit_for_bit(t2i_card, config):
    model = t2i_card["transformer"]
    state = setup(t2i_card, config)
    a, _ = users_fused(model, state, config)
    b, _ = driven(model, state, config, users_one_step)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.step, np.full(3, config.num_steps))


def test_same_seed_same_bits_other_seed_other_output(t2i_card):
    config = DenoiseConfig(num_steps=4, sampler="sde")
    model = t2i_card["transformer"]
    a, _ = fused(model, setup(t2i_card, config, seeds=(7, 8)), config)
    b, _ = fused(model, setup(t2i_card, config, seeds=(7, 8)), config)
    c, _ = fused(model, setup(t2i_card, config, seeds=(7, 9)), config)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.x[0], c.x[0])  # a request's bits do not depend on its neighbours
    assert float(jnp.abs(a.x[1] - c.x[1]).max()) > 1e-3


def test_model_actually_drives_the_output(t2i_card):
    config = DenoiseConfig(num_steps=4)
    state = setup(t2i_card, config)
    out, _ = fused(t2i_card["transformer"], state, config)
    assert float(jnp.abs(out.x - state.x).max()) > 1e-3


@pytest.mark.parametrize("window", [None, (1, 3)])
def test_captured_log_probs_recompute_to_ratio_one(t2i_card, window):
    """C2: teacher-forced recomputation under the rollout weights reproduces the captured log-probs."""
    config = DenoiseConfig(num_steps=5, sampler="sde", sde_window=window)
    model = t2i_card["transformer"]
    state = setup(t2i_card, config)
    _, traj = fused(model, state, config, capture=True)
    lo, hi = config.captured_steps
    assert traj.log_prob.shape == (hi - lo, 3)
    np.testing.assert_array_equal(traj.step[:, 0], np.arange(lo, hi))
    recomputed = jax.jit(denoise.trajectory_log_probs, static_argnames="config")(model, traj, state.cond, config)
    ratio = jnp.exp(recomputed - traj.log_prob)
    np.testing.assert_allclose(ratio, 1.0, atol=1e-5)
    assert float(jnp.abs(traj.sample - traj.mean).max()) > 1e-3  # the SDE really sampled


def test_capture_does_not_change_the_sample(t2i_card):
    config = DenoiseConfig(num_steps=5, sampler="sde", sde_window=(1, 4))
    model = t2i_card["transformer"]
    state = setup(t2i_card, config)
    plain, none = users_fused(model, state, config)
    captured, traj = users_fused(model, state, config, capture=True)
    assert none is None
    np.testing.assert_array_equal(plain.x, captured.x)
    np.testing.assert_array_equal(traj.sample[-1], driven(model, state, config, users_one_step)[1][3].sample)


@pytest.mark.slow
def test_capture_off_allocates_no_trajectory(t2i_card):
    config = DenoiseConfig(num_steps=8, sampler="sde")
    model = t2i_card["transformer"]
    state = setup(t2i_card, config)
    off = jax.eval_shape(functools.partial(denoise.run, config=config, capture=False), model, state)
    on = jax.eval_shape(functools.partial(denoise.run, config=config, capture=True), model, state)
    assert off[1] is None
    assert jax.tree.structure(off[0]) == jax.tree.structure(state)
    assert on[1].x.shape == (8,) + state.x.shape
    out_bytes = lambda capture: (
        fused.lower(model, state, config, capture).compile().memory_analysis().output_size_in_bytes
    )
    assert out_bytes(False) < out_bytes(True) / 4


def test_sde_window_runs_ode_outside(t2i_card):
    model = t2i_card["transformer"]
    ode = DenoiseConfig(num_steps=6)
    windowed = DenoiseConfig(num_steps=6, sampler="sde", sde_window=(2, 4))
    state = setup(t2i_card, ode)
    _, ode_steps = driven(model, state, ode)
    _, win_steps = driven(model, state, windowed)
    for i in (0, 1):  # the ODE prefix is exactly the ODE sampler
        np.testing.assert_array_equal(win_steps[i].sample, ode_steps[i].sample)
        assert float(jnp.abs(win_steps[i].log_prob).max()) == 0.0
    for i in (2, 3):  # the window samples with noise
        assert float(jnp.abs(win_steps[i].sample - win_steps[i].mean).max()) > 1e-3
        assert float(jnp.abs(win_steps[i].std).min()) > 0
    for i in (4, 5):  # the ODE tail is deterministic
        np.testing.assert_array_equal(win_steps[i].sample, win_steps[i].mean)


def test_guidance_one_runs_one_forward_and_cfg_runs_a_doubled_batch(t2i_card):
    model = t2i_card["transformer"]
    seen = []

    class Counting:
        def velocity(self, x, sigma, cond):
            seen.append(x.shape[0])
            return model.velocity(x, sigma, cond)

    counting = Counting()
    assert isinstance(counting, denoise.Denoiser) and isinstance(model, denoise.Denoiser)
    for guidance, expected in ((1.0, 3), (4.0, 6)):
        seen.clear()
        config = DenoiseConfig(num_steps=2, guidance=guidance)
        state = setup(t2i_card, config, with_uncond=True)
        jax.eval_shape(lambda s, config=config: denoise.step(counting, s, config), state)
        assert seen == [expected]
    base = DenoiseConfig(num_steps=4)
    state = setup(t2i_card, base, with_uncond=True)
    plain, _ = fused(model, state, base)
    guided, _ = fused(model, state, base.replace(guidance=4.0))
    assert float(jnp.abs(plain.x - guided.x).max()) > 1e-3


def test_requests_at_different_steps_share_one_batch(t2i_card):
    """Per-request sigmas: stepping a mixed batch equals stepping each request alone."""
    model = t2i_card["transformer"]
    config = DenoiseConfig(num_steps=6, sampler="sde")
    state = setup(t2i_card, config)
    state = state._replace(step=jnp.array([0, 3, 6], jnp.int32))  # the third request is finished
    mixed, rec = one_step(model, state, config)
    for b in range(2):
        alone = jax.tree.map(lambda a, b=b: a[b : b + 1], state)
        single, _ = one_step(model, alone, config)
        np.testing.assert_allclose(mixed.x[b], single.x[0], atol=1e-5)
    np.testing.assert_array_equal(mixed.x[2], state.x[2])
    np.testing.assert_array_equal(mixed.step, [1, 4, 6])
    assert float(rec.log_prob[2]) == 0.0


def test_bad_configs_and_inputs_name_the_problem(t2i_card):
    with pytest.raises(ValueError, match="num_steps"):
        DenoiseConfig(num_steps=0)
    with pytest.raises(ValueError, match="noise_level"):
        DenoiseConfig(noise_level=-0.5)
    with pytest.raises(ValueError, match="sampler"):
        DenoiseConfig(sampler="dpm")
    with pytest.raises(ValueError, match="sde_window"):
        DenoiseConfig(num_steps=4, sampler="sde", sde_window=(2, 9))
    with pytest.raises(ValueError, match="unconditional"):
        setup(t2i_card, DenoiseConfig(guidance=3.0))
    state = setup(t2i_card, DenoiseConfig(num_steps=4))
    with pytest.raises(ValueError, match="num_steps"):
        denoise.run(t2i_card["transformer"], state, DenoiseConfig(num_steps=5))
    with pytest.raises(ValueError, match="keys"):
        denoise.init(jax.random.split(jax.random.PRNGKey(0), 2), (1, 8, 8, 4), state.cond, DenoiseConfig())
    with pytest.raises(ValueError, match="SDE"):
        denoise.trajectory_log_probs(t2i_card["transformer"], None, state.cond, DenoiseConfig())
