"""RL on shared weights: one transformer thinks and generates; one summed update; C2 on both loops."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe.digits import cards as digit_cards
from jaxpipe.nn.mot import Routing
from jaxpipe.prompts import Prompts
from jaxpipe.training import (
    FlowGRPOConfig,
    Group,
    RefinerConfig,
    Sampling,
    SharedMoTRL,
    SharedMoTRLConfig,
    ppo,
    rollout,
)
from jaxpipe.training.methods.mot_rl import role_cosines


def generator_config(**changes):
    """K = 2, three denoise steps with the SDE on the first two."""
    return FlowGRPOConfig(
        group=Group(2), sampling=Sampling(num_steps=3, sampler="sde", sde_window=(0, 2)), beta=0.04, **changes
    )


CONFIG = SharedMoTRLConfig(generator=generator_config(), thinking=RefinerConfig(skip=1), token_weight=0.5)


def brightness(artifacts, prompts):
    del prompts
    return artifacts["image"].mean(axis=(1, 2, 3))


def batch(card, prompts=("two", "three seven")):
    return Prompts.from_texts(card, list(prompts))


def method(routing="modality", config=CONFIG):
    base = digit_cards.config("bagel-mot")
    card = jp.cards.build(
        "bagel-mot",
        config=dataclasses.replace(base, mot=dataclasses.replace(base.mot, routing=routing, depth=1)),
        seed=1,
    )
    card = card.replace(transformer=perturbed(card["transformer"], seed=4))
    return SharedMoTRL(card, brightness, config), card


@pytest.fixture(scope="module")
def rolled():
    m, card = method()
    state = m.init(jax.random.key(0))
    prompts = batch(card)
    np.testing.assert_array_equal(prompts.ids, [[4, 0, 0, 0], [5, 9, 0, 0]])
    return m, state, m.rollout(state, prompts, jax.random.key(0)), jax.jit(m.gradients)


def test_c2_on_both_loops(rolled):
    m, state, ro, gradients = rolled
    assert set(state.params) == set(state.opt_state) == {"model"} and set(state.copies) == {"reference"}
    mot = m._mot(state.params["model"], state.frozen)
    tokens = rollout.token_log_probs(mot, ro.thought)
    np.testing.assert_allclose(tokens, ro.thought.log_prob, atol=1e-5)
    assert int(ro.thought.mask.sum()) > 0 and not bool(ro.thought.mask[~ro.think].any())
    (_, token_metrics), (_, gen_metrics) = [
        part[0] for part in gradients(state.params["model"], state.copies["reference"], state.frozen, ro)
    ]
    assert abs(float(token_metrics["ratio_mean"]) - 1.0) < 1e-5
    assert abs(float(gen_metrics["ratio_mean"]) - 1.0) < 1e-4  # the text K/V recomputed under θ: reuse == recompute
    assert float(gen_metrics["clip_frac"]) == 0.0


def test_the_update_gradient_is_the_sum_of_the_two_parts(rolled):
    m, state, ro, gradients = rolled
    params, reference = state.params["model"], state.copies["reference"]
    total = jax.jit(jax.grad(m.loss))(params, reference, state.frozen, ro)
    (_, g_token), (_, g_gen) = gradients(params, reference, state.frozen, ro)
    summed = jax.tree.map(lambda a, b: CONFIG.token_weight * a + b, g_token, g_gen)
    for x, y in zip(jax.tree.leaves(total), jax.tree.leaves(summed)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-7)
    # both parts reach the understanding expert: the image reward flows through the recomputed text K/V
    norms = role_cosines(g_token, g_gen, m._role)
    assert float(norms["gen_grad_norm_understanding"]) > 0 and float(norms["token_grad_norm_understanding"]) > 0
    assert float(norms["token_grad_norm_generation"]) == 0.0  # thoughts never read image tokens
    assert float(norms["gen_grad_norm_shared"]) == 0.0  # modality routing: nothing is shared


@pytest.mark.slow  # compiles the whole update; the gradient it applies is tested above
def test_one_state_moves_and_reports_interference(rolled):
    m, state, ro, _ = rolled
    new, metrics = m.update(jax.tree.map(jnp.array, state), ro, jax.random.key(1))
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params))]
    assert any(moved) and float(metrics["skipped"]) == 0.0 and int(new.step) == 1
    for role in ("all", "understanding", "io"):
        assert -1.0 <= float(metrics[f"cos_{role}"]) <= 1.0


@pytest.mark.slow  # a second card and a full step compile; the role accounting is tested above on modality routing
def test_shared_routing_puts_both_parts_on_the_same_parameters():
    m, card = method("shared")
    state = m.init(jax.random.key(0))
    _, metrics = m.step(state, batch(card, ("two",)), jax.random.key(2))
    assert float(metrics["token_grad_norm_shared"]) > 0 and float(metrics["gen_grad_norm_shared"]) > 0
    assert float(metrics["gen_grad_norm_understanding"]) == float(metrics["gen_grad_norm_generation"]) == 0.0


def test_bad_settings():
    with pytest.raises(ValueError, match="at least one sample per group must rewrite its prompt"):
        SharedMoTRLConfig(generator=generator_config(), thinking=RefinerConfig(skip=2))
    with pytest.raises(ValueError, match="token_weight"):
        SharedMoTRLConfig(token_weight=-1.0)
    m, card = method(config=SharedMoTRLConfig(generator=generator_config(ppo=ppo.Schedule(minibatches=3))))
    with pytest.raises(ValueError, match="minibatches"):
        m.step(m.init(jax.random.key(0)), batch(card, ("two",)), jax.random.key(0))
    with pytest.raises(ValueError, match="MoT card"):
        SharedMoTRL(jp.cards.build("flux-t2i"), brightness, CONFIG)
    assert Routing("shared").policy == "shared"
