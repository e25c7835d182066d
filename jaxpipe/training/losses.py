"""Pure RL losses: group advantages, FlowGRPO PPO + KL, token PG + k3 KL.

Every function here is pure jax, computes in float32, and is safe under ``jit``, ``vmap`` and
``grad``. Quantities that are constants of an update are wrapped in ``stop_gradient`` inside the
losses: the advantages, the rollout ("old") log-probs, the reference means / log-probs and the
SDE ``std``; gradients flow only through the current policy's log-probs and means.

Losses return ``(scalar loss, metrics)`` where ``metrics`` is a dict of float32 scalars.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "group_advantages",
    "ppo_clip_loss",
    "flow_grpo_kl",
    "flow_grpo_loss",
    "token_pg_loss",
    "k3_kl",
    "token_loss",
]

_sg = jax.lax.stop_gradient


def _concrete(value):
    """The Python float of ``value`` if it is concrete, else ``None`` (it is being traced)."""
    try:
        return float(value)
    except (TypeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _check_positive(name: str, value) -> None:
    v = _concrete(value) if jnp.ndim(value) == 0 else None
    if v is not None and not v > 0.0:
        raise ValueError(f"{name} must be > 0 (got {v})")


def _f32(x) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def _safe_sqrt(x: jax.Array) -> jax.Array:
    """``sqrt(x)`` with a finite (zero) gradient at ``x == 0``."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def _masked_mean(values: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Mean of ``values`` over the entries where ``mask`` is true (0 if none); plain mean without a mask."""
    if mask is None:
        return jnp.mean(values)
    mask = jnp.broadcast_to(mask, values.shape)
    total = jnp.sum(jnp.where(mask, values, 0.0))
    return total / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)


# ------------------------------------------------------------------------------ advantages
def group_advantages(rewards, group_ids=None, *, adv_clip, eps: float = 1e-4, global_std: bool = False) -> jax.Array:
    """Per-prompt-group normalised advantages ``clip((r - mean_g) / (std_g + eps), ±adv_clip)``.

    ``std_g`` is the **population** standard deviation (``ddof=0``, divide by the group size),
    as in FlowGRPO; with ``global_std`` it is the population std of ALL the rewards instead (the
    official FlowGRPO / DiffusionNFT ``sample.global_std = True``: a group whose samples differ by a
    hair gets advantages of a hair, not of ±1). The values are shifted by the group maximum before the mean is taken, so a
    constant group gives exactly 0 (no float round-off). Advantages are constants of an update;
    they are differentiable here (finite gradients even for constant groups) but the losses below
    stop their gradient anyway.

    Args:
      rewards: ``(P, K)``: each row is one prompt's group of K >= 2 samples; or ``(B,)``, grouped by
        ``group_ids``, or one group without them (so ``jax.vmap`` over the rows of a ``(P, K)``
        array equals the ``(P, K)`` call).
      group_ids: ``(B,)`` integer ids for ``(B,)`` rewards: samples sharing an id form a group (ids
        need not be contiguous or sorted).
      adv_clip: the clip bound, > 0 (``None``: no clipping). Keyword-only and required.
      eps: added to ``std_g`` so a constant group does not divide by 0.
      global_std: divide by the std of all the rewards, not each group's.

    Returns:
      float32 advantages shaped like ``rewards``.

    Raises:
      ValueError: if ``rewards`` is ``(P, K)`` with ``K < 2`` or of another rank, if ``group_ids`` and
        ``rewards`` are not both ``(B,)``, or if a concrete ``adv_clip`` is not > 0.
    """
    r = _f32(rewards)
    if adv_clip is not None:
        _check_positive("adv_clip", adv_clip)
    if group_ids is None:
        if r.ndim == 2:
            if r.shape[1] < 2:
                raise ValueError(f"group advantages need K >= 2 samples per prompt (rewards shape {r.shape})")
            axis = -1
        elif r.ndim == 1:
            axis = -1
        else:
            raise ValueError(f"rewards must be (P, K), or (B,) with optional group_ids; got shape {r.shape}")
        d = r - jnp.max(r, axis=axis, keepdims=True)
        dev = d - jnp.mean(d, axis=axis, keepdims=True)
        std = _safe_sqrt(jnp.mean(dev**2, axis=axis, keepdims=True))
    else:
        ids = jnp.asarray(group_ids)
        if r.ndim != 1 or ids.shape != r.shape:
            raise ValueError(f"with group_ids, rewards and group_ids must both be (B,); got {r.shape} and {ids.shape}")
        same = ids[:, None] == ids[None, :]  # (B, B): row i marks the members of i's group
        count = jnp.sum(same, axis=1).astype(jnp.float32)
        shift = jnp.max(jnp.where(same, r[None, :], -jnp.inf), axis=1)
        d_all = jnp.where(same, r[None, :] - shift[:, None], 0.0)  # group members, shifted
        mean = jnp.sum(d_all, axis=1) / count
        dev_all = jnp.where(same, d_all - mean[:, None], 0.0)
        std = _safe_sqrt(jnp.sum(dev_all**2, axis=1) / count)
        dev = (r - shift) - mean
    if global_std:
        flat = r.reshape(-1) - jnp.max(r)
        std = _safe_sqrt(jnp.mean((flat - jnp.mean(flat)) ** 2))
    adv = dev / (std + eps)
    if adv_clip is not None:
        adv = jnp.clip(adv, -adv_clip, adv_clip)
    return adv


# ------------------------------------------------------------------------------ PPO
def ppo_clip_loss(log_prob_now, log_prob_old, advantages, *, clip_eps, mask=None) -> tuple[jax.Array, dict]:
    """The element-wise clipped PPO surrogate ``max(-A·ρ, -A·clip(ρ, 1-ε, 1+ε))`` with ``ρ = exp(logp_now - logp_old)``.

    Computed element-wise over the broadcast shape of the three inputs (NumPy broadcasting: a ``(B,)``
    advantage broadcasts over ``(S, B)`` log-probs). At ``ρ == 1`` the loss is ``-A`` and its
    gradient w.r.t. ``logp_now`` is ``-A``. Outside the trust region the gradient vanishes only
    where the ratio has already moved in the direction the advantage favours (``ρ > 1+ε`` for
    ``A > 0``, ``ρ < 1-ε`` for ``A < 0``). ``logp_old`` and ``A`` are stop-gradient constants.

    Args:
      log_prob_now: log-probs under the current weights (differentiable).
      log_prob_old: the rollout's log-probs, broadcastable against ``log_prob_now``.
      advantages: the advantages ``A``, broadcastable against both.
      clip_eps: the clip ε, > 0.
      mask: bool, broadcastable to the loss: the elements that count. Elsewhere the log-ratio is set
        to 0 (padding may hold -inf/nan log-probs), so there ``ρ == 1`` and the loss is ``-A``;
        reduce with the same mask.

    Returns:
      ``(loss, metrics)``: ``loss`` float32 of the broadcast shape (not reduced); ``metrics`` scalars,
      means over the elements (over ``mask`` where given): ``clip_frac``, the fraction with
      ``|ρ - 1| > ε``; ``approx_kl``, ``(ρ - 1) - log ρ`` (the k3 estimator of KL(old ‖ now), ≥ 0);
      ``ratio_mean``.

    Raises:
      ValueError: if a concrete ``clip_eps`` is not > 0.
    """
    _check_positive("clip_eps", clip_eps)
    now = _f32(log_prob_now)
    old = _sg(_f32(log_prob_old))
    adv = _sg(_f32(advantages))
    shape = jnp.broadcast_shapes(now.shape, old.shape, adv.shape)
    log_ratio = now - old
    if mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(mask, bool), shape)
        log_ratio = jnp.where(mask, log_ratio, 0.0)  # padding may hold -inf/nan log-probs
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = jnp.broadcast_to(jnp.where(unclipped >= clipped, unclipped, clipped), shape)
    ratio_b = jnp.broadcast_to(ratio, shape)
    log_ratio_b = jnp.broadcast_to(log_ratio, shape)
    metrics = {
        "clip_frac": _masked_mean((jnp.abs(ratio_b - 1.0) > clip_eps).astype(jnp.float32), mask),
        "approx_kl": _masked_mean(_sg((ratio_b - 1.0) - log_ratio_b), mask),
        "ratio_mean": _masked_mean(_sg(ratio_b), mask),
    }
    return loss, metrics


# ------------------------------------------------------------------------------ FlowGRPO
def flow_grpo_kl(mean_now, mean_ref, std, *, batch_ndim: int = 1, convention: str = "exact", dt=None) -> jax.Array:
    """FlowGRPO's KL to the reference policy, per example: ``mean((μ_now - μ_ref)²) / (2σ_eff²)``.

    The SDE step is Gaussian with the same ``σ_eff`` under both policies, so this is the exact
    KL(π_now ‖ π_ref) per element, averaged over the ``D`` event elements (``convention="exact"``).
    ``convention="flowgrpo"`` is the official FlowGRPO code's value, ``mean((Δμ)²) / (2·std_dev_t²)``
    with ``std_dev_t = σ_eff / sqrt(|Δt|)`` (its noise scale before the ``sqrt(-Δt)``): the exact KL
    times ``|Δt|``. ``mean_ref`` and ``std`` are stop-gradient constants; the gradient w.r.t.
    ``mean_now`` is ``(μ_now - μ_ref) / (σ_eff²·D)``, pulling ``μ_now`` toward ``μ_ref``.

    Args:
      mean_now: the SDE means under the current weights, ``(*lead, ...)`` where ``lead`` is the first
        ``batch_ndim`` axes.
      mean_ref: the reference's means, shaped like ``mean_now``.
      std: ``σ_eff > 0``: a scalar, an array of the leading shape (e.g. the captured ``(S, B)``), or
        anything broadcastable against the full means (e.g. ``sde_step``'s ``(B, 1, ..., 1)``).
      batch_ndim: how many leading axes are kept (1: ``(B, ...)``; 2 for a captured ``(S, B, ...)``
        trajectory).
      convention: ``"exact"`` or ``"flowgrpo"``.
      dt: the steps' ``sigma_next - sigma``, of the leading shape; needed by ``"flowgrpo"``.

    Returns:
      ``(*lead,)`` float32 KLs.

    Raises:
      ValueError: if the means differ in shape, ``batch_ndim`` exceeds their rank, ``convention`` is
        unknown, or ``"flowgrpo"`` lacks ``dt``.
    """
    now = _f32(mean_now)
    ref = _sg(_f32(mean_ref))
    if now.shape != ref.shape:
        raise ValueError(f"mean_now {now.shape} and mean_ref {ref.shape} must have the same shape")
    if not 0 <= batch_ndim <= now.ndim:
        raise ValueError(f"batch_ndim={batch_ndim} out of range for means of shape {now.shape}")
    s = _sg(_f32(std))
    if 0 < s.ndim <= batch_ndim:
        s = s.reshape(s.shape + (1,) * (now.ndim - batch_ndim))  # leading-shape std -> broadcast over events
    if convention not in ("exact", "flowgrpo"):
        raise ValueError(f"convention must be 'exact' or 'flowgrpo' (got {convention!r})")
    per_element = (now - ref) ** 2 / (2.0 * s**2)
    per_element = jnp.broadcast_to(per_element, jnp.broadcast_shapes(per_element.shape, now.shape))
    lead = now.shape[:batch_ndim]
    exact = jnp.mean(per_element.reshape(lead + (-1,)), axis=-1)
    if convention == "exact":
        return exact
    if dt is None:
        raise ValueError("the flowgrpo KL convention needs dt (each step's sigma_next - sigma)")
    return exact * jnp.abs(_sg(_f32(dt)))


def flow_grpo_loss(
    log_prob_now,
    log_prob_old,
    advantages,
    mean_now=None,
    mean_ref=None,
    std=None,
    *,
    clip_eps,
    beta=0.0,
    mask=None,
    kl: str = "exact",
    dt=None,
) -> tuple[jax.Array, dict]:
    """The FlowGRPO loss over a captured trajectory of ``S`` steps and ``B`` samples.

    Per element ``(s, b)``, with ``ρ = exp(logp_now - logp_old)``:

        ℓ = max(-A·ρ, -A·clip(ρ, 1-ε, 1+ε)) + β · mean((μ_now - μ_ref)²) / (2σ_eff²)

    and ``loss = mean_{s,b} ℓ`` (over ``mask`` where given). ``kl="flowgrpo"`` uses the official
    FlowGRPO code's KL instead (``flow_grpo_kl``: the exact KL times ``|Δt|``).

    Args:
      log_prob_now: ``(S, B)`` log-probs recomputed under the current weights
        (``denoise.trajectory_log_probs``).
      log_prob_old: ``(S, B)`` log-probs captured at rollout (``Transition.log_prob``).
      advantages: ``(B,)``, broadcast over the steps (or ``(S, B)``).
      mean_now: ``(S, B, ...)`` SDE means under the current weights (may be omitted when ``beta == 0``).
      mean_ref: ``(S, B, ...)`` SDE means under the reference weights (likewise).
      std: the captured ``σ_eff``, ``(S, B)`` or as ``flow_grpo_kl`` takes it (likewise); masked steps may
        carry 0.
      clip_eps: the PPO clip ε, > 0.
      beta: the KL weight β.
      mask: ``(S, B)`` bool, the steps that count (e.g. to drop finished requests).
      kl: the KL convention, ``"exact"`` or ``"flowgrpo"``.
      dt: ``(S, B)`` the steps' ``sigma_next - sigma``, needed by ``kl="flowgrpo"``.

    Returns:
      ``(loss, metrics)``: the float32 scalar loss and scalar metrics ``loss``, ``policy_loss``,
      ``kl`` (unweighted), ``clip_frac``, ``approx_kl``, ``ratio_mean``.

    Raises:
      ValueError: if ``log_prob_now`` is not ``(S, B)``, the other inputs broadcast the loss to another
        shape, ``beta`` is not a concrete 0 and a mean or ``std`` is missing, or as ``flow_grpo_kl``
        and ``ppo_clip_loss``.
    """
    now = _f32(log_prob_now)
    if now.ndim != 2:
        raise ValueError(f"log_prob_now must be (S, B); got shape {now.shape}")
    if mask is not None:
        mask = jnp.broadcast_to(jnp.asarray(mask, bool), now.shape)
    policy, metrics = ppo_clip_loss(now, log_prob_old, advantages, clip_eps=clip_eps, mask=mask)
    if policy.shape != now.shape:
        raise ValueError(f"log_prob_old/advantages broadcast the loss to {policy.shape}, expected {now.shape}")
    policy_loss = _masked_mean(policy, mask)
    beta_value = _concrete(beta) if jnp.ndim(beta) == 0 else None
    if mean_now is None or mean_ref is None or std is None:
        if beta_value == 0.0:
            kl = jnp.zeros((), jnp.float32)
            total = policy_loss
        else:
            raise ValueError("flow_grpo_loss with beta != 0 needs mean_now, mean_ref and std")
    else:
        s = _f32(std)
        if mask is not None and 0 < s.ndim <= 2:  # masked steps may carry std == 0 (ODE / finished)
            s = jnp.where(jnp.broadcast_to(mask, jnp.broadcast_shapes(s.shape, mask.shape)), s, 1.0)
        per_step = flow_grpo_kl(mean_now, mean_ref, s, batch_ndim=2, convention=kl, dt=dt)
        kl = _masked_mean(per_step, mask)
        total = policy_loss + _f32(beta) * kl
    metrics = {"loss": total, "policy_loss": policy_loss, "kl": kl, **metrics}
    return total, metrics


# ------------------------------------------------------------------------------ token policy
def _token_inputs(token_log_probs, mask):
    logp = _f32(token_log_probs)
    if logp.ndim != 2:
        raise ValueError(f"token log-probs must be (B, T); got shape {logp.shape}")
    m = jnp.asarray(mask)
    if m.shape != logp.shape:
        raise ValueError(f"mask must have the shape of the token log-probs {logp.shape}; got {m.shape}")
    m = m.astype(bool)
    return jnp.where(m, logp, 0.0), m


def token_pg_loss(token_log_probs, mask, advantages, *, old_log_probs=None, clip_eps=None) -> tuple[jax.Array, dict]:
    """The length-normalised token policy gradient.

    Per sequence with ``n_b = Σ_t m_bt`` valid tokens:

        L_b = -A_b · Σ_t m_bt · log π_bt / n_b

    or, with ``old_log_probs`` and ``clip_eps``, the PPO form per token
    ``L_b = Σ_t m_bt · max(-A_b·ρ_bt, -A_b·clip(ρ_bt, 1-ε, 1+ε)) / n_b``,
    ``ρ_bt = exp(logp_now - logp_old)`` (same gradient as the plain form at ρ == 1).
    ``loss`` = mean of ``L_b`` over the sequences with ``n_b > 0``. Masked entries may hold any
    value (even -inf/nan) without affecting the loss or its gradient.

    Args:
      token_log_probs: ``(B, T)`` ``log π(y_t | prompt, y_<t)`` under the current weights.
      mask: ``(B, T)`` true on the generated tokens that count (padding / EOS tail false; a row of
        all-false, e.g. a sample that kept its original prompt, is left out).
      advantages: ``(B,)`` per-sequence advantages (stop-gradient).
      old_log_probs: ``(B, T)`` the rollout's token log-probs, for the PPO form (with ``clip_eps``).
      clip_eps: the per-token clip ε, > 0 (with ``old_log_probs``).

    Returns:
      ``(loss, metrics)``: the float32 scalar loss and scalar metrics ``pg_loss``, ``num_tokens``
      (mean valid tokens per counted sequence) and, in the PPO form, ``clip_frac``, ``approx_kl``,
      ``ratio_mean`` (over valid tokens).

    Raises:
      ValueError: if the log-probs are not ``(B, T)``, ``mask`` is not shaped like them,
        ``advantages`` is not ``(B,)``, or only one of ``old_log_probs`` / ``clip_eps`` is given.
    """
    logp, m = _token_inputs(token_log_probs, mask)
    adv = _sg(_f32(advantages))
    if adv.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,) = {logp.shape[:1]}; got {adv.shape}")
    metrics = {}
    if old_log_probs is None:
        if clip_eps is not None:
            raise ValueError("clip_eps needs old_log_probs (the rollout's token log-probs)")
        per_token = -adv[:, None] * logp
    else:
        if clip_eps is None:
            raise ValueError("old_log_probs needs clip_eps")
        old, _ = _token_inputs(old_log_probs, m)
        per_token, metrics = ppo_clip_loss(logp, old, adv[:, None], clip_eps=clip_eps, mask=m)
    n = jnp.sum(m, axis=1).astype(jnp.float32)
    per_seq = jnp.sum(jnp.where(m, per_token, 0.0), axis=1) / jnp.maximum(n, 1.0)
    counted = n > 0
    loss = _masked_mean(per_seq, counted)
    metrics = {"pg_loss": loss, "num_tokens": _masked_mean(n, counted), **metrics}
    return loss, metrics


def k3_kl(log_probs_now, log_probs_ref, mask) -> jax.Array:
    """The masked mean of the per-token k3 estimator of KL(π_now ‖ π_ref).

    Per token, with ``d = logp_ref - logp_now``: ``k3 = exp(d) - d - 1`` (computed as
    ``expm1(d) - d``, clamped at 0), zero iff equal. The mean is over all valid tokens of the batch
    (0 if there are none); the reference is a stop-gradient constant.

    Args:
      log_probs_now: ``(B, T)`` log-probs of the sampled tokens under the current policy.
      log_probs_ref: ``(B, T)`` the same under the frozen reference policy.
      mask: ``(B, T)`` bool, the tokens that count (masked entries may hold any value).

    Returns:
      A float32 scalar ≥ 0.

    Raises:
      ValueError: if the log-probs are not ``(B, T)`` or ``mask`` is not shaped like them.
    """
    now, m = _token_inputs(log_probs_now, mask)
    ref, _ = _token_inputs(log_probs_ref, m)
    d = _sg(ref) - now
    k3 = jnp.maximum(jnp.expm1(d) - d, 0.0)
    return _masked_mean(k3, m)


def token_loss(
    token_log_probs,
    mask,
    advantages,
    *,
    ref_log_probs=None,
    beta=0.0,
    old_log_probs=None,
    clip_eps=None,
) -> tuple[jax.Array, dict]:
    """The refiner-LM loss ``token_pg_loss + β · k3_kl(now, ref)``.

    Args:
      token_log_probs: ``(B, T)`` token log-probs under the current weights.
      mask: ``(B, T)`` bool, the generated tokens that count.
      advantages: ``(B,)`` per-sequence advantages.
      ref_log_probs: ``(B, T)`` the same tokens under the frozen reference LM (may be omitted when
        ``beta == 0``).
      beta: the KL weight β.
      old_log_probs: the rollout's token log-probs, for the PPO form (``token_pg_loss``).
      clip_eps: the per-token clip ε (with ``old_log_probs``).

    Returns:
      ``(loss, metrics)``: the float32 scalar loss and scalar metrics ``loss``, ``kl`` (the unweighted
      k3) and those of ``token_pg_loss``.

    Raises:
      ValueError: if ``ref_log_probs`` is missing while ``beta`` is not a concrete 0, or as
        ``token_pg_loss``.
    """
    pg, metrics = token_pg_loss(token_log_probs, mask, advantages, old_log_probs=old_log_probs, clip_eps=clip_eps)
    if ref_log_probs is None:
        beta_value = _concrete(beta) if jnp.ndim(beta) == 0 else None
        if beta_value != 0.0:
            raise ValueError("token_loss with beta != 0 needs ref_log_probs")
        kl = jnp.zeros((), jnp.float32)
        total = pg
    else:
        kl = k3_kl(token_log_probs, ref_log_probs, mask)
        total = pg + _f32(beta) * kl
    return total, {"loss": total, "kl": kl, **metrics}
