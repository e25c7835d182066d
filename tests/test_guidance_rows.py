"""Guidance is a per-row traced value: requests with different scales batch together, compile one step, and
each row stays what it is alone (C3)."""

import jax
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.cards.registry import default_program
from jaxpipe.engine import Engine
from jaxpipe.engine import batch as ops
from jaxpipe.loops import denoise
from jaxpipe.loops.denoise import DenoiseConfig
from jaxpipe.program import concat_rows, enter, settings

PROMPT = "a red circle left of a blue triangle"


@pytest.fixture(scope="module")
def engine():
    engine = Engine(max_batch=4)
    engine.register(jp.cards.load("shapes-t2i"))
    return engine


def request(seed, guidance):
    return jp.Request("shapes-t2i", prompt=PROMPT, seed=seed, num_steps=2, guidance=guidance)


def test_step_config_leaves_the_scale_to_each_row():
    assert denoise.step_config(DenoiseConfig(guidance=3.0)) == denoise.step_config(DenoiseConfig(guidance=6.0))
    assert denoise.step_config(DenoiseConfig(guidance=3.0)).guidance is None
    assert denoise.step_config(DenoiseConfig(guidance=1.0)).guidance == 1.0  # no CFG stays no CFG
    driver = denoise.DRIVER
    assert driver.batch_key(DenoiseConfig(guidance=3.0, num_steps=2)) == driver.batch_key(
        DenoiseConfig(guidance=6.0, num_steps=3)
    )
    assert driver.batch_key(DenoiseConfig(guidance=3.0)) != driver.batch_key(DenoiseConfig(guidance=1.0))


def test_two_guidance_values_share_one_batch_and_one_compiled_step(engine):
    requests = [request(0, 3.0), request(1, 6.0), request(0, 6.0)]
    before = ops.stepped_many._cache_size()
    ticks = {}
    batched = engine.run_many(requests, "batched", on_step=lambda e: ticks.setdefault(e.tick, set()).add(e.index))
    assert ops.stepped_many._cache_size() - before == 1  # one batched step for every scale
    assert max(len(rows) for rows in ticks.values()) == 3  # the three requests stepped together
    # C3 per row: each row within the measured tolerance of the same request run alone
    for req, out in zip(requests, batched):
        alone = engine.run_many([req], "serial")[0]
        report = parity.compare([alone], [out], tolerance=parity.TOLERANCE)
        assert report.passed, report
    # the scale really is each row's own: same seed, other guidance, other image
    assert float(np.abs(np.asarray(batched[0]["image"]) - np.asarray(batched[2]["image"])).max()) > 1e-3


def test_a_config_number_still_applies_to_every_row():
    """A state records its init's scale, but a config with a number (the fused path, RL) uses that number."""
    card = jp.cards.load("shapes-t2i")
    model = card["transformer"]
    config = DenoiseConfig(num_steps=2, guidance=4.0)
    state = card_bound(card, config)
    np.testing.assert_array_equal(np.asarray(state.guidance), [4.0, 4.0])
    per_row, _ = denoise.run(model, state, denoise.step_config(config))
    fixed, _ = denoise.run(model, state, config)
    np.testing.assert_allclose(np.asarray(per_row.x), np.asarray(fixed.x), atol=parity.TOLERANCE)
    other, _ = denoise.run(model, state, config.replace(guidance=1.5))
    assert float(np.abs(np.asarray(other.x) - np.asarray(fixed.x)).max()) > 1e-4


def card_bound(card, config):
    """The ``t2i_denoise`` loop's first state for two prompts of ``card`` (seeds 0 and 1)."""
    program = default_program(card)
    slots = concat_rows([program.bind(card, request(seed, 4.0)).slots for seed in (0, 1)])
    _, state = jax.jit(lambda c, s: enter(program, 0, settings(t2i_denoise=config), c, s))(card, slots)
    return state
