"""DMD2: the gradient and its surrogate against NumPy, the update's direction, learning toward the teacher,
the finite guard, bad configs, and the bundled ``flux-t2i-turbo`` served by the engine."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaves_equal, rl_batch

import jaxpipe as jp
from jaxpipe.engine import Engine
from jaxpipe.training import DMD2, DistributionMatching, DMD2Config, Group, NoiseLevels, Optimizer
from jaxpipe.training.distribution_matching import clean_estimates, dm_gradient, dm_surrogate

CONFIG = DMD2Config(
    student_steps=2,
    group=Group(size=8),
    student=Optimizer(1e-3, b1=0.0),
    dm=DistributionMatching(critic=Optimizer(1e-3, b1=0.0), critic_steps=2, real_guidance=2.0),
)


@pytest.fixture(scope="module")
def method(t2i_card):
    return DMD2(t2i_card, CONFIG)


@pytest.fixture(scope="module")
def jitted(method):
    """The student's clean estimate and DMD2's gradient, compiled once for the tests that recompute them."""

    def dm_terms(teacher, critic, frozen, x0, ro, key):  # the real and fake scores at x0 re-noised, as DMD2._update
        x0_real, x0_fake = clean_estimates(
            (method._model(teacher, frozen),),
            (method._model(critic, frozen),),
            x0,
            key,
            ro.cond,
            ro.uncond,
            method.real,
            method.plain,
            method.config.dm.noise,
        )
        return dm_gradient(x0, x0_real, x0_fake)

    return jax.jit(method.student_x0), jax.jit(dm_terms)


@pytest.fixture(scope="module")
def rollout(method, t2i_card):
    state = method.init()
    return state, method.rollout(state, rl_batch(t2i_card), jax.random.key(0))


def test_gradient_and_surrogate_match_numpy():
    rng = np.random.default_rng(0)
    x0, real, fake = (rng.normal(size=(3, 1, 4, 4, 2)).astype(np.float32) for _ in range(3))
    expected = (fake - real) / np.abs(x0 - real).mean(axis=(1, 2, 3, 4), keepdims=True)
    g = dm_gradient(jnp.asarray(x0), jnp.asarray(real), jnp.asarray(fake))
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-5)
    loss, grad = jax.value_and_grad(dm_surrogate)(jnp.asarray(x0), g)
    # L = mean_b 0.5·‖x̂0_b − sg(x̂0_b − g_b)‖² = mean_b 0.5·‖g_b‖², and ∂L/∂x̂0_b = g_b / B
    np.testing.assert_allclose(float(loss), 0.5 * (expected**2).sum(axis=(1, 2, 3, 4)).mean(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad) * x0.shape[0], expected, rtol=1e-5)
    # g is a constant: nothing flows back into the estimates it was computed from
    dg = jax.grad(lambda r: jnp.sum(dm_gradient(jnp.asarray(x0), r, jnp.asarray(fake))))(jnp.asarray(real))
    assert float(jnp.abs(dg).max()) == 0.0


def test_bad_configs_raise(t2i_card):
    bad_configs = [
        (lambda: DMD2Config(student_steps=0), "student_steps"),
        (lambda: DistributionMatching(critic_steps=0), "critic_steps"),
        (lambda: Group(size=0), "group size"),
        (lambda: Optimizer(0.0, b1=0.0), "learning_rate"),  # the student's
        (lambda: DistributionMatching(critic=Optimizer(-1.0)), "learning_rate"),
        (lambda: NoiseLevels(min=0.5, max=0.4), "min < max"),
        (lambda: DistributionMatching(noise=NoiseLevels(min=0.0)), "noise.min must be > 0"),
        (lambda: DistributionMatching(real_guidance=-1.0), "real_guidance"),
        (lambda: Optimizer(1e-4, b1=1.0), "b1"),
    ]
    for make, match in bad_configs:
        with pytest.raises(ValueError, match=match):
            make()
    teacher_steps = t2i_card.spec.loops[0].config.num_steps
    with pytest.raises(ValueError, match="exceeds the teacher's"):
        DMD2(t2i_card, DMD2Config(student_steps=teacher_steps + 1))


def test_student_card_and_backward_simulation(method, rollout, jitted):
    """The student card samples 2 steps at guidance 1; each row trains one step of the student's own
    rollout: step 0 from the noise at σ = 1, step 1 from the loop's state at σ = 1/2, whose clean
    estimate IS the rendered sample."""
    state, ro = rollout
    card = method.card(state)
    sampling = card.spec.loops[0].config
    assert (sampling.num_steps, sampling.guidance) == (2, 1.0) and card.spec.config.sampling == sampling
    assert card.model_id == "flux-t2i-turbo" and method.real.guidance == 2.0 and method.plain.guidance == 1.0
    assert ro.x.shape == ro.latents.shape == (16, *card.spec.loops[0].latent_shape)
    last = np.asarray(ro.step) == 1
    assert 0 < last.sum() < 16 and np.array_equal(np.asarray(ro.sigma), np.where(last, 0.5, 1.0))
    x0 = np.asarray(jitted[0](state.params["student"], state.frozen, ro))
    np.testing.assert_allclose(x0[last], np.asarray(ro.latents)[last], atol=1e-5)
    assert np.abs(x0[~last] - np.asarray(ro.latents)[~last]).max() > 0.01  # step 0's estimate is not the sample


def test_update_moves_the_student_against_the_dm_gradient(method, rollout, jitted):
    """At the update's own re-noising: ⟨x̂0_new − x̂0_old, g⟩ < 0 (a flipped sign makes it > 0)."""
    state, ro = rollout
    student_x0, dm_terms = jitted
    key = jax.random.key(1)
    new, metrics = method.update(state, ro, key)
    assert float(metrics["skipped"]) == 0.0 and float(metrics["critic_skipped"]) == 0.0
    assert not leaves_equal(new.params["critic"], state.params["critic"])
    assert leaves_equal(new.copies["teacher"], state.copies["teacher"])
    x0_old = student_x0(state.params["student"], state.frozen, ro)
    x0_new = student_x0(new.params["student"], new.frozen, ro)
    _, k_dm = jax.random.split(key)  # the draws DMD2._update makes; the critic is the updated one
    g = dm_terms(state.copies["teacher"], new.params["critic"], state.frozen, x0_old, ro, k_dm)
    np.testing.assert_allclose(
        float(metrics["dm_loss"]), float(0.5 * jnp.mean(jnp.sum(g**2, axis=(1, 2, 3, 4)))), rtol=1e-4
    )
    assert float(jnp.sum(g * (x0_new - x0_old))) < 0


def test_non_finite_step_is_skipped(method, rollout):
    """A NaN input row poisons the student's samples, so every critic step and the student step are
    non-finite: each is skipped (params and Adam moments kept), and the step counter goes on."""
    state, ro = rollout
    nan = ro._replace(x=ro.x.at[0].set(jnp.nan))
    new, metrics = method.update(state, nan, jax.random.key(3))
    assert float(metrics["skipped"]) == 1.0 and float(metrics["critic_skipped"]) == CONFIG.dm.critic_steps
    assert int(new.step) == 1
    assert leaves_equal((new.params, new.opt_state, new.copies), (state.params, state.opt_state, state.copies))


@pytest.mark.slow  # ~6 s: a learning run; by default one update moves the student against the DM gradient
def test_a_few_steps_move_the_student_toward_the_teacher(method, rollout, t2i_card):
    """Summed over prompts, the squared distance between the per-prompt mean latent of the student's 2-step
    samples and of the teacher's 8-step guidance-2 samples falls (measured: 264 -> 150-160 after 5-8 updates;
    about 100 of it is the 8-sample estimates' own noise)."""
    state, _ = rollout
    batch, k = rl_batch(t2i_card), CONFIG.group.size
    teacher = np.asarray(
        jp.generate(t2i_card, ["seven thick"] * k + ["one thin"] * k, seed=list(range(2 * k)), guidance=2.0)["latents"]
    ).reshape(2, k, -1)

    def distance(state):
        latents = np.asarray(method.rollout(state, batch, jax.random.key(99)).latents).reshape(2, k, -1)
        return float(sum(((latents[p].mean(0) - teacher[p].mean(0)) ** 2).sum() for p in range(2)))

    before, key = distance(state), jax.random.key(10)
    for _ in range(6):
        key, k_ro, k_up = jax.random.split(key, 3)
        state, metrics = method.update(state, method.rollout(state, batch, k_ro), k_up)
        assert float(metrics["skipped"]) == 0.0
    after = distance(state)
    assert after < 0.7 * before, (before, after)


@pytest.mark.skipif("flux-t2i-turbo" not in jp.cards.available(), reason="bundled card missing")
def test_bundled_turbo_card_loads_and_is_served():
    card = jp.cards.load("flux-t2i-turbo")
    teacher = jp.cards.load("flux-t2i")
    sampling = card.spec.loops[0].config
    assert sampling.num_steps <= 2 and sampling.guidance == 1.0
    assert dataclasses.replace(sampling, num_steps=8, guidance=2.0) == teacher.spec.loops[0].config
    assert leaves_equal(card["vae"], teacher["vae"]) and not leaves_equal(card["transformer"], teacher["transformer"])
    engine = Engine()
    engine.register(card)
    out = engine.run(jp.Request("flux-t2i-turbo", prompt="seven thick", seed=0))  # its default steps and guidance
    assert out["image"].shape == (16, 16, 1) and bool(jnp.all(jnp.isfinite(out["image"])))
