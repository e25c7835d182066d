"""The ``cosmos3`` card: shared-weights MoT, reason -> denoise a video, an optional component it does not ship."""

import dataclasses

import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe.card import Card, CardValidationError, LoopSpec
from jaxpipe.cards import toy_mot_video
from jaxpipe.cards.checkpoint import load_card, save_card
from jaxpipe.digits import cards as digit_cards


@pytest.fixture(scope="module")
def card():
    base = digit_cards.config("cosmos3")
    config = dataclasses.replace(base, reason=base.reason.replace(max_new_tokens=1, temperature=0.0))
    card = jp.cards.build("cosmos3", config=config, seed=0)
    return card.replace(transformer=perturbed(card["transformer"], seed=5))


def test_the_reasoned_caption_replaces_the_prompt(card):
    assert card["transformer"].cfg.routing.policy == "shared"
    out = jp.generate(card, "seven moving", seed=3, num_steps=2)
    assert out["video"].shape == (1, 8, 16, 16, 1) and out["latents"].shape == (1, 8, 8, 8, 4)
    reasoned = out["reasoned_text"][0]
    assert reasoned.startswith("seven moving") and len(reasoned.split()) == 3
    # rendering the reasoned caption as written, with the same seed, is the same video bit for bit:
    # the generation reads the reasoned tokens' K/V and nothing of the prompt
    plain = jp.generate(card, reasoned, seed=3, num_steps=2, inputs={"reason": False})
    np.testing.assert_array_equal(out["video"], plain["video"])
    other = jp.generate(card, "seven moving", seed=3, num_steps=2, inputs={"reason": False})
    assert float(np.abs(other["video"] - out["video"]).max()) > 1e-4


def test_an_optional_component_is_declared_validated_and_not_loaded(card, tmp_path):
    assert card.spec.optional == ("sound_decoder",) and not card.has("sound_decoder")
    with pytest.raises(KeyError, match="declares the optional component 'sound_decoder' but does not have it"):
        card["sound_decoder"]
    save_card(card, tmp_path / "c")
    loaded = load_card(tmp_path / "c")
    assert not loaded.has("sound_decoder") and sorted(loaded.components) == ["transformer", "vae"]
    loop = LoopSpec("speak", "ar_decode", ("sound_decoder",), card.spec.loop(toy_mot_video.REASON_LOOP).config)
    with pytest.raises(CardValidationError, match="binds optional component"):
        Card(card.components, dataclasses.replace(card.spec, loops=card.spec.loops + (loop,)))
