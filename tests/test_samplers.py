"""The sampler math against an independent float64 NumPy derivation, plus its identities."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpipe import samplers

ETA = 0.7


# ---------------------------------------------------------------- float64 reference, written from the math
def ref_coefficients(sigma, sigma_next, eta):
    sigma = np.asarray(sigma, np.float64)
    sigma_next = np.asarray(sigma_next, np.float64)
    dt = sigma_next - sigma
    sigma_d = np.where(sigma >= 1.0, sigma_next, sigma)
    std = np.sqrt(sigma / (1.0 - sigma_d)) * eta
    a = 1.0 + std**2 * dt / (2.0 * sigma)
    b = (1.0 + std**2 * (1.0 - sigma) / (2.0 * sigma)) * dt
    return a, b, std * np.sqrt(-dt)


def ref_log_prob(x, v, sigma, sigma_next, sample, eta):
    a, b, s = ref_coefficients(sigma, sigma_next, eta)
    shape = (-1,) + (1,) * (x.ndim - 1)
    a, b, s = (np.reshape(c, shape) if np.ndim(c) else c for c in (a, b, s))
    mean = a * x + b * v
    lp = -((sample - mean) ** 2) / (2 * s**2) - np.log(s) - 0.5 * np.log(2 * np.pi)
    return lp.reshape(len(x), -1).mean(-1), mean


def random_case(seed, batch=3, shape=(1, 4, 4, 2), per_example=True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch,) + shape)
    v = rng.normal(size=x.shape)
    noise = rng.normal(size=x.shape)
    sched = np.linspace(1, 0, 9)
    if per_example:
        i = rng.integers(0, 8, size=batch)
        sigma, sigma_next = sched[i], sched[i + 1]
    else:
        i = int(rng.integers(0, 8))
        sigma, sigma_next = sched[i], sched[i + 1]
    return x, v, noise, sigma, sigma_next


def f32(*arrays):
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


# ---------------------------------------------------------------- schedule
def test_flow_sigmas_endpoints_monotone_and_identity_shift():
    for shift in (1.0, 3.0, 0.5):
        s = np.asarray(samplers.flow_sigmas(10, shift))
        assert s.shape == (11,)
        assert s[0] == pytest.approx(1.0) and s[-1] == pytest.approx(0.0)
        assert np.all(np.diff(s) < 0)
    np.testing.assert_allclose(samplers.flow_sigmas(7, 1.0), np.linspace(1, 0, 8), atol=1e-7)


def test_shift_matches_formula():
    base = np.linspace(1, 0, 6)
    expected = 3.0 * base / (1 + 2.0 * base)
    np.testing.assert_allclose(samplers.flow_sigmas(5, 3.0), expected, atol=1e-6)
    assert np.all(np.asarray(samplers.flow_sigmas(5, 3.0))[1:-1] > base[1:-1])  # shift > 1 spends longer at high noise


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_flow_sigmas_rejects_bad_step_count(bad):
    with pytest.raises(ValueError, match="num_steps"):
        samplers.flow_sigmas(bad)


def test_shift_must_be_positive():
    with pytest.raises(ValueError, match="shift"):
        samplers.flow_sigmas(4, shift=0.0)


# ---------------------------------------------------------------- formulas vs float64 reference
@pytest.mark.parametrize("per_example", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_euler_matches_reference(seed, per_example):
    x, v, _, s, sn = random_case(seed, per_example=per_example)
    dt = np.reshape(sn - s, (-1, 1, 1, 1, 1)) if per_example else sn - s
    got = samplers.euler_step(*f32(x, v), *f32(s, sn))
    np.testing.assert_allclose(got, x + dt * v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_example", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_sde_step_matches_reference(seed, per_example):
    x, v, noise, s, sn = random_case(seed, per_example=per_example)
    a, b, std = ref_coefficients(s, sn, ETA)
    shape = (-1, 1, 1, 1, 1)
    a, b, std = (np.reshape(c, shape) if np.ndim(c) else c for c in (a, b, std))
    mean = a * x + b * v
    sample = mean + std * noise
    lp, _ = ref_log_prob(x, v, s, sn, sample, ETA)
    out = samplers.sde_step(*f32(x, v), *f32(s, sn), jnp.asarray(noise, jnp.float32), noise_level=ETA)
    np.testing.assert_allclose(out.mean, mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.sample, sample, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.broadcast_to(out.std, np.shape(std)), std, rtol=1e-5)
    np.testing.assert_allclose(out.log_prob, lp, rtol=1e-5, atol=1e-5)
    assert out.log_prob.shape == (len(x),)


@pytest.mark.parametrize("seed", range(4))
def test_sde_log_prob_and_ml_velocity_match_reference(seed):
    x, v, noise, s, sn = random_case(seed)
    sample = x + 0.1 * noise
    lp, _ = ref_log_prob(x, v, s, sn, sample, ETA)
    got = samplers.sde_log_prob(*f32(x, v), *f32(s, sn), jnp.asarray(sample, jnp.float32), noise_level=ETA)
    np.testing.assert_allclose(got, lp, rtol=1e-5, atol=1e-4)
    a, b, _ = ref_coefficients(s, sn, ETA)
    v_ml = (sample - a.reshape(-1, 1, 1, 1, 1) * x) / b.reshape(-1, 1, 1, 1, 1)
    got_v = samplers.ml_velocity(*f32(x, sample), *f32(s, sn), noise_level=ETA)
    np.testing.assert_allclose(got_v, v_ml, rtol=1e-4, atol=1e-4)


def test_cfg_combine():
    c, u = jnp.array([[1.0, 2.0]]), jnp.array([[0.5, -1.0]])
    np.testing.assert_allclose(samplers.cfg_combine(c, u, 1.0), c)
    np.testing.assert_allclose(samplers.cfg_combine(c, u, 0.0), u)
    np.testing.assert_allclose(samplers.cfg_combine(c, u, 3.0), u + 3.0 * (c - u))


# ---------------------------------------------------------------- identities
@pytest.mark.parametrize("seed", range(3))
def test_ml_velocity_lands_exactly_on_sample(seed):
    x, v, noise, s, sn = random_case(seed)
    realized = samplers.sde_step(*f32(x, v), *f32(s, sn), jnp.asarray(noise, jnp.float32))
    v_ml = samplers.ml_velocity(jnp.asarray(x, jnp.float32), realized.sample, *f32(s, sn))
    again = samplers.sde_step(jnp.asarray(x, jnp.float32), v_ml, *f32(s, sn), jnp.zeros(x.shape, jnp.float32))
    np.testing.assert_allclose(again.sample, realized.sample, atol=2e-5)


@pytest.mark.parametrize("seed", range(3))
def test_log_prob_gradient_points_to_ml_velocity(seed):
    """∂ log_prob / ∂v = b²/(σ_eff²·D) · (v_ml − v): the policy gradient moves v toward v_ml."""
    x, v, noise, s, sn = random_case(seed)
    x, v, noise = f32(x, v, noise)
    sample = samplers.sde_step(x, v + 0.3 * noise, *f32(s, sn), noise).sample  # realized under another velocity
    grad = jax.grad(lambda v_: samplers.sde_log_prob(x, v_, *f32(s, sn), sample).sum())(v)
    direction = samplers.ml_velocity(x, sample, *f32(s, sn)) - v
    for i in range(len(x)):
        g, d = np.asarray(grad[i]).ravel(), np.asarray(direction[i]).ravel()
        cos = g @ d / (np.linalg.norm(g) * np.linalg.norm(d))
        assert cos > 0.9999
        a, b, std = ref_coefficients(s[i], sn[i], ETA)
        np.testing.assert_allclose(g, b**2 / (std**2 * d.size) * d, rtol=1e-3, atol=1e-7)


def test_gradient_is_nonzero_at_ratio_one():
    """At the rollout weights (ratio == 1) the sample is not the mean, so the gradient is non-zero."""
    x, v, noise, s, sn = f32(*random_case(0))
    realized = samplers.sde_step(x, v, s, sn, noise)
    grad = jax.grad(lambda v_: samplers.sde_log_prob(x, v_, s, sn, realized.sample).sum())(v)
    assert float(jnp.abs(grad).max()) > 1e-3


def test_sample_is_a_constant_inside_log_prob():
    x, v, noise, s, sn = f32(*random_case(1))
    realized = samplers.sde_step(x, v, s, sn, noise)
    g_sample = jax.grad(lambda y: samplers.sde_log_prob(x, v, s, sn, y).sum())(realized.sample)
    assert float(jnp.abs(g_sample).max()) == 0.0


# ---------------------------------------------------------------- first step conditioning
@pytest.mark.parametrize("num_steps", [4, 10, 40])
def test_first_step_is_well_conditioned(num_steps):
    sig = samplers.flow_sigmas(num_steps)
    coef = samplers.sde_coefficients(sig[0], sig[1], ETA)
    assert float(coef.a) == pytest.approx(1 - ETA**2 / 2, abs=1e-6)
    assert float(coef.b) == pytest.approx(float(sig[1] - sig[0]), rel=1e-5)  # b = dt at σ = 1
    assert float(coef.std) == pytest.approx(ETA, rel=1e-5)  # σ_eff = η at σ = 1
    # The bug this guards against: clamping σ to 1 - 1e-4 instead of using σ_next blows `a` up.
    clamped = samplers.sde_coefficients(jnp.float32(1 - 1e-4), sig[1], ETA)
    assert abs(float(clamped.a)) > 10 * abs(float(coef.a))


def test_first_step_sample_is_finite_and_bounded():
    x = jax.random.normal(jax.random.key(0), (4, 1, 8, 8, 4))
    v = jax.random.normal(jax.random.key(1), x.shape)
    sig = samplers.flow_sigmas(20)
    out = samplers.sde_step(x, v, sig[0], sig[1], jax.random.normal(jax.random.key(2), x.shape))
    assert bool(jnp.all(jnp.isfinite(out.sample))) and float(jnp.abs(out.sample).max()) < 10


# ---------------------------------------------------------------- likelihood properties
def test_log_prob_is_maximal_at_the_mean():
    x, v, noise, s, sn = f32(*random_case(2))
    out = samplers.sde_step(x, v, s, sn, noise)
    at_mean = samplers.sde_log_prob(x, v, s, sn, out.mean)
    at_sample = samplers.sde_log_prob(x, v, s, sn, out.sample)
    assert bool(jnp.all(at_mean > at_sample))
    for scale in (1e-3, 1e-2, 1e-1):
        off = samplers.sde_log_prob(x, v, s, sn, out.mean + scale * noise)
        assert bool(jnp.all(at_mean > off))


def test_recompute_gives_ratio_one():
    x, v, noise, s, sn = f32(*random_case(3))
    out = samplers.sde_step(x, v, s, sn, noise)
    again = samplers.sde_log_prob(x, v, s, sn, out.sample)
    np.testing.assert_allclose(jnp.exp(again - out.log_prob), 1.0, atol=1e-6)


def test_zero_noise_level_reduces_to_euler():
    x, v, noise, s, sn = f32(*random_case(4))
    coef = samplers.sde_coefficients(s, sn, 0.0)
    np.testing.assert_allclose(coef.a, 1.0)
    np.testing.assert_allclose(coef.b, sn - s, rtol=1e-6)
    out = samplers.sde_step(x, v, s, sn, noise, noise_level=0.0)
    np.testing.assert_allclose(out.sample, samplers.euler_step(x, v, s, sn), atol=1e-6)


# ---------------------------------------------------------------- transforms
def test_jit_vmap_grad():
    x, v, noise, s, sn = f32(*random_case(5))
    eager = samplers.sde_step(x, v, s, sn, noise)
    jitted = jax.jit(samplers.sde_step)(x, v, s, sn, noise)
    np.testing.assert_allclose(jitted.sample, eager.sample, atol=1e-6)
    np.testing.assert_allclose(jitted.log_prob, eager.log_prob, atol=1e-6)
    # vmap over the batch one example at a time (each as a batch of one) equals the batched call
    per = jax.vmap(lambda xi, vi, si, sni, ni: samplers.sde_step(xi[None], vi[None], si, sni, ni[None]).log_prob[0])(
        x, v, s, sn, noise
    )
    np.testing.assert_allclose(per, eager.log_prob, atol=1e-6)
    g = jax.jit(jax.grad(lambda v_: samplers.sde_log_prob(x, v_, s, sn, eager.sample).sum()))(v)
    assert g.shape == v.shape and bool(jnp.all(jnp.isfinite(g)))


def test_bfloat16_inputs_compute_in_float32():
    x, v, noise, s, sn = f32(*random_case(6))
    out = samplers.sde_step(x.astype(jnp.bfloat16), v.astype(jnp.bfloat16), s, sn, noise)
    assert out.sample.dtype == jnp.float32 and out.log_prob.dtype == jnp.float32


@settings(max_examples=40, deadline=None)
@given(
    sigma=st.floats(0.02, 1.0),
    frac=st.floats(0.05, 0.95),
    eta=st.floats(0.05, 1.5),
    seed=st.integers(0, 2**16),
)
def test_identities_hold_across_the_schedule(sigma, frac, eta, seed):
    sigma_next = sigma * (1 - frac)
    rng = np.random.default_rng(seed)
    x, v, noise = (jnp.asarray(rng.normal(size=(2, 6)), jnp.float32) for _ in range(3))
    out = samplers.sde_step(x, v, sigma, sigma_next, noise, noise_level=eta)
    a, b, std = ref_coefficients(sigma, sigma_next, eta)
    assert math.isfinite(float(a)) and b < 0 and std > 0
    v_ml = samplers.ml_velocity(x, out.sample, sigma, sigma_next, noise_level=eta)
    back = samplers.sde_step(x, v_ml, sigma, sigma_next, jnp.zeros_like(x), noise_level=eta).sample
    np.testing.assert_allclose(back, out.sample, atol=1e-4 * max(1.0, float(jnp.abs(out.sample).max())))


# ---------------------------------------------------------------- bad arguments
def test_negative_noise_level_is_rejected():
    x, v, noise, s, sn = f32(*random_case(0))
    with pytest.raises(ValueError, match="noise_level"):
        samplers.sde_step(x, v, s, sn, noise, noise_level=-0.1)
    with pytest.raises(ValueError, match="noise_level"):
        samplers.ml_velocity(x, x, s, sn, noise_level=-1.0)


def test_mismatched_shapes_name_the_argument():
    x = jnp.zeros((2, 4))
    with pytest.raises(ValueError, match="^v "):
        samplers.euler_step(x, jnp.zeros((2, 5)), 1.0, 0.5)
    with pytest.raises(ValueError, match="^noise "):
        samplers.sde_step(x, x, 1.0, 0.5, jnp.zeros((3, 4)))
    with pytest.raises(ValueError, match="^sample "):
        samplers.sde_log_prob(x, x, 1.0, 0.5, jnp.zeros((4,)))
    with pytest.raises(ValueError, match="sigma"):
        samplers.euler_step(x, x, jnp.ones((3,)), 0.5)
