"""UnifiedRL: one reward, two models, two loop types — C2 for both, real updates, no-ops, prompt-only, learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaves_equal, perturbed

import jaxpipe as jp
from jaxpipe import samplers
from jaxpipe.cards import toy_unified
from jaxpipe.digits import DIGIT_WORDS
from jaxpipe.digits.rewards import scorer_reward
from jaxpipe.prompts import Prompts, encode_text
from jaxpipe.training import (
    FlowGRPOConfig,
    Group,
    Optimizer,
    RefinerConfig,
    Sampling,
    UnifiedRL,
    UnifiedRLConfig,
    rollout,
)
from jaxpipe.training.refine import refine_rows

GENERATOR = FlowGRPOConfig(group=Group(3), sampling=Sampling(num_steps=3, sampler="sde", sde_window=(0, 2)), beta=0.04)
CONFIG = UnifiedRLConfig(generator=GENERATOR, refiner=RefinerConfig(skip=1), refiner_optimizer=Optimizer(1e-3))


def brightness_reward(artifacts, prompts):
    """Mean brightness, scaled and offset per prompt (scale 0 = a constant reward, offset nan = non-finite):
    one reward function, so every test shares one compiled step."""
    meta = prompts.metadata
    return meta["scale"] * jnp.mean(artifacts["image"], axis=(1, 2, 3)) + meta["offset"]


def batch(card, prompts=("seven", "one thin"), scale=1.0, offset=0.0):
    """``Prompts`` with the reward's per-prompt scale and offset. Built from the tokenizer's ids directly (not
    ``Prompts.from_texts``, which refuses a prompt the card cannot refine), so the trainer's own checks are tested."""
    ids = jnp.asarray(card.spec.tokenizer.encode(list(prompts), 8), jnp.int32)
    n = len(prompts)
    meta = {"scale": jnp.full(n, scale, jnp.float32), "offset": jnp.full(n, offset, jnp.float32)}
    return Prompts(ids, jnp.asarray(encode_text(list(prompts), 64)), meta)


@pytest.fixture(scope="module")
def card():
    c = jp.cards.build("unified", seed=3)
    return c.replace(transformer=perturbed(c["transformer"], seed=4))


@pytest.fixture(scope="module")
def method(card):
    return UnifiedRL(card, brightness_reward, CONFIG)


@pytest.fixture(scope="module")
def rolled(method, card):
    state = method.init(jax.random.key(0))
    return state, method.rollout(state, batch(card), jax.random.key(0))


def test_rollout_layout(rolled, card):
    _, ro = rolled
    assert ro.refined.tolist() == [True, True, False] * 2  # K - skip refined per group
    assert not bool(jnp.any(ro.refinement.mask[~ro.refined]))  # kept prompts carry no LM tokens
    original = batch(card).ids
    np.testing.assert_array_equal(ro.text_ids[2], original[0])
    np.testing.assert_array_equal(ro.text_ids[5], original[1])
    eos = toy_unified.eos_id(card)
    assert not bool(jnp.any(ro.text_ids == eos))  # <eos> never reaches the text encoder
    # a refined row renders its own LM continuation of its prompt
    n = int(jnp.sum(original[0] != 0))
    np.testing.assert_array_equal(ro.text_ids[0, :n], original[0, :n])


def test_c2_for_both_models_as_the_trainer_computes_it(method, rolled):
    state, ro = rolled
    llm = method.components(state.params, state.frozen)["llm"]
    token_lp = jax.jit(rollout.token_log_probs)(llm, ro.refinement)
    ratio = jnp.where(ro.refinement.mask, jnp.exp(token_lp - ro.refinement.log_prob), 1.0)
    np.testing.assert_allclose(ratio, 1.0, atol=1e-5)
    assert int(jnp.sum(ro.refinement.mask)) > 0
    dit = method.components(state.params, state.frozen)["transformer"]
    gen_lp, _ = jax.jit(rollout.generator_stats, static_argnums=2)(dit, ro.generated, method.sampling)
    np.testing.assert_allclose(jnp.exp(gen_lp - ro.generated.trajectory.log_prob), 1.0, atol=1e-5)
    # and the losses' own ratio metrics at the first update
    _, metrics = method.update(state, ro)
    assert abs(float(metrics["lm_ratio_mean"]) - 1.0) < 1e-5 and abs(float(metrics["gen_ratio_mean"]) - 1.0) < 1e-5


@pytest.mark.slow  # ~12 s of its own compiles; C2 for both models (the trainer's math) stays in the default tier
def test_update_moves_both_models_the_right_way(method, rolled):
    state, ro = rolled
    assert float(jnp.abs(ro.advantages).max()) > 0.5
    new, metrics = method.update(state, ro)
    assert float(metrics["skipped"]) == 0.0
    assert set(new.params) == set(new.opt_state) == {"refiner", "generator"}
    assert not leaves_equal(new.params["refiner"], state.params["refiner"])
    assert not leaves_equal(new.params["generator"], state.params["generator"])
    assert leaves_equal(new.frozen, state.frozen) and leaves_equal(new.copies, state.copies)  # both references stay
    # LM: the refined samples' sequence log-prob moves with their advantage
    old_llm = method.components(state.params, state.frozen)["llm"]
    new_llm = method.components(new.params, new.frozen)["llm"]
    delta = jnp.sum(
        rollout.token_log_probs(new_llm, ro.refinement) - rollout.token_log_probs(old_llm, ro.refinement), axis=1
    )
    assert float(jnp.sum(jnp.where(ro.refined, ro.advantages * delta, 0.0))) > 0
    # generator: advantage-weighted, v moves toward the realized samples' ML velocity
    traj, cond = ro.generated.trajectory, ro.generated.cond
    old_dit = method.components(state.params, state.frozen)["transformer"]
    new_dit = method.components(new.params, new.frozen)["transformer"]
    agreement = 0.0
    for s in range(traj.x.shape[0]):
        v_old = old_dit(traj.x[s], traj.sigma[s], cond.context, cond.context_mask)
        v_new = new_dit(traj.x[s], traj.sigma[s], cond.context, cond.context_mask)
        v_ml = samplers.ml_velocity(traj.x[s], traj.sample[s], traj.sigma[s], traj.sigma_next[s])
        agreement += float(jnp.sum(ro.advantages * jnp.sum((v_new - v_old) * (v_ml - v_old), axis=(1, 2, 3, 4))))
    assert agreement > 0


@pytest.mark.slow  # FlowGRPO's constant-reward no-op runs by default (test_flow_grpo.py)
def test_constant_reward_moves_neither_model(card, method):
    state = method.init(jax.random.key(0))
    new, metrics = method.step(state, batch(card, scale=0.0, offset=1.0), jax.random.key(1))
    assert float(metrics["reward_std"]) == 0.0 and float(metrics["skipped"]) == 0.0
    assert leaves_equal(new.params, state.params)


def test_non_finite_reward_skips_and_leaves_the_state(card, method):
    state = method.init(jax.random.key(0))
    # rollout + update: the functions the other tests compiled (step fuses the same two)
    ro = method.rollout(state, batch(card, offset=float("nan")), jax.random.key(2))
    new, metrics = method.update(state, ro)
    # both parts' losses are non-finite: both optimiser steps are skipped; the step counter goes on
    assert float(metrics["skipped"]) == 1.0 and int(new.step) == 1
    assert leaves_equal((new.params, new.opt_state), (state.params, state.opt_state))


def test_a_non_finite_part_skips_only_its_own_optimiser_step(method, rolled):
    """The guard is per optimiser step (``training.update``), no longer all-or-nothing across the two models:
    a refiner whose KL reference is poisoned (non-finite loss and gradient) keeps its weights and Adam state,
    while the generator's step on the same rollout still applies, as it does without the poison; and the
    other way round. ``skipped`` reports that some step was skipped."""
    state, ro = rolled
    clean, _ = method.update(state, ro)
    nan = lambda tree: jax.tree.map(lambda a: jnp.full_like(a, jnp.nan), tree)
    for bad, good in (("refiner", "generator"), ("generator", "refiner")):
        poisoned = state._replace(copies={**state.copies, f"{bad}_reference": nan(state.copies[f"{bad}_reference"])})
        new, metrics = method.update(poisoned, ro)
        assert float(metrics["skipped"]) == 1.0 and int(new.step) == 1, bad
        assert leaves_equal((new.params[bad], new.opt_state[bad]), (state.params[bad], state.opt_state[bad])), bad
        assert not leaves_equal(new.params[good], state.params[good]), good
        assert leaves_equal((new.params[good], new.opt_state[good]), (clean.params[good], clean.opt_state[good])), good


def test_bad_configs_and_batches(card, method):
    with pytest.raises(ValueError, match="group size"):
        UnifiedRLConfig(generator=FlowGRPOConfig(group=Group(1), beta=0.04))
    with pytest.raises(ValueError, match="skip"):
        UnifiedRLConfig(generator=FlowGRPOConfig(group=Group(4), beta=0.04), refiner=RefinerConfig(skip=4))
    with pytest.raises(ValueError, match="skip"):
        RefinerConfig(skip=-1)
    with pytest.raises(ValueError, match="credit"):
        UnifiedRL(card, brightness_reward, UnifiedRLConfig(generator=GENERATOR, credit="per_expert"))
    with pytest.raises(ValueError, match="unknown reward term"):
        scorer_reward(jp.cards.build("digit-scorer"), ("digit", "sharpness"))
    with pytest.raises(ValueError, match="llm"):
        UnifiedRL(jp.cards.build("flux-t2i"), brightness_reward, CONFIG)
    state = method.init(jax.random.key(0))
    long = batch(card, ("seven thick left bright bright dim", "one"))
    with pytest.raises(ValueError, match="at most 5"):
        method.step(state, long, jax.random.key(0))
    with pytest.raises(ValueError, match="at most max_prompt_words = 5"):  # Prompts.from_texts refuses it first
        Prompts.from_texts(card, ["seven thick left bright bright dim", "one"])
    good = batch(card)
    with pytest.raises(ValueError, match=r"metadata\['scale'\] must have one row per prompt"):
        method.step(state, Prompts(good.ids, good.text, {"scale": jnp.ones(3)}), jax.random.key(0))
    with pytest.raises(TypeError, match="Prompts"):
        method.step(state, {"ids": good.ids, "labels": {}}, jax.random.key(0))  # the old dict batch
    assert refine_rows(4, 1, 8).tolist() == [True, True, True, False] * 2


@pytest.mark.slow  # `jaxpipe train unified --prompt-only` checks the frozen generator by default (test_train_cli.py)
def test_prompt_only_leaves_the_generator_bit_identical_and_the_lm_learns_the_preferred_word():
    """Prompt-only UnifiedRL on the bundled generator with the digit-scorer reward preferring ``thick``:
    the LM learns to ask for it. The generator (and everything but the LM) stays bit-identical."""
    card = jp.cards.load("unified")
    scorer = jp.cards.load("digit-scorer")
    config = UnifiedRLConfig(
        generator=FlowGRPOConfig(group=Group(4), sampling=Sampling(num_steps=4, sampler="sde"), beta=0.04),
        refiner=RefinerConfig(skip=1),
        refiner_optimizer=Optimizer(3e-3),
        joint=False,
    )
    method = UnifiedRL(card, scorer_reward(scorer, ("digit", "stroke")), config)
    tok = card.spec.tokenizer
    thick = tok.words.index("thick")

    def digits_batch(i, n=8):
        d = np.random.default_rng(i).integers(0, 10, n)
        return Prompts.from_texts(
            card, [DIGIT_WORDS[x] for x in d], {"digit": d.astype(np.int32), "stroke": np.ones(n, np.int32)}
        )

    def thick_rate(state):
        ro = method.rollout(state, digits_batch(10_000, 16), jax.random.key(10_000))
        asks = jnp.any((ro.refinement.tokens == thick) & ro.refinement.mask, axis=1)
        return float(jnp.mean(asks[ro.refined]))

    state = method.init(jax.random.key(0))
    start = state
    before = thick_rate(state)
    for i in range(60):
        state, metrics = method.step(state, digits_batch(i), jax.random.key(i))
    after = thick_rate(state)
    assert after > before + 0.3 and after > 0.6, (before, after)
    # prompt-only: the generator is no trained part (no params, Adam state or reference), only frozen weights
    assert set(state.params) == set(state.opt_state) == {"refiner"} and set(state.copies) == {"refiner_reference"}
    assert "transformer" in state.frozen and leaves_equal(state.frozen, start.frozen)
    assert leaves_equal(method.card(state)["transformer"], card["transformer"])


def test_publishing_a_trained_unified_card_versions_each_trained_model(card, method, rolled):
    """After a UnifiedRL update the LM and the DiT each get a new version; the text encoder keeps its
    version and its feature-cache entries, and the engine then serves the new weights."""
    from jaxpipe.training import weight_sync

    state, ro = rolled
    new, _ = method.update(state, ro)
    trained = method.card(new)
    engine = jp.Engine(max_batch=4)
    engine.register(card)
    request = jp.Request("unified", prompt="seven", seed=0, num_steps=2)
    engine.run(request)
    cached = [k for k in engine.cache.keys() if k.component == "text_encoder"]
    assert cached
    versions = weight_sync.publish(engine, trained)
    assert versions == {"text_encoder": 0, "llm": 1, "transformer": 1, "vae": 0}
    assert all(k in engine.cache for k in cached)
    out = engine.run(request)
    fresh = jp.Engine(max_batch=4)
    fresh.register(trained)
    np.testing.assert_array_equal(out["image"], fresh.run(request)["image"])
