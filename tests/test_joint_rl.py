"""JointMultiExpertRL: the vmapped N-way update equals per-expert updates, N = 1 is UnifiedRL, credit modes learn."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe.cards import toy_multi_expert, toy_unified
from jaxpipe.digits import DIGIT_WORDS
from jaxpipe.digits.rewards import scorer_reward_parts
from jaxpipe.training.joint_rl import JointMultiExpertRL, JointRLConfig
from jaxpipe.training.unified_rl import UnifiedRL, UnifiedRLConfig

from conftest import leaves_equal, perturbed
from jaxpipe.digits import cards as digit_cards

SMALL = dict(group_size=3, skip=1, num_steps=2, sde_window=(0, 1), lm_learning_rate=1e-3)


def parts_reward(images, labels):
    """Two reward parts from image statistics (cheap, differentiable in nothing we train)."""
    return {"stroke": jnp.mean(images, axis=(1, 2, 3)), "position": jnp.mean(images[:, :, 8:], axis=(1, 2, 3))}


def tiny_unified():
    card = jp.cards.build("unified", seed=5)
    return card.replace(transformer=perturbed(card["transformer"], seed=6), llm=perturbed(card["llm"], seed=7, scale=0.2))


def prompts(card, words=("seven", "one")):
    return {"ids": jnp.asarray(card.spec.tokenizer.encode(list(words), 8)), "labels": {}}


def test_vmapped_update_equals_updating_each_expert_separately():
    base = tiny_unified()
    card = digit_cards.multi_expert(base, 4)  # N = 4 (slots cycle: stroke, position, brightness, stroke)
    card = card.replace(refiners=perturbed(card["refiners"], seed=8, scale=0.2))  # experts differ
    # lr 1e-4: Adam's first step is ±lr·sign(g) where |g| ~ eps, so a float-reordering difference in a
    # near-zero gradient shows up as up to ~lr·1e-3 in the weights; at 1e-4 that stays under 1e-6
    # (prompt-only: the refiners' vmapped update is what is compared; the generator update is UnifiedRL's, tested there)
    config = JointRLConfig(
        credit="per_expert", expert_terms=("stroke", "position") * 2, joint=False, expert_map="vmap",
        **{**SMALL, "lm_learning_rate": 1e-4},
    )  # the vmap policy; test_precision.py checks the lax.map policy equals it
    method = JointMultiExpertRL(card, parts_reward, config)
    state = method.init()
    ro = method.rollout(state, prompts(card), jax.random.key(0))
    assert ro.refinements.tokens.shape[0] == 4 and float(jnp.abs(ro.expert_advantages).max()) > 0.5
    new, metrics = method.update(state, ro)
    assert float(metrics["skipped"]) == 0.0
    one = jax.jit(method.expert_update)
    for i in range(4):
        take = lambda tree: jax.tree.map(lambda x: x[i], tree)
        params, opt, value, _, grad_norm = one(
            take(state.refiners), take(state.refiner_reference), take(state.refiner_opt),
            method.allowed[i], take(ro.refinements), ro.expert_advantages[i],
        )
        for got, want in zip(jax.tree.leaves(take(new.refiners)), jax.tree.leaves(params)):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        for got, want in zip(jax.tree.leaves(take(new.refiner_opt)), jax.tree.leaves(opt)):
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
        assert not leaves_equal(take(new.refiners), take(state.refiners))
        np.testing.assert_allclose(float(metrics[f"refiner_{i}_loss"]), float(value), atol=1e-6)

    # several updates per rollout: the 6 rows in 3 minibatches, the vmapped update per minibatch ==
    # each expert updated alone over the same minibatches, in the same order
    from jaxpipe.training import ppo

    config = dataclasses.replace(config, minibatches=3, lm_learning_rate=1e-5)
    method = JointMultiExpertRL(card, parts_reward, config)
    key = jax.random.key(11)
    new, metrics = method.update(state, ro, key)
    assert float(metrics["skipped"]) == 0.0 and "lm_ratio_mean_u2" in metrics
    rows = ppo.minibatch_rows(jax.random.fold_in(key, 0), 6, config.schedule)[0]  # ppo.run's order
    one = jax.jit(method.expert_update)
    for i in range(4):
        take = lambda tree: jax.tree.map(lambda x: x[i], tree)
        params, opt = take(state.refiners), take(state.refiner_opt)
        for idx in rows:
            minibatch = jax.tree.map(lambda x: x[i][idx], ro.refinements)
            params, opt, *_ = one(params, take(state.refiner_reference), opt, method.allowed[i], minibatch,
                                  ro.expert_advantages[i][idx])
        # three Adam steps of lr 1e-5, each sensitive to float reordering in near-zero gradients (measured up
        # to ~0.25·lr per weight with XLA at -O0); a minibatch out of order or from other rows moves weights by ~lr
        for got, want in zip(jax.tree.leaves(take(new.refiners)), jax.tree.leaves(params)):
            np.testing.assert_allclose(got, want, atol=4e-6, rtol=0)
    # slot restriction held in the rollout: refiner 1 (position) only said position words or <eos>
    tok = card.spec.tokenizer
    said = set(np.asarray(ro.refinements.tokens[1][np.asarray(ro.refinements.mask[1])]).tolist())
    assert said <= {tok.words.index(w) for w in ("left", "center", "right")} | {toy_unified.eos_id(card)}


@pytest.mark.slow  # the vmapped N-way update is checked against the per-expert loop below, by default
def test_one_expert_reproduces_unified_rl():
    base = tiny_unified()
    card = digit_cards.multi_expert(base, 1, slots=None, refine=base.spec.config.refine)
    reward_parts = lambda im, lab: {"bright": jnp.mean(im, axis=(1, 2, 3))}
    joint = JointMultiExpertRL(card, reward_parts, JointRLConfig(**SMALL))
    single = UnifiedRL(base, lambda im, lab: jnp.mean(im, axis=(1, 2, 3)), UnifiedRLConfig(**SMALL))
    sj, su = joint.init(), single.init()
    for i in range(2):
        sj, mj = joint.step(sj, prompts(card), jax.random.key(i))
        su, mu = single.step(su, prompts(base), jax.random.key(i))
        for name, value in mu.items():
            np.testing.assert_allclose(float(mj[name]), float(value), rtol=1e-4, atol=1e-6, err_msg=name)
    for got, want in zip(jax.tree.leaves(sj.generator), jax.tree.leaves(su.generator)):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_bad_configs():
    with pytest.raises(ValueError, match="credit"):
        JointRLConfig(credit="blame")
    with pytest.raises(ValueError, match="skip"):
        JointRLConfig(group_size=2, skip=2)
    assert JointRLConfig(joint=False).joint is False and JointRLConfig().joint is True
    with pytest.raises(ValueError, match="num_refiners"):
        digit_cards.config("multi-expert", num_refiners=0)
    with pytest.raises(ValueError, match="no room"):
        digit_cards.config("multi-expert", num_refiners=8)
    card = digit_cards.multi_expert(tiny_unified(), 2, slots=None)
    with pytest.raises(ValueError, match="per_expert"):
        JointMultiExpertRL(card, parts_reward, JointRLConfig(credit="per_expert"))
    with pytest.raises(ValueError, match="multi-expert"):
        JointMultiExpertRL(tiny_unified(), parts_reward, JointRLConfig())


PREFER = {"stroke": ("thick", 1), "position": ("right", 2), "brightness": ("dim", 0)}


@pytest.fixture(scope="module")
def bundled():
    return digit_cards.multi_expert(jp.cards.load("unified"), 3), jp.cards.load("digit-scorer")


def preferred_rates(method, card, state):
    """Per refiner: the fraction of refined samples where it said its slot's preferred word."""
    tok = card.spec.tokenizer
    ro = method.rollout(state, digits_batch(card, 10_000, 16), jax.random.key(10_000))
    r = ro.refinements
    rates = []
    for i, slot in enumerate(toy_multi_expert.Config.slots):
        said = jnp.any((r.tokens[i] == tok.words.index(PREFER[slot][0])) & r.mask[i], axis=1)
        rates.append(float(jnp.mean(said[ro.refined])))
    return np.array(rates)


def digits_batch(card, seed, n=8):
    d = np.random.default_rng(seed).integers(0, 10, n)
    ids = jnp.asarray(card.spec.tokenizer.encode([DIGIT_WORDS[x] for x in d], 8))
    return {"ids": ids, "labels": {slot: jnp.full(n, label, jnp.int32) for slot, (_, label) in PREFER.items()}}


@pytest.mark.parametrize("credit", ["per_expert", pytest.param("shared", marks=pytest.mark.slow)])
def test_refiners_learn_their_preferred_words_prompt_only(bundled, credit):
    """Prompt-only N = 3 on the bundled generator, reward = the scorer's probability of thick / right / dim.
    per_expert: every refiner learns its own word. shared: runs and learns too (the README reports how
    noisy). The generator stays bit-identical."""
    card, scorer = bundled
    config = JointRLConfig(group_size=4, skip=1, joint=False, num_steps=4, lm_learning_rate=3e-3, credit=credit)
    method = JointMultiExpertRL(card, scorer_reward_parts(scorer, tuple(PREFER)), config)
    state = start = method.init()
    before = preferred_rates(method, card, state)
    for i in range(15):
        state, metrics = method.step(state, digits_batch(card, i), jax.random.key(i))
    after = preferred_rates(method, card, state)
    gained = after - before
    if credit == "per_expert":
        assert np.all(gained > 0.2) and np.all(after > 0.7), (before, after)
    else:
        assert np.max(gained) > 0.2, (before, after)
    assert leaves_equal((state.generator, state.frozen), (start.generator, start.frozen))
    assert method.card(state)["transformer"] is not None
