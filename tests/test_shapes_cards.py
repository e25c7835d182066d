"""The shapes world's bundled cards: they load, draw what the judge can read, and their recipe reproduces them."""

import json

import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe.shapes import cards, evaluation, grammar, judging, pretrain

pytestmark = pytest.mark.skipif(not {"shapes-t2i", "shapes-t2v"} <= set(jp.cards.available()), reason="bundled cards missing")


def test_the_bundled_cards_load_at_their_bundled_sizes():
    for model_id in ("shapes-t2i", "shapes-t2v"):
        card = jp.cards.load(model_id)
        shipped = json.loads((jp.cards.path(model_id) / "config.json").read_text())["config"]
        assert shipped["image_size"] == 32 and shipped["vae"]["image_channels"] == 3
        assert card.spec.tokenizer.words[2:] == cards.bundled_config(model_id).vocabulary
    assert "shapes-t2i" in jp.cards.buildable() and jp.cards.build("shapes-t2i").spec.loops[0].latent_shape == (1, 8, 8, 4)


def test_shapes_t2i_draws_what_the_judge_reads():
    """Colour prompts at the card's defaults: most images are right (the measured rate is in RESULTS.md)."""
    prompts = grammar.prompt_set("colors", 8)
    images = evaluation.render_prompts(jp.cards.load("shapes-t2i"), [p.text for p in prompts], list(range(8)))
    assert images.shape == (8, 32, 32, 3) and 0 <= images.min() and images.max() <= 1
    right = [judging.correct(judging.judge(image, p), "colors") for image, p in zip(images, prompts)]
    assert sum(right) >= 5, right


def test_shapes_t2v_moves_what_it_is_told():
    video = jp.generate("shapes-t2v", ["a red circle moving right", "a blue square moving down"], seed=0)["video"]
    assert video.shape == (2, 8, 32, 32, 3)
    checks = [judging.judge_video(v, grammar.parse(t)) for v, t in zip(video, ["a red circle moving right", "a blue square moving down"])]
    assert any(c["motion"] for c in checks), checks


@pytest.mark.slow  # two tiny runs of the recipe (~40 s): the same seed gives the same bits
def test_the_recipe_reproduces_its_card_bit_for_bit(tmp_path):
    tiny = pretrain.PretrainConfig(scenes=64, autoencoder_steps=3, autoencoder_batch=8, steps=3, batch_size=8)
    first = pretrain.pretrain("shapes-t2i", tmp_path / "a", tiny, progress=False)
    second = pretrain.pretrain("shapes-t2i", tmp_path / "b", tiny, progress=False)
    assert (tmp_path / "a" / "weights.safetensors").read_bytes() == (tmp_path / "b" / "weights.safetensors").read_bytes()
    report = json.loads((tmp_path / "a" / "pretrain.json").read_text())
    assert report["command"].startswith("python -m jaxpipe.shapes.pretrain shapes-t2i") and report["settings"]["scenes"] == 64
    assert first.num_params() == second.num_params() == jp.cards.load("shapes-t2i").num_params()
    with pytest.raises(SystemExit):
        pretrain.main(["shapes-t2i", "--out", str(tmp_path / "c"), "--steps", "0"])
