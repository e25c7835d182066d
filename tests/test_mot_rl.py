"""RL on shared weights: one transformer thinks and generates; one summed update; C2 on both loops."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

from jaxpipe.cards import toy_mot
from jaxpipe.nn.mot import Routing
from jaxpipe.training import rollout
from jaxpipe.training.mot_rl import MoTRLConfig, SharedMoTRL, role_cosines
from jaxpipe.digits import cards as digit_cards
import jaxpipe as jp

CONFIG = MoTRLConfig(group_size=2, skip=1, num_steps=3, sde_window=(0, 2), token_weight=0.5)


def brightness(images, labels):
    del labels
    return images.mean(axis=(1, 2, 3))


def method(routing="modality", config=CONFIG):
    base = digit_cards.config("bagel-mot")
    card = jp.cards.build("bagel-mot", config=dataclasses.replace(base, mot=dataclasses.replace(base.mot, routing=routing, depth=1)), seed=1)
    card = card.replace(transformer=perturbed(card["transformer"], seed=4))
    return SharedMoTRL(card, brightness, config)


@pytest.fixture(scope="module")
def rolled():
    m = method()
    state = m.init()
    batch = {"ids": jnp.asarray([[4, 0, 0, 0], [5, 9, 0, 0]], jnp.int32), "labels": {}}
    return m, state, m.rollout(state, batch, jax.random.key(0)), jax.jit(m.gradients)


def test_c2_on_both_loops(rolled):
    m, state, ro, gradients = rolled
    mot = m._mot(state.params, state.frozen)
    tokens = rollout.token_log_probs(mot, ro.thought)
    np.testing.assert_allclose(tokens, ro.thought.log_prob, atol=1e-5)
    assert int(ro.thought.mask.sum()) > 0 and not bool(ro.thought.mask[~ro.think].any())
    (_, token_metrics), (_, gen_metrics) = [part[0] for part in gradients(state.params, state.reference, state.frozen, ro)]
    assert abs(float(token_metrics["ratio_mean"]) - 1.0) < 1e-5
    assert abs(float(gen_metrics["ratio_mean"]) - 1.0) < 1e-4  # the text K/V recomputed under θ: reuse == recompute
    assert float(gen_metrics["clip_frac"]) == 0.0


def test_the_update_gradient_is_the_sum_of_the_two_parts(rolled):
    m, state, ro, gradients = rolled
    total = jax.jit(jax.grad(m.loss))(state.params, state.reference, state.frozen, ro)
    (_, g_token), (_, g_gen) = gradients(state.params, state.reference, state.frozen, ro)
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
    assert any(moved) and float(metrics["skipped"]) == 0.0
    for role in ("all", "understanding", "io"):
        assert -1.0 <= float(metrics[f"cos_{role}"]) <= 1.0


@pytest.mark.slow  # a second card and a full step compile; the role accounting is tested above on modality routing
def test_shared_routing_puts_both_parts_on_the_same_parameters():
    m = method("shared")
    state = m.init()
    batch = {"ids": jnp.asarray([[4, 0, 0, 0]], jnp.int32), "labels": {}}
    _, metrics = m.step(state, batch, jax.random.key(2))
    assert float(metrics["token_grad_norm_shared"]) > 0 and float(metrics["gen_grad_norm_shared"]) > 0
    assert float(metrics["gen_grad_norm_understanding"]) == float(metrics["gen_grad_norm_generation"]) == 0.0


def test_bad_settings():
    with pytest.raises(ValueError, match="at least one sample per group must think"):
        MoTRLConfig(group_size=2, skip=2)
    with pytest.raises(ValueError, match="minibatches"):
        method(config=MoTRLConfig(group_size=2, num_steps=3, sde_window=(0, 2), minibatches=3)).step(
            method().init(), {"ids": jnp.asarray([[4, 0, 0, 0]], jnp.int32), "labels": {}}, jax.random.key(0))
    assert Routing("shared").policy == "shared"
