"""The bundled pretrained cards load and work (C4 measured on small samples; full runs are `slow`)."""

import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe.digits import quality

BUNDLED = {"flux-t2i", "wan-i2v", "digit-scorer"}
pytestmark = pytest.mark.skipif(not BUNDLED <= set(jp.cards.available()), reason="bundled cards missing")


@pytest.fixture(scope="module")
def bundled():
    return {name: jp.cards.load(name) for name in BUNDLED}


def test_every_bundled_card_loads(bundled):
    for name, card in bundled.items():
        assert card.model_id == name and card.num_params() > 1000


@pytest.mark.slow  # ~10 s: a quality run of the bundled card; by default test_parity renders it (C1) and test_cli draws it
def test_flux_draws_the_prompted_digit(bundled):
    report = quality.t2i_quality(bundled["flux-t2i"], bundled["digit-scorer"], samples=40, seed=1)
    assert report["digit_accuracy"] >= 0.6, report


@pytest.mark.slow  # ~10 s: a quality run of the bundled card; by default test_parity renders it (C1)
def test_wan_moves_as_prompted_and_keeps_the_first_frame(bundled):
    report = quality.i2v_quality(bundled["wan-i2v"], bundled["digit-scorer"], samples=20, seed=1)
    assert report["motion_accuracy"] >= 0.6, report
    assert report["first_frame_mae"] < 0.1, report
    # The digit keeps its shape while it moves: error against the ideal (translated) video. The
    # bundled card measures ~0.015; a DiT that loses the digit after frame 0 measures 0.03-0.08.
    assert report["video_mae"] < 0.025, report


def test_ink_centroids():
    video = np.zeros((2, 16, 16, 1))
    video[0, 3, 4] = 1.0
    video[1, 5, 10] = 1.0
    np.testing.assert_allclose(quality.ink_centroids(video), [[3, 4], [5, 10]], atol=1e-6)


@pytest.mark.slow
def test_full_quality_report(bundled):
    t2i = quality.t2i_quality(bundled["flux-t2i"], bundled["digit-scorer"], samples=200, seed=0)
    i2v = quality.i2v_quality(bundled["wan-i2v"], bundled["digit-scorer"], samples=100, seed=0)
    assert t2i["digit_accuracy"] > 0.7, t2i
    assert i2v["motion_accuracy"] > 0.7, i2v
    assert i2v["first_frame_match"] > 0.7, i2v
    assert i2v["video_mae"] < 0.025, i2v
    assert i2v["last_frame_digit_accuracy"] > 0.4, i2v  # measured 0.47: see the README


MOT = {"bagel-mot", "cosmos3", "digit-scorer"}
needs_mot = pytest.mark.skipif(not MOT <= set(jp.cards.available()), reason="bundled MoT cards missing")


@needs_mot
@pytest.mark.slow  # the bundled bagel-mot is served in the default bundled C1 test (test_parity.py)
def test_bagel_mot_thinks_in_captions_and_reads_digits():
    card, scorer = jp.cards.load("bagel-mot"), jp.cards.load("digit-scorer")
    thinking = quality.thinking_quality(card, scorer, samples=20, seed=1, guidance=1.0)
    assert thinking["think"]["thought_complete"] >= 0.9, thinking  # measured 100% on 200
    understanding = quality.understanding_quality(card, samples=20, seed=1)
    assert understanding["accuracy"]["digit"] >= 0.8 and understanding["complete"] >= 0.9, understanding  # 97% / 100%


@needs_mot
@pytest.mark.slow
def test_mot_quality_report():
    scorer = jp.cards.load("digit-scorer")
    bagel = jp.cards.load("bagel-mot")
    t2i = quality.t2i_quality(bagel, scorer, samples=200, seed=0)
    thinking = quality.thinking_quality(bagel, scorer, samples=200, seed=0, guidance=1.0)
    assert t2i["all_attributes_correct"] > 0.9, t2i  # measured 96%
    assert thinking["think"]["prompt_right"] > thinking["no_think"]["prompt_right"] + 0.1, thinking  # 86.5 vs 67%
    video = quality.t2v_quality(jp.cards.load("cosmos3"), scorer, samples=100, seed=0)
    assert video["full"]["motion_accuracy"] > 0.9 and video["digit_only"]["follows_its_reasoning"] > 0.9, video
