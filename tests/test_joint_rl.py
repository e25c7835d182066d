"""JointMultiExpertRL: the vmapped N-way update equals per-expert updates, N = 1 is UnifiedRL, credit modes learn."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaves_equal, perturbed

import jaxpipe as jp
from jaxpipe.cards import toy_unified
from jaxpipe.digits import DIGIT_WORDS
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits.rewards import scorer_reward
from jaxpipe.prompts import Prompts
from jaxpipe.training import (
    FlowGRPOConfig,
    Group,
    JointMultiExpertRL,
    JointMultiExpertRLConfig,
    Optimizer,
    RefinerConfig,
    Sampling,
    UnifiedRL,
    ppo,
)


def small(lr=1e-3, minibatches=1, **changes):
    """K = 3 (skip 1), 2 denoise steps with the SDE on the first, refiner lr ``lr``; ``changes``: other
    ``JointMultiExpertRLConfig`` fields."""
    generator = FlowGRPOConfig(
        group=Group(3),
        sampling=Sampling(num_steps=2, sampler="sde", sde_window=(0, 1)),
        beta=0.04,
        ppo=ppo.Schedule(minibatches=minibatches),
    )
    return JointMultiExpertRLConfig(
        generator=generator, refiner=RefinerConfig(skip=1), refiner_optimizer=Optimizer(lr), **changes
    )


def parts_reward(artifacts, prompts):
    """Two reward parts from image statistics (cheap, differentiable in nothing we train)."""
    images = artifacts["image"]
    return {"stroke": jnp.mean(images, axis=(1, 2, 3)), "position": jnp.mean(images[:, :, 8:], axis=(1, 2, 3))}


def tiny_unified():
    card = jp.cards.build("unified", seed=5)
    return card.replace(
        transformer=perturbed(card["transformer"], seed=6), llm=perturbed(card["llm"], seed=7, scale=0.2)
    )


def prompts(card, words=("seven", "one")):
    return Prompts.from_texts(card, list(words))


def _vmapped_setup():
    """N = 4 per-expert refiners (prompt-only, vmapped), their state and one rollout."""
    base = tiny_unified()
    card = digit_cards.multi_expert(base, 4)  # N = 4 (slots cycle: stroke, position, brightness, stroke)
    card = card.replace(refiners=perturbed(card["refiners"], seed=8, scale=0.2))  # experts differ
    # lr 1e-4: Adam's first step is ±lr·sign(g) where |g| ~ eps, so a float-reordering difference in a
    # near-zero gradient shows up as up to ~lr·1e-3 in the weights; at 1e-4 that stays under 1e-6
    # (prompt-only: the refiners' vmapped update is what is compared; the generator update is UnifiedRL's, tested there)
    config = small(1e-4, credit="per_expert", expert_terms=("stroke", "position") * 2, joint=False, expert_map="vmap")
    # the vmap policy; test_precision.py checks the lax.map policy equals it
    method = JointMultiExpertRL(card, parts_reward, config)
    assert method.expert_map == "vmap" and method.stacked == ("refiner",)
    state = method.init(jax.random.key(0))
    assert set(state.params) == {"refiner"} and all(
        x.shape[0] == 4 for x in jax.tree.leaves(state.opt_state["refiner"]) if getattr(x, "ndim", 0)
    )  # one Adam state per expert, stacked
    ro = method.rollout(state, prompts(card), jax.random.key(0))
    assert ro.refinement.tokens.shape[0] == 4 and float(jnp.abs(ro.refiner_advantages).max()) > 0.5
    return card, config, method, state, ro


def test_vmapped_update_equals_updating_each_expert_separately():
    card, config, method, state, ro = _vmapped_setup()
    new, metrics = method.update(state, ro)
    assert float(metrics["skipped"]) == 0.0
    one = jax.jit(method.expert_update)
    refiners, reference, refiner_opt = (
        state.params["refiner"],
        state.copies["refiner_reference"],
        state.opt_state["refiner"],
    )
    for i in range(4):
        take = lambda tree, i=i: jax.tree.map(lambda x: x[i], tree)
        alone = one(
            take(refiners),
            take(reference),
            take(refiner_opt),
            method.allowed[i],
            take(ro.refinement),
            ro.refiner_advantages[i],
        )
        assert bool(alone.finite)
        for got, want in zip(jax.tree.leaves(take(new.params["refiner"])), jax.tree.leaves(alone.params)):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        for got, want in zip(jax.tree.leaves(take(new.opt_state["refiner"])), jax.tree.leaves(alone.opt_state)):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        assert not leaves_equal(take(new.params["refiner"]), take(refiners))
        np.testing.assert_allclose(float(metrics[f"refiner_{i}_loss"]), float(alone.loss), atol=1e-6)

    # slot restriction held in the rollout: refiner 1 (position) only said position words or <eos>
    tok = card.spec.tokenizer
    said = set(np.asarray(ro.refinement.tokens[1][np.asarray(ro.refinement.mask[1])]).tolist())
    assert said <= {tok.words.index(w) for w in ("left", "center", "right")} | {toy_unified.eos_id(card)}


@pytest.mark.slow  # ~15 s (a second method's compile); the single vmapped update is checked against each expert by default
def test_vmapped_minibatch_updates_equal_each_expert_over_the_same_minibatches():
    card, config, method, state, ro = _vmapped_setup()
    refiners, reference, refiner_opt = (
        state.params["refiner"],
        state.copies["refiner_reference"],
        state.opt_state["refiner"],
    )
    # several updates per rollout: the 6 rows in 3 minibatches, the vmapped update per minibatch ==
    # each expert updated alone over the same minibatches, in the same order
    config = dataclasses.replace(
        config,
        generator=dataclasses.replace(config.generator, ppo=ppo.Schedule(minibatches=3)),
        refiner_optimizer=Optimizer(1e-5),
    )
    method = JointMultiExpertRL(card, parts_reward, config)
    key = jax.random.key(11)
    new, metrics = method.update(state, ro, key)
    assert float(metrics["skipped"]) == 0.0 and "lm_ratio_mean_u2" in metrics
    rows = ppo.minibatch_rows(jax.random.fold_in(key, 0), 6, config.generator.ppo)[0]  # ppo.run's order
    one = jax.jit(method.expert_update)
    for i in range(4):
        take = lambda tree, i=i: jax.tree.map(lambda x: x[i], tree)
        params, opt = take(refiners), take(refiner_opt)
        for idx in rows:
            minibatch = jax.tree.map(lambda x, i=i, idx=idx: x[i][idx], ro.refinement)
            params, opt, *_ = one(
                params, take(reference), opt, method.allowed[i], minibatch, ro.refiner_advantages[i][idx]
            )
        # three Adam steps of lr 1e-5, each sensitive to float reordering in near-zero gradients (measured up
        # to ~0.25·lr per weight with XLA at -O0); a minibatch out of order or from other rows moves weights by ~lr
        for got, want in zip(jax.tree.leaves(take(new.params["refiner"])), jax.tree.leaves(params)):
            np.testing.assert_allclose(got, want, atol=4e-6, rtol=0)


@pytest.mark.slow  # the vmapped N-way update is checked against the per-expert loop above, by default
def test_one_expert_reproduces_unified_rl():
    base = tiny_unified()
    card = digit_cards.multi_expert(base, 1, slots=None, refine=base.spec.config.refine)
    reward_parts = lambda artifacts, prompts: {"bright": jnp.mean(artifacts["image"], axis=(1, 2, 3))}
    joint = JointMultiExpertRL(card, reward_parts, small())
    single = UnifiedRL(base, lambda artifacts, prompts: jnp.mean(artifacts["image"], axis=(1, 2, 3)), small())
    sj, su = joint.init(jax.random.key(0)), single.init(jax.random.key(0))
    for i in range(2):
        sj, mj = joint.step(sj, prompts(card), jax.random.key(i))
        su, mu = single.step(su, prompts(base), jax.random.key(i))
        for name, value in mu.items():
            np.testing.assert_allclose(float(mj[name]), float(value), rtol=1e-4, atol=1e-6, err_msg=name)
    for got, want in zip(jax.tree.leaves(sj.params["generator"]), jax.tree.leaves(su.params["generator"])):
        np.testing.assert_allclose(got, want, atol=1e-6)
    for got, want in zip(jax.tree.leaves(sj.params["refiner"]), jax.tree.leaves(su.params["refiner"])):
        np.testing.assert_allclose(got[0], want, atol=1e-6)  # the one stacked refiner is UnifiedRL's LM


def test_bad_configs():
    with pytest.raises(ValueError, match="credit"):
        JointMultiExpertRLConfig(credit="blame")
    with pytest.raises(ValueError, match="skip"):
        JointMultiExpertRLConfig(generator=FlowGRPOConfig(group=Group(2), beta=0.04), refiner=RefinerConfig(skip=2))
    with pytest.raises(ValueError, match="expert_map"):
        JointMultiExpertRLConfig(expert_map="loop")
    assert JointMultiExpertRLConfig(joint=False).joint is False and JointMultiExpertRLConfig().joint is True
    with pytest.raises(ValueError, match="num_refiners"):
        digit_cards.config("multi-expert", num_refiners=0)
    with pytest.raises(ValueError, match="no room"):
        digit_cards.config("multi-expert", num_refiners=8)
    card = digit_cards.multi_expert(tiny_unified(), 2, slots=None)
    with pytest.raises(ValueError, match="per_expert"):
        JointMultiExpertRL(card, parts_reward, JointMultiExpertRLConfig(credit="per_expert"))
    with pytest.raises(ValueError, match="multi-expert"):
        JointMultiExpertRL(tiny_unified(), parts_reward, JointMultiExpertRLConfig())


PREFER = {"stroke": ("thick", 1), "position": ("right", 2), "brightness": ("dim", 0)}


@pytest.fixture(scope="module")
def bundled():
    return digit_cards.multi_expert(jp.cards.load("unified"), 3), jp.cards.load("digit-scorer")


def preferred_rates(method, card, state):
    """Per refiner: the fraction of refined samples where it said its slot's preferred word."""
    tok = card.spec.tokenizer
    ro = method.rollout(state, digits_batch(card, 10_000, 16), jax.random.key(10_000))
    r = ro.refinement
    rates = []
    for i in range(card.spec.config.num_refiners):
        slot = card.spec.config.slot(i)
        said = jnp.any((r.tokens[i] == tok.words.index(PREFER[slot][0])) & r.mask[i], axis=1)
        rates.append(float(jnp.mean(said[ro.refined])))
    return np.array(rates)


def digits_batch(card, seed, n=8):
    d = np.random.default_rng(seed).integers(0, 10, n)
    labels = {slot: np.full(n, label, np.int32) for slot, (_, label) in PREFER.items()}
    return Prompts.from_texts(card, [DIGIT_WORDS[x] for x in d], labels)


@pytest.mark.slow  # ~18 s (15 steps on the bundled cards); by default the vmapped update is checked against each
# expert updated alone (above) and the refiner update's direction in test_unified_rl.py
@pytest.mark.parametrize("credit", ["per_expert", "shared"])
def test_refiners_learn_their_preferred_words_prompt_only(bundled, credit):
    """Prompt-only N = 3 on the bundled generator, reward = the scorer's probability of thick / right / dim.
    per_expert: every refiner learns its own word. shared: runs and learns too (the README reports how
    noisy). The generator stays bit-identical."""
    card, scorer = bundled
    config = JointMultiExpertRLConfig(
        generator=FlowGRPOConfig(group=Group(4), sampling=Sampling(num_steps=4, sampler="sde"), beta=0.04),
        refiner=RefinerConfig(skip=1),
        refiner_optimizer=Optimizer(3e-3),
        joint=False,
        credit=credit,
    )
    method = JointMultiExpertRL(card, scorer_reward(scorer, tuple(PREFER)), config)
    state = start = method.init(jax.random.key(0))
    before = preferred_rates(method, card, state)
    for i in range(15):
        state, metrics = method.step(state, digits_batch(card, i), jax.random.key(i))
    after = preferred_rates(method, card, state)
    gained = after - before
    if credit == "per_expert":
        assert np.all(gained > 0.2) and np.all(after > 0.7), (before, after)
    else:
        assert np.max(gained) > 0.2, (before, after)
    assert set(state.params) == {"refiner"} and leaves_equal(state.frozen, start.frozen)  # the generator: frozen
    assert method.card(state)["transformer"] is not None
