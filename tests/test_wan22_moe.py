"""The wan22-moe card: two DiT experts switched by σ in one denoise loop, served with parity, RL on the windowed expert.

A tiny random card (2 frames, DiT dim 32, depth 1) with boundary 0.5 and 4 steps: σ = 1, 0.75, 0.5,
0.25, so steps 0-2 run ``transformer_high`` (the boundary belongs to it) and step 3
``transformer_low``.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaves_equal, perturbed
from flax import nnx
from xla_flags import USERS_EMITTERS

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.card import Card
from jaxpipe.cards import generator, toy_sigma_moe
from jaxpipe.digits import cards as digit_cards
from jaxpipe.engine import Engine
from jaxpipe.loops import denoise, policies
from jaxpipe.nn import DiTCond, DiTConfig
from jaxpipe.prompts import Prompts
from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, Sampling, weight_sync

MODEL = "wan22-moe"
LOOP = toy_sigma_moe.LOOP_ID
CONFIG = digit_cards.config(
    "wan22-moe", frames=2, dit=DiTConfig(dim=32, depth=1, heads=2), sampling=denoise.DenoiseConfig(num_steps=4)
)

# compiled with the emitters users run: a routed step and its expert's step alone are compared bit for bit
step = jax.jit(denoise.step, static_argnames="config", compiler_options=USERS_EMITTERS)


def with_router(card: Card, router) -> Card:
    loop = card.spec.loop(LOOP)
    loop = dataclasses.replace(loop, config=loop.config.replace(router=router))
    return Card(card.components, dataclasses.replace(card.spec, loops=(loop,)))


@pytest.fixture(scope="module")
def card():
    built = jp.cards.build("wan22-moe", config=CONFIG, seed=3)
    return built.replace(
        transformer_high=perturbed(built["transformer_high"], seed=4),
        transformer_low=perturbed(built["transformer_low"], seed=5),
    )


@pytest.fixture(scope="module")
def cond(card):
    ids = generator.tokenize(card, ["seven moving right", "one still"])
    return DiTCond(card["text_encoder"](ids), ids != 0, None)


def drive(card, state, expected, step=step):
    """Step ``state`` through its schedule with the card's routed loop (jitted ``step``); each step must
    equal the step of the expert ``expected(sigma)`` names alone. Returns the expert names used."""
    config = card.spec.loop(LOOP).config
    single = config.replace(router=policies.Single())
    used = []
    for i in range(state.sigmas.shape[1] - 1):
        name = expected(float(state.sigmas[0, i]))
        routed, record = step(card.bound(LOOP), state, config=config)
        alone, alone_record = step((card[name],), state, config=single)
        np.testing.assert_array_equal(routed.x, alone.x)
        np.testing.assert_array_equal(record.sample, alone_record.sample)
        other = next(n for n in toy_sigma_moe.EXPERTS if n != name)
        assert float(jnp.abs(step((card[other],), state, config=single)[0].x - routed.x).max()) > 1e-4  # they differ
        used.append(name)
        state = routed
    return used


def test_the_boundary_switches_experts_inside_one_compiled_step(card, cond):
    # a function of its own: jax.jit shares one compile cache among wrappers of the same function
    own_step = jax.jit(
        lambda models, state, config: denoise.step(models, state, config),
        static_argnames="config",
        compiler_options=USERS_EMITTERS,
    )
    by_boundary = lambda sigma: "transformer_high" if sigma >= 0.5 else "transformer_low"
    routed = lambda state: drive(card, state, by_boundary, own_step)
    keys = generator.request_keys([0, 1])
    crossing = denoise.init(keys, CONFIG.latent_shape, cond, CONFIG.loop_config)
    assert routed(crossing) == ["transformer_high"] * 3 + ["transformer_low"]

    above = denoise.init(keys, CONFIG.latent_shape, cond, CONFIG.loop_config.replace(shift=4.0))  # σ = 1, .92, .8, .57
    assert routed(above) == ["transformer_high"] * 4

    x0 = jax.random.normal(jax.random.key(7), (2, *CONFIG.latent_shape))
    below = denoise.init_from_latents(keys, x0, cond, CONFIG.loop_config.replace(start_sigma=0.4))  # σ = .4, .3, .2, .1
    assert routed(below) == ["transformer_low"] * 4
    assert own_step._cache_size() == 2  # one routed step for every schedule and both experts, one single-expert step


def test_a_constant_router_equals_that_expert_as_a_one_expert_card(card):
    """``Fixed(1)``: the low-noise expert on every step, even at σ = 1, is the ``wan-t2v`` card of that DiT
    (``Fixed(0)`` is checked on the toy family in test_routing)."""
    spec = nnx.eval_shape(
        lambda: jp.cards.build(
            "wan-t2v", config=digit_cards.config("wan-t2v", frames=2, dit=CONFIG.dit, sampling=CONFIG.sampling)
        )
    ).spec
    one = Card({"text_encoder": card["text_encoder"], "transformer": card["transformer_low"], "vae": card["vae"]}, spec)
    prompts, seeds = ["seven moving right", "two moving up"], [0, 1]
    fixed = jp.generate(with_router(card, policies.Fixed(1, 2)), prompts, seed=seeds)["video"]
    np.testing.assert_array_equal(fixed, jp.generate(one, prompts, seed=seeds)["video"])


@pytest.mark.slow  # ~5 s; C1 on wan22-moe is in test_parity's every-bundled-card gate
def test_serial_equals_interleaved_bit_for_bit(card):
    engine = Engine()
    engine.register(card)
    requests = [
        jp.Request(MODEL, prompt=p, seed=s, num_steps=n) for p, s, n in [("seven moving up", 0, 4), ("one", 1, 3)]
    ]
    report = parity.interleave_gate(engine, requests)
    assert report.passed and report.max_abs_diff == 0.0, report


def test_a_boundary_outside_0_1_is_refused():
    for bad in (0.0, 1.0, -0.2, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match=r"boundary .* must be in \(0, 1\)"):
            dataclasses.replace(CONFIG, boundary=bad)
    with pytest.raises(ValueError, match="sampling.router must be left as policies.Single"):
        dataclasses.replace(CONFIG, sampling=denoise.DenoiseConfig(router=policies.Fixed(0, 2)))
    assert dataclasses.replace(CONFIG, boundary=0.8).loop_config.router == policies.SigmaBoundary(0.8)


# ------------------------------------------------------------------------------------------ RL on the MoE
def reward(artifacts, prompts):
    return jnp.mean(artifacts["video"], axis=(1, 2, 3, 4))


RL = FlowGRPOConfig(
    group=Group(2), sampling=Sampling(num_steps=4, sampler="sde", sde_window=(0, 2)), optimizer=Optimizer(1e-3)
)  # σ = 1, 0.75: high only


@pytest.mark.parametrize(
    "window, trained",
    [
        ((0, 2), ("transformer_high",)),
        ((3, 4), ("transformer_low",)),
        ((2, 4), toy_sigma_moe.EXPERTS),
        (None, toy_sigma_moe.EXPERTS),
    ],
)
def test_flow_grpo_trains_the_experts_its_window_routes_to(card, window, trained):
    method = FlowGRPO(
        card, reward, dataclasses.replace(RL, sampling=dataclasses.replace(RL.sampling, sde_window=window))
    )
    assert method.denoisers == toy_sigma_moe.EXPERTS and method.trained_experts == trained
    state = method.init()
    assert sorted(state.params) == ["generator"] and sorted(state.params["generator"]) == sorted(trained)
    assert sorted(state.copies["reference"]) == sorted(trained) and method.transformer == trained[0]


@pytest.fixture(scope="module")
def rl_step(card):
    method = FlowGRPO(card, reward, RL)
    state = method.init()
    batch = Prompts.from_texts(card, ["seven moving right", "one moving left"])
    new, metrics = method.step(state, batch, jax.random.key(0))
    return method, state, new, metrics


def test_a_window_above_the_boundary_updates_only_the_high_expert(card, rl_step):
    method, state, new, metrics = rl_step
    assert float(metrics["skipped"]) == 0.0 and float(metrics["reward_std"]) > 0.0
    trained = method.card(new)
    assert not leaves_equal(nnx.state(trained["transformer_high"]), nnx.state(card["transformer_high"]))
    for name in ("transformer_low", "text_encoder", "vae"):  # frozen: bit-identical after the step
        assert leaves_equal(nnx.state(trained[name]), nnx.state(card[name])), name
    assert "transformer_low" not in new.params["generator"] and "transformer_low" not in new.copies["reference"]


def test_publishing_the_step_bumps_only_the_trained_experts_version(card, rl_step):
    method, _, new, _ = rl_step
    engine = Engine()
    engine.register(card)
    before = engine.versions(MODEL)
    assert set(before) == {"text_encoder", "transformer_high", "transformer_low", "vae"}
    after = weight_sync.publish(engine, method.card(new))
    assert after == {**before, "transformer_high": before["transformer_high"] + 1}
    assert engine.versions(MODEL) == after
    assert weight_sync.publish(engine, method.card(new)) == after  # nothing differs now: no version moves


# ------------------------------------------------------------------------------------------ the bundled card
needs_bundled = pytest.mark.skipif(not {"wan-t2v", MODEL} <= set(jp.cards.available()), reason="bundled cards missing")


@needs_bundled
def test_the_bundled_card_shares_wan_t2v_text_and_vae_and_trained_both_experts():
    moe, single = jp.cards.load(MODEL), jp.cards.load("wan-t2v")
    assert (
        moe.spec.loop(LOOP).config.router == policies.SigmaBoundary(0.5) and moe.spec.loop(LOOP).config.guidance == 2.0
    )
    for name in ("text_encoder", "vae"):
        assert leaves_equal(nnx.state(moe[name]), nnx.state(single[name])), name
    high, low, start = (
        nnx.state(m, nnx.Param) for m in (moe["transformer_high"], moe["transformer_low"], single["transformer"])
    )
    assert not leaves_equal(high, low) and not leaves_equal(high, start) and not leaves_equal(low, start)
