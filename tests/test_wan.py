"""The wan-i2v card: first-frame-conditioned video generation."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe.digits import cards as digit_cards


def frame(value):
    return jnp.full((16, 16, 1), value, jnp.float32)


def animate(card, prompts, images, **kw):
    return jp.generate(card, prompts, image=images, **kw)["video"]


def test_animate_shapes_and_determinism(i2v_card):
    a = animate(i2v_card, ["seven moving right", "one still"], jnp.stack([frame(0.2), frame(0.8)]), num_steps=3)
    b = animate(i2v_card, ["seven moving right", "one still"], jnp.stack([frame(0.2), frame(0.8)]), num_steps=3)
    assert a.shape == (2, 8, 16, 16, 1)
    assert float(a.min()) >= 0 and float(a.max()) <= 1
    np.testing.assert_array_equal(a, b)


def test_the_conditioning_image_matters(i2v_card):
    a = animate(i2v_card, "seven moving right", frame(0.1), num_steps=3)
    b = animate(i2v_card, "seven moving right", frame(0.9), num_steps=3)
    assert float(jnp.abs(a - b).max()) > 1e-3


def test_bad_images_are_rejected_with_the_expected_shape(i2v_card):
    with pytest.raises(ValueError, match=r"image must have shape \(16, 16, 1\)"):
        animate(i2v_card, "seven still", jnp.zeros((8, 8, 1)))
    with pytest.raises(ValueError, match=r"one per prompt \(B=1"):
        animate(i2v_card, "seven still", jnp.zeros((2, 16, 16, 1)))
    with pytest.raises(ValueError, match="animates a first frame"):
        animate(i2v_card, "seven still", None)
    with pytest.raises(ValueError, match="frame_cond"):
        digit_cards.config("wan-i2v", dit=jp.nn.DiTConfig())
