"""The wan-t2v card: text -> video on one DiT, served by the engine with its parity guarantees."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.digits import cards as digit_cards
from jaxpipe.engine import Engine
from jaxpipe.nn import DiTConfig


@pytest.fixture(scope="module")
def card():
    built = jp.cards.build("wan-t2v", seed=3)
    return built.replace(transformer=perturbed(built["transformer"], seed=4))


def test_renders_every_frame_from_text_alone(card):
    out = jp.generate(card, ["seven moving right", "one still"], seed=[0, 1], num_steps=2)
    assert out["video"].shape == (2, 8, 16, 16, 1) and out["latents"].shape == (2, *card.spec.config.latent_shape)
    assert float(out["video"].min()) >= 0.0 and float(out["video"].max()) <= 1.0
    assert float(jnp.abs(out["video"][:, 1:] - out["video"][:, :1]).max()) > 1e-4  # frames differ
    assert float(jnp.abs(out["video"][0] - out["video"][1]).max()) > 1e-3  # the prompt matters


def test_serial_equals_interleaved_bit_for_bit(card):
    engine = Engine()
    engine.register(card)
    requests = [
        jp.Request("wan-t2v", prompt=p, seed=s, num_steps=n) for p, s, n in [("seven moving up", 0, 2), ("one", 1, 3)]
    ]
    report = parity.interleave_gate(engine, requests)
    assert report.passed and report.max_abs_diff == 0.0, report


def test_bad_input_is_refused(card):
    with pytest.raises(ValueError, match="takes no image"):
        jp.generate(card, "seven", image=np.zeros((16, 16, 1), np.float32))
    with pytest.raises(ValueError, match="frame_cond=False"):
        digit_cards.config("wan-t2v", dit=DiTConfig(frame_cond=True))
    with pytest.raises(ValueError, match="frames must be an int >= 1"):
        dataclasses.replace(digit_cards.config("wan-t2v"), frames=0)
