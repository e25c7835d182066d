"""The gradient signal-to-noise diagnostic: its estimator, and that it reads the gradient a trainer's step follows."""

import jax
import numpy as np
import pytest
from conftest import brightness_reward, rl_batch

from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, Sampling, gradient_noise

CONFIG = FlowGRPOConfig(
    group=Group(2), sampling=Sampling(num_steps=3, sampler="sde", sde_window=(0, 2)), optimizer=Optimizer(1e-4)
)


def test_the_estimator_reads_signal_over_noise_and_about_zero_for_pure_noise():
    """Draws mu + sigma·eps in D dimensions: the SNR is |mu|² / (D sigma²), and about 0 with mu = 0 (the
    signal estimate is unbiased: the mean's own noise is taken off)."""
    rng = np.random.default_rng(0)
    d, n, sigma = 400, 2000, 0.5
    mu = rng.normal(size=d) * 0.05
    snr, signal, noise = gradient_noise.signal_to_noise(mu + sigma * rng.normal(size=(n, d)))
    assert noise == pytest.approx(d * sigma**2, rel=0.02)
    assert signal == pytest.approx(float(mu @ mu), rel=0.1)
    assert snr == pytest.approx(float(mu @ mu) / (d * sigma**2), rel=0.1)
    pure, _, _ = gradient_noise.signal_to_noise(sigma * rng.normal(size=(n, d)))
    assert abs(pure) < 0.002
    with pytest.raises(ValueError, match="n >= 2"):
        gradient_noise.signal_to_noise(np.ones((1, 3)))
    with pytest.raises(ValueError, match="not finite"):
        gradient_noise.signal_to_noise(np.array([[1.0, np.nan], [0.0, 1.0]]))


def test_the_recorded_gradient_is_the_one_the_step_follows(t2i_card):
    """The recorded gradient of a FlowGRPO step, whose weights it leaves as they were, is the direction the real
    step moves: Adam's first update is -lr · sign(g) where |g| is well above its epsilon. A key gives the same
    gradient twice, another key another gradient; the measurement reports the images per step and, at this
    tiny batch, warns with the batch that would reach the useful level."""
    method = FlowGRPO(t2i_card, brightness_reward, CONFIG)
    state, batch = method.init(), rl_batch(t2i_card)
    keys = jax.random.split(jax.random.key(3), 2)
    grads = gradient_noise.step_gradients(method, state, batch, keys[np.array([0, 0, 1])])["generator"]
    np.testing.assert_array_equal(grads[0], grads[1])
    assert not np.allclose(grads[0], grads[2]) and np.abs(grads[0]).max() > 0
    new, _ = method.step(state, batch, keys[0])
    delta = np.concatenate(
        [
            np.ravel(np.asarray(b) - np.asarray(a))
            for a, b in zip(jax.tree.leaves(state.params["generator"]), jax.tree.leaves(new.params["generator"]))
        ]
    )
    clear = np.abs(grads[0]) > 1e-5
    assert clear.sum() > 1000
    assert np.mean(np.sign(delta[clear]) == -np.sign(grads[0][clear])) > 0.99
    report = gradient_noise.measure(method, batch, jax.random.key(4), rollouts=3)
    assert report.images == len(batch) * CONFIG.group.size and report.rollouts == 3
    assert np.isfinite(report.snr) and set(report.by_part) == {"generator"}
    if report.low and report.images_for() is not None:
        assert report.images_for() > report.images and "images per step would reach" in report.message()
    assert report.to_json()["useful"] == gradient_noise.USEFUL
    with pytest.raises(ValueError, match="rollouts >= 2"):
        gradient_noise.measure(method, batch, jax.random.key(4), rollouts=1)
