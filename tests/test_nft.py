"""DiffusionNFT: the v± construction against NumPy, exact no-ops, the finite guard, behavioural C2, learning."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import brightness_reward, leaves_equal, rl_batch

from jaxpipe.training import EMA, DiffusionNFT, DiffusionNFTConfig, Group, NoiseLevels, Optimizer, Sampling
from jaxpipe.training import rollout as rollouts
from jaxpipe.training.ema import EvalEMA
from jaxpipe.training.methods.nft import ema_decay, nft_adaptive_loss, nft_loss, optimality_weight
from jaxpipe.training.runs.reports import served_card

CONFIG = DiffusionNFTConfig(
    group=Group(4, adv_clip=2.0),
    sampling=Sampling(num_steps=3),
    optimizer=Optimizer(1e-3),
    beta=0.7,
    ema=EMA(start=0.0, end=0.5, ramp_steps=4),
)


@pytest.fixture(scope="module")
def method(t2i_card):
    return DiffusionNFT(t2i_card, brightness_reward, CONFIG)


@pytest.fixture(scope="module")
def rollout(method, t2i_card):
    state = method.init()
    return state, method.rollout(state, rl_batch(t2i_card), jax.random.key(0))


def test_loss_and_weights_match_numpy():
    rng = np.random.default_rng(0)
    v_theta, v_old, target = (rng.normal(size=(5, 3, 4, 2)).astype(np.float32) for _ in range(3))
    adv = np.array([-3.0, -0.5, 0.0, 1.0, 2.5], np.float32)
    r = np.asarray(optimality_weight(jnp.asarray(adv), 2.0))
    np.testing.assert_allclose(r, 0.5 + 0.5 * np.clip(adv / 2.0, -1, 1), rtol=1e-6)
    assert r.min() == 0.0 and r.max() == 1.0
    beta = 0.3
    v_pos = (1 - beta) * v_old + beta * v_theta
    v_neg = (1 + beta) * v_old - beta * v_theta
    per_row = r * ((v_pos - target) ** 2).mean((1, 2, 3)) + (1 - r) * ((v_neg - target) ** 2).mean((1, 2, 3))
    loss, metrics = nft_loss(jnp.asarray(v_theta), jnp.asarray(v_old), jnp.asarray(target), jnp.asarray(r), beta)
    np.testing.assert_allclose(float(loss), per_row.mean(), rtol=1e-5)
    # v_old is a constant: the gradient in v_θ is the NumPy derivative of the same objective
    grad = jax.grad(lambda v: nft_loss(v, jnp.asarray(v_old), jnp.asarray(target), jnp.asarray(r), beta)[0])(
        jnp.asarray(v_theta)
    )
    n = v_theta[0].size
    rr = r[:, None, None, None]
    expected = (2 * beta / n / 5) * (rr * (v_pos - target) - (1 - rr) * (v_neg - target))
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-4, atol=1e-7)


def official_nft_loss(torch, forward_prediction, old_prediction, ref_forward_prediction, xt, x0, t, adv, *, beta, kl_beta,
                      adv_clip_max):  # fmt: skip
    """NVlabs/DiffusionNFT ``scripts/train_nft_sd3.py``'s loss of one timestep (adv_mode "all"), re-typed."""
    advantages_clip = torch.clamp(adv, -adv_clip_max, adv_clip_max)
    r = torch.clamp((advantages_clip / adv_clip_max) / 2.0 + 0.5, 0, 1)
    t_expanded = t.view(-1, *([1] * (len(x0.shape) - 1)))
    positive_prediction = beta * forward_prediction + (1 - beta) * old_prediction.detach()
    implicit_negative_prediction = (1.0 + beta) * old_prediction.detach() - beta * forward_prediction
    x0_prediction = xt - t_expanded * positive_prediction
    dims = tuple(range(1, x0.ndim))
    with torch.no_grad():
        weight_factor = torch.abs(x0_prediction.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=0.00001)
    positive_loss = ((x0_prediction - x0) ** 2 / weight_factor).mean(dim=dims)
    negative_x0_prediction = xt - t_expanded * implicit_negative_prediction
    with torch.no_grad():
        negative_weight_factor = (
            torch.abs(negative_x0_prediction.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=0.00001)
        )
    negative_loss = ((negative_x0_prediction - x0) ** 2 / negative_weight_factor).mean(dim=dims)
    ori_policy_loss = r * positive_loss / beta + (1.0 - r) * negative_loss / beta
    loss = (ori_policy_loss * adv_clip_max).mean()
    kl_div_loss = ((forward_prediction - ref_forward_prediction) ** 2).mean(dim=dims)
    return loss + kl_beta * torch.mean(kl_div_loss)


def test_the_adaptive_loss_equals_the_official_code_in_float64():
    """``nft_adaptive_loss`` against the official loss re-typed in PyTorch, float64, random tensors: the value
    and the gradient in the trained velocity (the weight factors are constants in both)."""
    torch = pytest.importorskip("torch", reason="the official code's loss is re-typed in PyTorch (the parity extra)")
    rng = np.random.default_rng(3)
    shape = (6, 3, 4, 2)
    v_theta, v_old, v_ref, x0, noise = (rng.normal(size=shape) for _ in range(5))
    t = rng.uniform(0.05, 0.95, size=shape[0])
    xt = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
    adv = np.array([-7.0, -2.0, -0.1, 0.0, 1.5, 6.0])
    beta, kl_beta, clip = 0.7, 1e-2, 5.0

    tt = lambda a: torch.tensor(a, dtype=torch.float64)
    forward = tt(v_theta).requires_grad_(True)
    official = official_nft_loss(
        torch, forward, tt(v_old), tt(v_ref), tt(xt), tt(x0), tt(t), tt(adv), beta=beta, kl_beta=kl_beta,
        adv_clip_max=clip,
    )  # fmt: skip
    official.backward()
    with jax.enable_x64(True):
        r = optimality_weight(jnp.asarray(adv), clip)

        def ours(v):
            args = (v, jnp.asarray(v_old), jnp.asarray(xt), jnp.asarray(x0), jnp.asarray(t), r)
            return nft_adaptive_loss(*args, beta=beta, adv_clip=clip, v_ref=jnp.asarray(v_ref), kl_beta=kl_beta)[0]

        value, grad = jax.value_and_grad(ours)(jnp.asarray(v_theta))
        assert value.dtype == jnp.float64
    np.testing.assert_allclose(float(value), float(official.detach()), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(grad), forward.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_ema_schedule_and_bad_configs():
    assert [round(float(ema_decay(CONFIG.ema, jnp.asarray(n))), 6) for n in (0, 2, 4, 9)] == [0.0, 0.25, 0.5, 0.5]
    assert float(ema_decay(dataclasses.replace(CONFIG.ema, ramp_steps=0), jnp.asarray(0))) == 0.5
    for beta in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]"):
            DiffusionNFTConfig(beta=beta)
    with pytest.raises(ValueError, match="group size"):
        DiffusionNFTConfig(group=Group(1))
    with pytest.raises(ValueError, match="noise level sampling"):
        DiffusionNFTConfig(noise=NoiseLevels("beta"))
    with pytest.raises(ValueError, match=r"EMA.s end must be in \[0.0, 1.0\]"):
        DiffusionNFTConfig(ema=EMA(end=1.2))


def test_reconstructed_sample_equals_the_rollout_bit_for_bit(method, rollout, t2i_card):
    """Behavioural C2: old == current, same keys ⇒ the trainer's re-render is the rollout's sample."""
    state, ro = rollout
    assert leaves_equal(state.params["generator"], state.copies["old"])
    again = method.reconstruct(state, rl_batch(t2i_card), jax.random.key(0))
    assert again.shape == ro.latents.shape and bool(jnp.array_equal(again, ro.latents))
    assert float(jnp.abs(ro.advantages).max()) > 0.5
    new, metrics = method.update(state, ro, jax.random.key(1))
    assert float(metrics["skipped"]) == 0.0 and not leaves_equal(new.params, state.params)
    # d(0) = 0: the old policy is the updated one, so C2 holds again at the next rollout
    assert leaves_equal(new.copies["old"], new.params["generator"])
    moved = method.reconstruct(new, rl_batch(t2i_card), jax.random.key(0))
    assert not bool(jnp.array_equal(moved, ro.latents))  # the check can fail: other weights, other sample


def test_update_moves_the_velocity_toward_high_reward_samples(method, rollout):
    """At the update's own (σ, ε): Σ_i A_i ⟨v_new − v_old, (ε − x0_i) − v_old⟩ > 0, i.e. the velocity
    moves toward the flow-matching targets of high-advantage samples and away from low-advantage ones,
    and the update lowers the NFT loss."""
    state, ro = rollout
    key = jax.random.key(1)
    new, metrics = method.update(state, ro, key)
    x0 = ro.latents
    k_sigma, k_noise = jax.random.split(key)  # the draws DiffusionNFT.loss makes from the update key
    sigma = CONFIG.noise.draw(k_sigma, x0.shape[0])
    noise = jax.random.normal(k_noise, x0.shape)
    s = sigma.reshape((-1,) + (1,) * (x0.ndim - 1))
    x_sigma, target = (1 - s) * x0 + s * noise, noise - x0
    cond = ro.cond
    v_old = method.components(state.params, state.frozen)[method.transformer](
        x_sigma, sigma, cond.context, cond.context_mask
    )
    v_new = method.components(new.params, new.frozen)[method.transformer](
        x_sigma, sigma, cond.context, cond.context_mask
    )
    per_row = jnp.sum((v_new - v_old) * (target - v_old), axis=tuple(range(1, x0.ndim)))
    assert float(jnp.sum(ro.advantages * per_row)) > 0
    after, _ = jax.jit(method.loss)(new.params["generator"], state, ro, key)
    assert float(after) < float(metrics["loss"])


def test_constant_reward_leaves_the_weights_bit_identical(method, rollout, t2i_card):
    state, ro = rollout
    constant = lambda artifacts, prompts: jnp.ones(artifacts["image"].shape[0])
    scored = rollouts.score_rollout(
        constant, {"image": ro.images}, rl_batch(t2i_card).repeat(CONFIG.group.size), CONFIG.group
    )
    adv = scored.advantages
    const = ro._replace(rewards=scored.rewards, advantages=adv, weights=optimality_weight(adv, CONFIG.group.adv_clip))
    assert bool(jnp.all(const.weights == 0.5))
    new, metrics = method.update(state, const, jax.random.key(2))
    assert float(metrics["skipped"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
    assert leaves_equal(new.params, state.params) and leaves_equal(new.copies["old"], state.copies["old"])


def test_non_finite_step_is_skipped(method, rollout):
    state, ro = rollout
    nan = ro._replace(weights=ro.weights.at[0].set(jnp.nan))
    new, metrics = method.update(state, nan, jax.random.key(3))
    assert float(metrics["skipped"]) == 1.0 and int(new.step) == 1
    assert leaves_equal((new.params, new.copies, new.opt_state), (state.params, state.copies, state.opt_state))


@pytest.mark.slow  # the update's direction is tested above; this checks the fused step learns over six
def test_a_few_steps_raise_the_reward(method, rollout, t2i_card):
    """Brightness reward: after six steps the current policy renders brighter
    images from held-out keys than the starting one."""
    state, _ = rollout
    eval_key = jax.random.key(99)
    before = float(jnp.mean(method.render(state.params["generator"], state.frozen, rl_batch(t2i_card), eval_key)[0]))
    key = jax.random.key(10)
    rewards = []
    for _ in range(6):
        key, k = jax.random.split(key)
        state, metrics = method.step(state, rl_batch(t2i_card), k)  # the fused rollout + update
        assert float(metrics["skipped"]) == 0.0
        rewards.append(float(metrics["reward_mean"]))
    after = float(jnp.mean(method.render(state.params["generator"], state.frozen, rl_batch(t2i_card), eval_key)[0]))
    assert after > before + 0.01, (before, after, rewards)  # measured: 0.547 -> 0.581 (a dark reward: -> 0.504)
    assert float(metrics["ema_decay"]) == 0.5 and not leaves_equal(state.copies["old"], state.params["generator"])


def test_the_old_policy_is_served_as_a_role_with_its_own_versions(method, rollout, t2i_card):
    """weight_sync.track / sync: the trained card and NFT's old policy published in one call,
    each versioned on its own; the engine's ``flux-t2i@old`` holds exactly the old policy."""
    from jaxpipe.engine import Engine
    from jaxpipe.training import weight_sync

    state, ro = rollout
    engine = Engine()
    engine.register(t2i_card)
    assert weight_sync.track(engine, method) == {"old": "flux-t2i@old"}
    same = weight_sync.sync(engine, method, state)  # old == params == the card: nothing moves
    assert same == {"flux-t2i": {"text_encoder": 0, "transformer": 0, "vae": 0}, "flux-t2i@old": same["flux-t2i"]}
    for key in (1, 2):  # d(0) = 0, d(1) = 0.125: after two updates the old policy lags the trained one
        state, _ = method.update(state, ro, jax.random.key(key))
    versions = weight_sync.sync(engine, method, state)
    assert versions["flux-t2i"]["transformer"] == 1 and versions["flux-t2i@old"]["transformer"] == 1
    assert versions["flux-t2i@old"]["text_encoder"] == 0
    assert leaves_equal(engine.card("flux-t2i@old")["transformer"], method.old_card(state)["transformer"])
    assert leaves_equal(engine.card("flux-t2i")["transformer"], method.card(state)["transformer"])
    assert not leaves_equal(engine.card("flux-t2i@old")["transformer"], engine.card("flux-t2i")["transformer"])


OFFICIAL = dataclasses.replace(
    CONFIG,
    group=Group(4, adv_clip=5.0, global_std=True),
    weighting="adaptive",
    kl_beta=1e-2,
    schedule_levels=2,
    eval_ema=EvalEMA(0.9),
)


def test_the_official_form_trains_at_schedule_levels_with_a_kl_to_the_reference(t2i_card):
    """weighting="adaptive", kl_beta > 0, two levels of the sampling schedule per sample: the loss is the
    mean over each sample's two drawn levels of ``nft_adaptive_loss``; a constant reward moves nothing (the
    policy and KL gradients are exactly 0 at θ = θ_old = θ_ref); an update leaves the reference alone."""
    from jaxpipe.loops import denoise

    method = DiffusionNFT(t2i_card, brightness_reward, OFFICIAL)
    state = method.init()
    assert set(state.copies) == {"old", "reference", "ema"} and set(method.roles) == {"old", "ema"}
    ro = method.rollout(state, rl_batch(t2i_card), jax.random.key(0))
    key = jax.random.key(5)
    params = state.params["generator"]
    loss, metrics = jax.jit(method.loss)(params, state, ro, key)

    k_sigma, k_noise = jax.random.split(key)
    levels = denoise.schedule(method.sampling)[:-1]
    rows = ro.latents.shape[0]
    picks = jax.vmap(lambda k: jax.random.permutation(k, levels.shape[0])[:2])(jax.random.split(k_sigma, rows))
    dit = method.components(state.params, state.frozen)[method.transformer]
    cond = ro.cond
    by_hand = []
    for i, k in enumerate(jax.random.split(k_noise, 2)):
        sigma = levels[picks[:, i]]
        noise = jax.random.normal(k, ro.latents.shape)
        x_sigma = (1 - sigma[:, None, None, None, None]) * ro.latents + sigma[:, None, None, None, None] * noise
        v = dit(x_sigma, sigma, cond.context, cond.context_mask)
        by_hand.append(
            nft_adaptive_loss(
                v, v, x_sigma, ro.latents, sigma, ro.weights, beta=0.7, adv_clip=5.0, v_ref=v, kl_beta=1e-2
            )[0]
        )
    np.testing.assert_allclose(float(loss), float(np.mean(by_hand)), rtol=1e-5)
    assert float(metrics["kl"]) == 0.0

    constant = ro._replace(weights=jnp.full_like(ro.weights, 0.5))
    same, m = method.update(state, constant, key)
    assert float(m["grad_norm"]) == 0.0 and leaves_equal(same.params, state.params)

    new, m = method.update(state, ro, key)
    assert float(m["skipped"]) == 0.0 and not leaves_equal(new.params, state.params)
    assert leaves_equal(new.copies["reference"], state.copies["reference"])
    # the fused step keeps the evaluation average: d(0) = min(1/10, 0.9), so ema = ema0 + 0.9·(θ1 − ema0)
    stepped, _ = method.step(state, rl_batch(t2i_card), key)
    expected = jax.tree.map(lambda e, p: e + 0.9 * (p - e), state.copies["ema"], stepped.params["generator"])
    got = jax.tree.leaves(stepped.copies["ema"])
    assert all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(got, jax.tree.leaves(expected)))
    assert not leaves_equal(stepped.copies["ema"], stepped.params["generator"])
    assert leaves_equal(method.eval_card(stepped)["transformer"], method.role_card(stepped, "ema")["transformer"])
    # what a run judges and saves is the evaluation average, not the last weights
    assert leaves_equal(served_card(method, stepped)["transformer"], method.role_card(stepped, "ema")["transformer"])
    assert not leaves_equal(served_card(method, stepped)["transformer"], method.card(stepped)["transformer"])
    with pytest.raises(ValueError, match="weighting must be one of"):
        dataclasses.replace(OFFICIAL, weighting="x0")
    with pytest.raises(ValueError, match="decay must be in"):
        EvalEMA(1.0)
    with pytest.raises(ValueError, match="exceeds the sampling schedule"):
        dataclasses.replace(OFFICIAL, schedule_levels=4)
