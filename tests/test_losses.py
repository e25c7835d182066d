"""RL losses against independent NumPy formulas, plus their gradient identities."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpipe import samplers
from jaxpipe.training import losses

# Every call goes through jit (the losses must trace; eager op-by-op dispatch would also be slow).
L = SimpleNamespace(
    group_advantages=jax.jit(losses.group_advantages, static_argnames=("adv_clip", "eps", "global_std")),
    ppo_clip_loss=jax.jit(losses.ppo_clip_loss, static_argnames=("clip_eps",)),
    flow_grpo_kl=jax.jit(losses.flow_grpo_kl, static_argnames=("batch_ndim",)),
    flow_grpo_loss=jax.jit(losses.flow_grpo_loss, static_argnames=("clip_eps", "beta")),
    token_pg_loss=jax.jit(losses.token_pg_loss, static_argnames=("clip_eps",)),
    k3_kl=jax.jit(losses.k3_kl),
    token_loss=jax.jit(losses.token_loss, static_argnames=("clip_eps", "beta")),
)


def jgrad(f):
    return jax.jit(jax.grad(f))


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- NumPy references, written from the math
def np_group_adv(r, clip, eps=1e-4):
    r = np.asarray(r, np.float64)
    mean = r.mean(-1, keepdims=True)
    std = r.std(-1, keepdims=True)  # population std (ddof=0)
    return np.clip((r - mean) / (std + eps), -clip, clip)


def np_ppo(now, old, adv, eps):
    rho = np.exp(now - old)
    return np.maximum(-adv * rho, -adv * np.clip(rho, 1 - eps, 1 + eps))


def np_k3(now, ref):
    d = ref - now
    return np.exp(d) - d - 1


# ---------------------------------------------------------------- group advantages
def test_group_advantages_match_numpy_population_std():
    r = rng(1).normal(size=(4, 6)).astype(np.float32)
    got = L.group_advantages(r, adv_clip=5.0)
    np.testing.assert_allclose(got, np_group_adv(r, 5.0), rtol=1e-5, atol=1e-5)
    # population, not sample, std: with K = 2 the normalised values are exactly ±1 (not ±1/√2)
    two = L.group_advantages(np.array([[0.0, 2.0]], np.float32), adv_clip=5.0, eps=0.0)
    np.testing.assert_allclose(two, [[-1.0, 1.0]], atol=1e-6)


def test_group_advantages_zero_mean_constant_group_and_clip():
    r = rng(2).normal(size=(3, 8)).astype(np.float32)
    r[1] = 0.1  # a constant group: round-off in its mean must not leak
    a = np.asarray(L.group_advantages(r, adv_clip=10.0))
    np.testing.assert_allclose(a.mean(-1), 0.0, atol=1e-5)
    assert np.all(a[1] == 0.0)
    # clipping: one outlier in a group of 8 normalises to sqrt(7) ≈ 2.65 > 1.5
    out = np.zeros((1, 8), np.float32)
    out[0, 0] = 1.0
    clipped = np.asarray(L.group_advantages(out, adv_clip=1.5))
    assert clipped[0, 0] == pytest.approx(1.5) and np.all(np.abs(clipped) <= 1.5 + 1e-6)
    np.testing.assert_allclose(clipped, np_group_adv(out, 1.5), atol=1e-5)
    with pytest.raises(ValueError, match="K >= 2"):
        L.group_advantages(np.zeros((3, 1)), adv_clip=1.0)


def test_global_std_advantages_equal_the_official_per_prompt_tracker_and_zero_rows_filter_out():
    """``global_std``: the official PerPromptStatTracker(global_std=True) re-typed — the prompt's mean, the
    std of all the batch's rewards (+1e-4) — then the training loop's clamp at ±adv_clip_max (5); a
    constant group stays exactly 0, and FlowGRPO's zero-advantage filter (a mask) equals dropping those rows."""
    r = rng(5).normal(size=(4, 6)).astype(np.float64)
    r[0] *= 1e-3  # a group whose samples differ by a hair: a hair of advantage, not ±1
    r[2] = 0.25
    official = np.clip((r - r.mean(axis=1, keepdims=True)) / (np.std(r) + 1e-4), -5, 5)
    got = np.asarray(L.group_advantages(r.astype(np.float32), adv_clip=5.0, global_std=True))
    np.testing.assert_allclose(got, official, rtol=1e-5, atol=1e-6)
    assert np.all(got[2] == 0.0) and np.abs(got[0]).max() < 0.01
    assert np.abs(np.asarray(L.group_advantages(r.astype(np.float32), adv_clip=5.0))[0]).max() > 0.5

    adv = got.reshape(-1)
    s, b = 3, adv.shape[0]
    now = rng(6).normal(size=(s, b)) * 0.01
    old = now + rng(7).normal(size=(s, b)) * 0.3
    keep = adv != 0
    loss, _ = L.flow_grpo_loss(now, old, adv, clip_eps=0.2, mask=np.broadcast_to(keep[None], (s, b)))
    ratio = np.exp(now - old)[:, keep]
    a = adv[keep][None]
    dropped = np.mean(np.maximum(-a * ratio, -a * np.clip(ratio, 1 - 0.2, 1 + 0.2)))
    assert abs(dropped) > 0.01
    np.testing.assert_allclose(float(loss), dropped, rtol=1e-5)


def test_group_advantages_with_group_ids_equal_rows():
    r = rng(3).normal(size=(3, 5)).astype(np.float32)
    r[2] = 7.0
    perm = rng(4).permutation(15)
    ids = np.repeat(np.array([5, 0, 9]), 5)[perm]  # arbitrary, shuffled group ids
    got = np.asarray(jax.jit(lambda x, g: L.group_advantages(x, g, adv_clip=3.0))(r.reshape(-1)[perm], ids))
    want = np.asarray(L.group_advantages(r, adv_clip=3.0)).reshape(-1)[perm]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.all(got[ids == 9] == 0.0)
    # vmap over prompts of the 1-D (one group) form equals the (P, K) form
    want_pk = L.group_advantages(r, adv_clip=3.0)
    assert want_pk.shape == (3, 5)
    np.testing.assert_allclose(jax.vmap(lambda x: losses.group_advantages(x, adv_clip=3.0))(r), want_pk, atol=1e-6)
    g = jgrad(lambda x: L.group_advantages(x, adv_clip=3.0).sum())(jnp.asarray(r))
    assert np.all(np.isfinite(g))


# ---------------------------------------------------------------- PPO
def test_ppo_matches_numpy_and_metrics():
    g = rng(5)
    now, old = g.normal(size=(2, 3, 7)).astype(np.float32) * 0.3
    adv = g.normal(size=(7,)).astype(np.float32)
    loss, m = jax.jit(lambda a, b, c: L.ppo_clip_loss(a, b, c, clip_eps=0.2))(now, old, adv)
    np.testing.assert_allclose(loss, np_ppo(now, old, adv, 0.2), rtol=1e-5, atol=1e-6)
    rho = np.exp(now - old)
    assert float(m["clip_frac"]) == pytest.approx(np.mean(np.abs(rho - 1) > 0.2))
    assert float(m["approx_kl"]) == pytest.approx(np.mean(rho - 1 - np.log(rho)), rel=1e-4)
    assert float(m["approx_kl"]) >= 0.0


def test_ppo_ratio_one_gives_minus_advantage_and_its_gradient():
    lp = jnp.asarray(rng(6).normal(size=(4,)), jnp.float32)
    adv = jnp.array([1.5, -0.5, 0.0, 2.0])
    f = lambda now: L.ppo_clip_loss(now, lp, adv, clip_eps=0.2)[0].sum()
    loss, _ = L.ppo_clip_loss(lp, lp, adv, clip_eps=0.2)
    np.testing.assert_allclose(loss, -adv, atol=1e-6)
    grad = jgrad(f)(lp)
    np.testing.assert_allclose(grad, -adv, atol=1e-6)
    assert np.all(grad[np.asarray(adv) != 0] != 0)


def test_ppo_clipping_kills_gradient_only_in_the_favoured_direction():
    eps = 0.2
    old = jnp.zeros(4)
    big, small = jnp.log(1.5), jnp.log(0.5)  # outside the trust region on either side
    now = jnp.array([big, small, big, small])
    adv = jnp.array([1.0, 1.0, -1.0, -1.0])
    grad = jgrad(lambda n: L.ppo_clip_loss(n, old, adv, clip_eps=eps)[0].sum())(now)
    # A > 0: a ratio already above 1+ε gets no more push; one below 1-ε still gets pushed up
    assert grad[0] == 0.0 and grad[1] == pytest.approx(-0.5)
    # A < 0: a ratio above 1+ε is still pushed down; one below 1-ε gets no more push
    assert grad[2] == pytest.approx(1.5) and grad[3] == 0.0


# ---------------------------------------------------------------- FlowGRPO
def test_flow_grpo_kl_matches_numpy_vanishes_and_pulls_toward_reference():
    g = rng(7)
    now, ref = g.normal(size=(2, 2, 3, 4, 2, 2)).astype(np.float32)
    std = np.abs(g.normal(size=(2, 3))).astype(np.float32) + 0.1
    got = L.flow_grpo_kl(now, ref, std, batch_ndim=2)
    want = ((now - ref) ** 2).reshape(2, 3, -1).mean(-1) / (2 * std**2)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # (B,) std, and sde_step's (B, 1, ...) std, give the same per-example KL
    a = L.flow_grpo_kl(now[0], ref[0], std[0])
    b = L.flow_grpo_kl(now[0], ref[0], std[0].reshape(3, 1, 1, 1))
    np.testing.assert_allclose(a, want[0], rtol=1e-5)
    np.testing.assert_allclose(b, want[0], rtol=1e-5)
    assert np.all(np.asarray(L.flow_grpo_kl(ref, ref, std, batch_ndim=2)) == 0.0)
    grad = jgrad(lambda m: L.flow_grpo_kl(m, ref, std, batch_ndim=2).sum())(jnp.asarray(now))
    step = now - 1e-2 * np.asarray(grad)  # descending moves mean_now toward mean_ref
    assert np.all(np.abs(step - ref) <= np.abs(now - ref) + 1e-7)
    np.testing.assert_allclose(grad, (now - ref) / (std[..., None, None, None] ** 2 * 16), rtol=1e-4)


def test_kl_conventions_official_flowgrpo_equals_exact_times_dt():
    """FlowGRPO's code divides by 2·std_dev_t² (its noise scale before ·sqrt(-Δt)); the exact Gaussian KL
    divides by 2σ_eff² = 2·std_dev_t²·|Δt|. Checked per step on real SDE steps of a shifted schedule."""
    g = rng(12)
    sigmas = np.asarray(samplers.flow_sigmas(10, shift=3.0), np.float64)
    S, B, eta = 10, 3, 0.7
    sig = np.repeat(sigmas[:-1, None], B, axis=1)
    sig_next = np.repeat(sigmas[1:, None], B, axis=1)
    x, v = g.normal(size=(2, S, B, 1, 4, 4, 2)).astype(np.float32)
    steps = jax.vmap(lambda *a: samplers.sde_step(*a, noise_level=eta))(
        x, v, sig.astype(np.float32), sig_next.astype(np.float32), x
    )
    mu, mu_ref = np.asarray(steps.mean), np.asarray(steps.mean) + 0.1 * g.normal(size=x.shape).astype(np.float32)
    sigma_eff = np.asarray(steps.std).reshape(S, B)
    dt = (sig_next - sig).astype(np.float32)
    fn = jax.jit(losses.flow_grpo_kl, static_argnames=("batch_ndim", "convention"))
    exact = fn(mu, mu_ref, sigma_eff, batch_ndim=2)
    official = fn(mu, mu_ref, sigma_eff, batch_ndim=2, convention="flowgrpo", dt=dt)
    np.testing.assert_allclose(official, np.asarray(exact) * np.abs(dt), rtol=1e-5)
    # the official formula, from its own std_dev_t = sqrt(σ / (1 - σ_d)) · η (σ_d = σ_next where σ = 1)
    sigma_d = np.where(sig >= 1.0, sig_next, sig)
    std_dev_t = np.sqrt(sig / (1.0 - sigma_d)) * eta
    want = ((mu - mu_ref) ** 2).reshape(S, B, -1).mean(-1) / (2.0 * std_dev_t**2)
    np.testing.assert_allclose(official, want, rtol=1e-4)
    # through the loss: the kl metric follows the convention; a flowgrpo β of b equals an exact β of b·|Δt|
    now = old = np.zeros((S, B), np.float32)
    adv = np.zeros(B, np.float32)
    _, m_exact = losses.flow_grpo_loss(now, old, adv, mu, mu_ref, sigma_eff, clip_eps=0.2, beta=0.04)
    _, m_flow = losses.flow_grpo_loss(
        now, old, adv, mu, mu_ref, sigma_eff, clip_eps=0.2, beta=0.04, kl="flowgrpo", dt=dt
    )
    assert float(m_flow["kl"]) == pytest.approx(float(np.mean(np.asarray(exact) * np.abs(dt))), rel=1e-5)
    assert float(m_exact["kl"]) == pytest.approx(float(np.mean(exact)), rel=1e-5)
    with pytest.raises(ValueError, match="needs dt"):
        losses.flow_grpo_kl(mu, mu_ref, sigma_eff, batch_ndim=2, convention="flowgrpo")
    with pytest.raises(ValueError, match="convention"):
        losses.flow_grpo_kl(mu, mu_ref, sigma_eff, batch_ndim=2, convention="approx")
    from jaxpipe.training import FlowGRPOConfig

    assert FlowGRPOConfig().kl == "exact"
    with pytest.raises(ValueError, match="kl must be one of"):
        FlowGRPOConfig(kl="official")


def test_flow_grpo_loss_matches_numpy_and_masks():
    g = rng(8)
    S, B = 3, 4
    now, old = (g.normal(size=(2, S, B)) * 0.3).astype(np.float32)
    adv = g.normal(size=(B,)).astype(np.float32)
    mu, mu_ref = g.normal(size=(2, S, B, 5)).astype(np.float32)
    std = (np.abs(g.normal(size=(S, B))) + 0.2).astype(np.float32)
    beta, eps = 0.04, 0.2
    fn = jax.jit(lambda *a: L.flow_grpo_loss(*a, clip_eps=eps, beta=beta))
    loss, m = fn(now, old, adv, mu, mu_ref, std)
    kl = ((mu - mu_ref) ** 2).mean(-1) / (2 * std**2)
    per = np_ppo(now, old, adv[None], eps) + beta * kl
    assert float(loss) == pytest.approx(per.mean(), rel=1e-5)
    assert float(m["kl"]) == pytest.approx(kl.mean(), rel=1e-5)
    assert set(m) >= {"loss", "policy_loss", "kl", "clip_frac", "approx_kl", "ratio_mean"}
    # a mask drops steps (even ones with std == 0 and junk log-probs) from the mean
    mask = np.ones((S, B), bool)
    mask[2] = False
    std_bad, now_bad = std.copy(), now.copy()
    std_bad[2], now_bad[2] = 0.0, np.nan
    masked, _ = L.flow_grpo_loss(now_bad, old, adv, mu, mu_ref, std_bad, clip_eps=eps, beta=beta, mask=mask)
    assert float(masked) == pytest.approx(per[:2].mean(), rel=1e-5)
    # beta == 0 needs no means
    no_kl, _ = L.flow_grpo_loss(now, old, adv, clip_eps=eps)
    assert float(no_kl) == pytest.approx(np_ppo(now, old, adv[None], eps).mean(), rel=1e-5)
    with pytest.raises(ValueError, match="beta"):
        L.flow_grpo_loss(now, old, adv, clip_eps=eps, beta=0.1)


def test_flow_grpo_zero_advantage_zero_policy_loss_and_gradient():
    g = rng(9)
    now, old = (g.normal(size=(2, 2, 3)) * 0.3).astype(np.float32)
    grad = jgrad(lambda n: L.flow_grpo_loss(n, old, jnp.zeros(3), clip_eps=0.2)[0])(jnp.asarray(now))
    assert float(L.flow_grpo_loss(now, old, jnp.zeros(3), clip_eps=0.2)[0]) == 0.0
    assert np.all(np.asarray(grad) == 0.0)


def _sde_case(seed, S=2, B=3, shape=(1, 4, 4, 2)):
    """S SDE steps of B examples: inputs x, rollout velocities v0, realized samples, rollout log-probs."""
    g = rng(seed)
    sigmas = samplers.flow_sigmas(4, shift=3.0)
    sig = jnp.stack([jnp.full((B,), sigmas[i]) for i in range(S)])
    sig_next = jnp.stack([jnp.full((B,), sigmas[i + 1]) for i in range(S)])
    x = jnp.asarray(g.normal(size=(S, B) + shape), jnp.float32)
    v0 = jnp.asarray(g.normal(size=(S, B) + shape), jnp.float32)
    noise = jnp.asarray(g.normal(size=(S, B) + shape), jnp.float32)
    steps = jax.vmap(samplers.sde_step)(x, v0, sig, sig_next, noise)
    return x, v0, sig, sig_next, steps


def test_flow_grpo_gradient_moves_velocity_toward_ml_velocity():
    """At ρ == 1, descending the FlowGRPO loss moves each example's v toward its realized sample's
    ML velocity when A > 0, away from it when A < 0, and not at all when A == 0."""
    x, v0, sig, sig_next, steps = _sde_case(10)
    adv = jnp.array([0.7, -1.3, 0.0])  # one example per case; examples do not interact
    mean_ref = steps.mean  # reference == rollout weights, so the KL term sits at its minimum

    def loss(v, beta):
        logp = jax.vmap(samplers.sde_log_prob)(x, v, sig, sig_next, steps.sample)
        mean = jax.vmap(lambda *a: samplers.sde_step(*a).mean)(x, v, sig, sig_next, jnp.zeros_like(x))
        std = steps.std.reshape(2, 3)
        return losses.flow_grpo_loss(logp, steps.log_prob, adv, mean, mean_ref, std, clip_eps=0.2, beta=beta)

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    v_ml = jax.vmap(samplers.ml_velocity)(x, steps.sample, sig, sig_next)
    toward = np.asarray(v_ml - v0).reshape(2, 3, -1)  # (S, B, D): the identity holds per step
    for beta in (0.0, 0.04):
        (_, metrics), grad = step(v0, beta)
        assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
        assert float(metrics["kl"]) < 1e-10
        descent = -np.asarray(grad).reshape(2, 3, -1)
        cos = (descent * toward).sum(-1) / (np.linalg.norm(descent, axis=-1) * np.linalg.norm(toward, axis=-1) + 1e-30)
        assert np.all(cos[:, 0] > 0.999) and np.all(cos[:, 1] < -0.999), cos
        scale = np.abs(descent[:, :2]).max()
        if beta == 0.0:
            assert np.all(descent[:, 2] == 0.0)
        else:  # the KL gradient at mean_now == mean_ref is round-off only
            assert np.abs(descent[:, 2]).max() < 1e-6 * scale


# ---------------------------------------------------------------- token policy gradient
def test_token_pg_matches_numpy_and_masks_padding():
    g = rng(11)
    B, T = 4, 6
    logp = -np.abs(g.normal(size=(B, T))).astype(np.float32)
    lengths = np.array([6, 3, 1, 0])
    mask = np.arange(T)[None] < lengths[:, None]
    adv = g.normal(size=(B,)).astype(np.float32)
    padded = np.where(mask, logp, -np.inf).astype(np.float32)  # junk in the padding must not matter
    loss, m = jax.jit(lambda *a: L.token_pg_loss(*a))(padded, mask, adv)
    per_seq = [-adv[b] * logp[b, : lengths[b]].sum() / lengths[b] for b in range(3)]  # row 3 has no tokens
    assert float(loss) == pytest.approx(np.mean(per_seq), rel=1e-5)
    grad = jgrad(lambda x: L.token_pg_loss(x, mask, adv)[0])(jnp.asarray(padded))
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0.0)
    np.testing.assert_allclose(np.asarray(grad)[0], -adv[0] / 6 / 3, rtol=1e-5)
    assert float(m["num_tokens"]) == pytest.approx(10 / 3)


def test_token_pg_length_normalised():
    adv = jnp.array([1.0, 1.0])
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], bool)
    lp = np.full((2, 6), -0.7, np.float32)
    both, _ = L.token_pg_loss(lp, mask, adv)
    long_only, _ = L.token_pg_loss(lp[:1], mask[:1], adv[:1])
    short_only, _ = L.token_pg_loss(lp[1:], mask[1:], adv[1:])
    assert float(long_only) == pytest.approx(float(short_only)) and float(both) == pytest.approx(-0.7 * -1.0)


def test_token_pg_ppo_form_and_zero_advantage():
    g = rng(12)
    B, T = 3, 5
    now, old = (g.normal(size=(2, B, T)) * 0.3 - 1.0).astype(np.float32)
    mask = np.arange(T)[None] < np.array([5, 2, 4])[:, None]
    adv = g.normal(size=(B,)).astype(np.float32)
    loss, m = L.token_pg_loss(now, mask, adv, old_log_probs=old, clip_eps=0.2)
    ref = np_ppo(now, old, adv[:, None], 0.2)
    want = np.mean([(ref[b] * mask[b]).sum() / mask[b].sum() for b in range(B)])
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert "clip_frac" in m and 0.0 <= float(m["clip_frac"]) <= 1.0
    # at ρ == 1 the PPO form has the plain form's gradient
    plain = jgrad(lambda x: L.token_pg_loss(x, mask, adv)[0])(jnp.asarray(now))
    ppo = jgrad(lambda x: L.token_pg_loss(x, mask, adv, old_log_probs=now, clip_eps=0.2)[0])(jnp.asarray(now))
    np.testing.assert_allclose(ppo, plain, rtol=1e-5, atol=1e-7)
    for kw in ({}, {"old_log_probs": old, "clip_eps": 0.2}):
        f = lambda x, kw=kw: L.token_pg_loss(x, mask, jnp.zeros(B), **kw)[0]
        assert float(f(now)) == 0.0 and np.all(np.asarray(jgrad(f)(jnp.asarray(now))) == 0.0)
    with pytest.raises(ValueError, match="clip_eps"):
        L.token_pg_loss(now, mask, adv, old_log_probs=old)


def test_k3_kl_matches_numpy_nonnegative_and_zero_when_equal():
    g = rng(13)
    now, ref = (g.normal(size=(2, 3, 7)) - 2.0).astype(np.float32)
    mask = g.random((3, 7)) < 0.7
    got = float(jax.jit(L.k3_kl)(now, ref, mask))
    assert got == pytest.approx(np_k3(now, ref)[mask].mean(), rel=1e-5)
    assert got >= 0.0
    per_token_min = min(float(L.k3_kl(now[:, i : i + 1], ref[:, i : i + 1], np.ones((3, 1), bool))) for i in range(7))
    assert per_token_min >= 0.0
    assert float(L.k3_kl(now, now, mask)) == 0.0
    grad = jgrad(lambda x: L.k3_kl(x, now, mask))(jnp.asarray(now))
    assert np.all(np.asarray(grad) == 0.0)
    junk = np.where(mask, now, np.nan).astype(np.float32)
    assert float(L.k3_kl(junk, ref, mask)) == pytest.approx(got, rel=1e-6)


def test_token_loss_combines_pg_and_k3():
    g = rng(14)
    B, T = 3, 4
    now, old, ref = (g.normal(size=(3, B, T)) * 0.3 - 1.0).astype(np.float32)
    mask = np.arange(T)[None] < np.array([4, 1, 3])[:, None]
    adv = g.normal(size=(B,)).astype(np.float32)
    fn = jax.jit(lambda *a: L.token_loss(*a, ref_log_probs=ref, beta=0.1, old_log_probs=old, clip_eps=0.2))
    loss, m = fn(now, mask, adv)
    pg, _ = L.token_pg_loss(now, mask, adv, old_log_probs=old, clip_eps=0.2)
    assert float(loss) == pytest.approx(float(pg) + 0.1 * float(L.k3_kl(now, ref, mask)), rel=1e-6)
    assert float(m["loss"]) == float(loss) and float(m["kl"]) > 0.0
    g_now = jgrad(lambda x: fn(x, mask, adv)[0])(jnp.asarray(now))
    assert np.all(np.isfinite(g_now)) and np.all(np.asarray(g_now)[~mask] == 0.0)
    assert float(L.token_loss(now, mask, adv)[0]) == pytest.approx(float(L.token_pg_loss(now, mask, adv)[0]))
    with pytest.raises(ValueError, match="ref_log_probs"):
        L.token_loss(now, mask, adv, beta=0.1)
