"""The first user path: ``jp.generate`` (one call for every family and workflow), and writing the images."""

import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.digits import workflows
from jaxpipe.io import save_gif, save_grid, save_png

ROOT = Path(__file__).resolve().parents[1]


def test_generate_images_in_unit_range_and_deterministic(t2i_card):
    image = lambda **kw: jp.generate(t2i_card, ["seven thick", "one"], num_steps=4, **kw)["image"]
    a, b = image(seed=0), image(seed=0)
    assert a.shape == (2, 16, 16, 1)
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    np.testing.assert_array_equal(a, b)
    c = image(seed=[0, 5])
    np.testing.assert_array_equal(a[0], c[0])
    assert float(jnp.abs(a[1] - c[1]).max()) > 1e-3


def test_one_return_shape_for_every_family(t2i_card, i2v_card):
    """An artifacts mapping, batched on axis 0, whatever the card (and a workflow id through an engine)."""
    image = jp.generate(t2i_card, ["seven thick", "one"], num_steps=2)
    video = jp.generate(i2v_card, ["seven moving right", "one still"], image=image["image"], num_steps=2)
    assert image["image"].shape == (2, 16, 16, 1) and video["video"].shape == (2, 8, 16, 16, 1)
    assert video["text"] == ["seven moving right", "one still"]
    engine = jp.Engine(max_batch=4)
    engine.register(t2i_card)
    engine.register(i2v_card)
    engine.register_workflow(workflows.t2i_i2v())
    flow = jp.generate("image_video.t2i_i2v", ["seven thick moving right"], num_steps=2, engine=engine)
    assert flow["video"].shape == (1, 8, 16, 16, 1) and flow["t2i:text"] == ["seven thick left"]
    # the workflow runs on the engine's step-driven path, the card call on the fused one: C3 apart
    fused = jp.generate(t2i_card, "seven thick left", num_steps=2)
    np.testing.assert_allclose(flow["image"], fused["image"], atol=parity.TOLERANCE)


def test_generate_bad_input(t2i_card):
    with pytest.raises(ValueError, match="unknown word"):
        jp.generate(t2i_card, "seven purple")
    with pytest.raises(ValueError, match="num_steps"):
        jp.generate(t2i_card, "seven", num_steps=0)
    with pytest.raises(ValueError, match="seed"):
        jp.generate(t2i_card, ["seven", "one"], seed=[1])
    with pytest.raises(ValueError, match="prompts"):
        jp.generate(t2i_card, [])
    with pytest.raises(ValueError, match="image"):
        jp.generate(t2i_card, ["seven", "one"], image=np.zeros((3, 16, 16, 1)))


def test_png_grid_and_gif_are_valid(tmp_path):
    image = np.linspace(0, 1, 16 * 16).reshape(16, 16, 1)
    png = Image.open(save_png(image, tmp_path / "a.png", upscale=4))
    assert png.size == (64, 64)
    assert np.asarray(png)[0, 0] == 0 and np.asarray(png)[-1, -1] == 255
    grid = Image.open(save_grid([image, image], tmp_path / "g.png", upscale=2))
    assert grid.size == (16 * 2 * 2 + 2, 32)
    gif = Image.open(save_gif(np.stack([image, 1 - image, image * 0.5]), tmp_path / "v.gif", upscale=2))
    assert gif.n_frames == 3
    with pytest.raises(ValueError, match="image must be"):
        save_png(np.zeros((4, 4)), tmp_path / "bad.png")


@pytest.mark.slow  # CI runs the README's `jaxpipe generate` itself; the example calls the same jp.generate
def test_quickstart_example_writes_a_png(tmp_path):
    out = tmp_path / "q.png"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "quickstart.py"),
            "one thin",
            "-o",
            str(out),
            "--steps",
            "3",
            "--random",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert Image.open(out).size == (128, 128)
