"""Expert routing in one denoise loop: two denoisers switched by noise level inside one jitted step.

The two-expert ``toy_flow`` card binds ``high`` and ``low``; ``policies.SigmaBoundary(0.5)`` sends a
request to ``high`` while its σ >= 0.5 and to ``low`` below. A router that always picks expert 0
equals the one-expert card bit for bit.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_family as toy

import jaxpipe as jp
from jaxpipe.card import Card
from jaxpipe.loops import denoise, policies

BOUNDARY = 0.5


@pytest.fixture(scope="module", autouse=True)
def family():
    jp.cards.register_family(toy.FAMILY)
    yield
    jp.cards.unregister_family(toy.FAMILY.name)


@pytest.fixture(scope="module")
def routed():
    return toy.build(toy.Config(experts=2, boundary=BOUNDARY, num_steps=6), seed=1)


@pytest.fixture(scope="module")
def state(routed):
    labels = jnp.arange(3)
    cond = {"context": routed["embed"](labels)}
    keys = jax.random.split(jax.random.key(0), 3)
    return denoise.init(keys, toy.SHAPE, cond, routed.spec.loop(toy.LOOP).config)


def with_router(card: Card, router) -> Card:
    loop = card.spec.loop(toy.LOOP)
    loop = dataclasses.replace(loop, config=loop.config.replace(router=router))
    return Card(card.components, dataclasses.replace(card.spec, loops=(loop,)))


step = jax.jit(denoise.step, static_argnames="config")


def test_steps_above_the_boundary_use_expert_0_and_below_expert_1(routed, state):
    config = routed.spec.loop(toy.LOOP).config
    single = config.replace(router=policies.Single())
    high, low = routed.bound(toy.LOOP)
    used = []
    for i in range(config.num_steps):
        sigma = float(state.sigmas[0, i])
        expert = high if sigma >= BOUNDARY else low
        new, record = step((high, low), state, config=config)
        alone, alone_record = step((expert,), state, config=single)
        np.testing.assert_array_equal(new.x, alone.x)
        np.testing.assert_array_equal(record.sample, alone_record.sample)
        other, _ = step((low if expert is high else high,), state, config=single)
        assert float(jnp.abs(other.x - new.x).max()) > 1e-4  # the experts really differ
        used.append("high" if expert is high else "low")
        state = new
    assert used == ["high"] * 4 + ["low"] * 2  # σ = 1, 5/6, 4/6, 3/6 | 2/6, 1/6 (the boundary belongs to high)
    assert step._cache_size() == 2  # the routed step compiled once for both experts (plus the single-expert one)


def test_a_batch_with_rows_on_both_sides_routes_each_row(routed, state):
    config = routed.spec.loop(toy.LOOP).config
    single = config.replace(router=policies.Single())
    high, low = routed.bound(toy.LOOP)
    mixed = state._replace(step=jnp.array([0, 4, 1], jnp.int32))  # σ = 1, 1/3, 5/6
    new, _ = step((high, low), mixed, config=config)
    by_high, _ = step((high,), mixed, config=single)
    by_low, _ = step((low,), mixed, config=single)
    np.testing.assert_allclose(new.x[0], by_high.x[0], atol=1e-6)
    np.testing.assert_allclose(new.x[1], by_low.x[1], atol=1e-6)
    np.testing.assert_allclose(new.x[2], by_high.x[2], atol=1e-6)


def test_a_router_that_always_picks_0_equals_the_one_expert_card_bit_for_bit(routed):
    one = toy.build(toy.Config(experts=1, num_steps=6), seed=1)
    one = one.replace(denoiser=routed["high"], embed=routed["embed"])
    fixed = with_router(routed, policies.Fixed(0, 2))
    prompts = ["0", "3", "7"]
    np.testing.assert_array_equal(
        jp.generate(fixed, prompts, seed=2)["sample"], jp.generate(one, prompts, seed=2)["sample"]
    )
    engine_one, engine_fixed = jp.Engine(), jp.Engine()
    engine_one.register(one)
    engine_fixed.register(fixed)
    request = jp.Request(toy.MODEL_ID, prompt="5", seed=4)
    np.testing.assert_array_equal(engine_fixed.run(request)["sample"], engine_one.run(request)["sample"])
    boundary = jp.generate(routed, prompts, seed=2)["sample"]
    assert float(jnp.abs(boundary - jp.generate(fixed, prompts, seed=2)["sample"]).max()) > 1e-4


def test_routed_cards_serve_with_c1_and_reject_mismatched_routers(routed):
    engine = jp.Engine(max_batch=4)
    engine.register(routed)
    requests = [jp.Request(toy.MODEL_ID, prompt=str(i), seed=i, num_steps=3 + i % 4) for i in range(5)]
    assert jp.parity.interleave_gate(engine, requests).max_abs_diff == 0.0
    report = jp.parity.batch_invariance(engine, requests)  # rows at different σ share a batched step
    assert report.passed, report
    with pytest.raises(jp.CardValidationError, match=r"chooses among 2 denoiser\(s\) but it binds 1"):
        with_router(toy.build(toy.Config()), policies.SigmaBoundary(0.5))
    with pytest.raises(ValueError, match="boundary must be a noise level"):
        policies.SigmaBoundary(1.5)
    with pytest.raises(ValueError, match="expert must be in 0..1"):
        policies.Fixed(2, 2)
