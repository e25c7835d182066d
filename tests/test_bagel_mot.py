"""The ``bagel-mot`` card: one MoT bound to an AR loop and a denoise loop, its programs, its serving."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.cards import toy_mot
from jaxpipe.digits import cards as digit_cards
from jaxpipe.engine import Engine

UNDERSTAND_ID = "bagel-mot:understand"


@pytest.fixture(scope="module")
def card():
    base = digit_cards.config("bagel-mot")
    card = jp.cards.build(
        "bagel-mot", config=dataclasses.replace(base, mot=dataclasses.replace(base.mot, depth=1)), seed=0
    )  # one layer: compiles fast
    return card.replace(transformer=perturbed(card["transformer"], seed=3))


@pytest.fixture(scope="module")
def engine(card):
    engine = Engine(max_batch=4)
    engine.register(card)
    engine.register(card, toy_mot.understand(), model_id=UNDERSTAND_ID)
    return engine


def image(value: float) -> np.ndarray:
    return np.clip(np.linspace(0, 1, 256).reshape(16, 16, 1) * value, 0, 1).astype(np.float32)


def test_one_module_is_bound_to_both_loop_kinds(card):
    loops = {loop.id: loop for loop in card.spec.loops}
    assert {loop.kind for loop in loops.values()} == {"ar_decode", "denoise"}
    assert all(loop.binds == ("transformer",) for loop in loops.values())
    assert card.bound(toy_mot.THINK_LOOP)[0] is card.bound(toy_mot.IMAGE_LOOP)[0] is card["transformer"]


def test_think_then_generate(card):
    out = jp.generate(card, ["seven", "two thick"], seed=0, inputs={"temperature": 0})
    assert out["image"].shape == (2, 16, 16, 1) and out["latents"].shape == (2, 1, 8, 8, 4)
    for prompt, thought in zip(["seven", "two thick"], out["thought_text"]):
        assert thought.startswith(prompt) and len(thought.split()) > len(prompt.split())
    plain = jp.generate(card, ["seven", "two thick"], seed=0, inputs={"think": False})
    assert plain["thought_text"] == ["seven", "two thick"]
    # the thought changes what the image attends to, and nothing else: same seed, different image
    assert float(jnp.abs(out["image"] - plain["image"]).max()) > 1e-4


@pytest.mark.slow  # the engine test serves understanding requests; test_pretrained measures the bundled card's captions
def test_understanding_reads_the_image(card):
    out = jp.generate(card, ["", ""], image=np.stack([image(1.0), image(0.2)]), program=toy_mot.understand())
    assert out["caption"].shape[0] == 2 and all(isinstance(t, str) for t in out["caption_text"])
    mot = card["transformer"]
    latents = card["vae"].encode(jnp.stack([image(1.0), image(0.2)]) * 2 - 1)[:, None]
    ids = jnp.full((2, 1), toy_mot.eos_id(card))
    logits = mot.understand(ids, ids != 0, latents)
    assert float(jnp.abs(logits[0] - logits[1]).max()) > 1e-3, "the caption's first word depends on the image"


@pytest.mark.slow  # ~12 s; C1 on bagel-mot (serial == interleaved) is in test_parity's every-bundled-card gate
def test_serial_equals_interleaved_with_ar_and_denoise_requests_mixed(engine):
    requests = [
        jp.Request("bagel-mot", prompt="seven", seed=0, num_steps=3),
        jp.Request(UNDERSTAND_ID, image=image(1.0), seed=1),
        jp.Request("bagel-mot", prompt="one thin", seed=2, num_steps=2, inputs={"think": False}),
        jp.Request(UNDERSTAND_ID, image=image(0.3), prompt="four", seed=3),
    ]
    serial = engine.run_many(requests, "serial")
    interleaved = engine.run_many(requests, "interleaved")
    report = parity.compare(serial, interleaved, tolerance=0.0)
    assert report.passed and report.max_abs_diff == 0.0, report
    # both programs answered with their own artifacts: an image and its thought; a caption read from an image
    assert serial[0]["image"].shape == (16, 16, 1) and serial[0]["thought_text"].startswith("seven")
    assert serial[2]["thought_text"] == "one thin"  # not thinking: the prompt as written
    assert isinstance(serial[1]["caption_text"], str) and serial[3]["caption_text"].startswith("four")
    events = []
    batched = engine.run_many(requests, "batched", on_step=lambda e: events.append((e.tick, e.loop, e.index)))
    assert parity.compare(serial, batched, tolerance=parity.TOLERANCE).passed
    calls = {}  # (tick, loop) -> requests stepped: one batched call per loop group and tick
    for tick, loop, index in events:
        calls.setdefault((tick, loop), []).append(index)
    assert max(len(members) for members in calls.values()) >= 2, "requests at the same loop shared a batched step"
    ticks = {}
    for tick, loop in calls:
        ticks.setdefault(tick, set()).add(loop)
    ar_loops = {toy_mot.THINK_LOOP, toy_mot.UNDERSTAND_LOOP}
    assert any(toy_mot.IMAGE_LOOP in loops and loops & ar_loops for loops in ticks.values()), (
        "AR and denoise steps ran in the same tick, as separate groups"
    )


def test_publishing_the_transformer_drops_exactly_its_cache_entries(engine, card):
    engine.run_many(
        [
            jp.Request("bagel-mot", prompt="three", seed=0, num_steps=2),
            jp.Request(UNDERSTAND_ID, image=image(0.5), seed=0),
        ],
        "serial",
    )
    keys = engine.cache.keys()
    components = {(k.model, k.component) for k in keys}
    assert ("bagel-mot", "transformer") in components  # the prompt's text K/V
    assert {(UNDERSTAND_ID, "transformer"), (UNDERSTAND_ID, "vae")} <= components  # the image's K/V, its latents
    before = engine.versions("bagel-mot")
    versions = engine.publish("bagel-mot", {"transformer": perturbed(card["transformer"], seed=9)})
    assert versions == {**before, "transformer": before["transformer"] + 1} and versions["vae"] == before["vae"]
    left = {(k.model, k.component) for k in engine.cache.keys()}
    assert ("bagel-mot", "transformer") not in left
    assert {(UNDERSTAND_ID, "transformer"), (UNDERSTAND_ID, "vae")} <= left  # another resident: untouched


def test_bad_input_gets_clear_errors(card):
    with pytest.raises(ValueError, match=r"understanding reads an image of shape \(16, 16, 1\)"):
        jp.generate(card, [""], image=np.zeros((8, 8, 1), np.float32), program=toy_mot.understand())
    with pytest.raises(ValueError, match="at most max_prompt_words = 4"):
        jp.generate(card, "seven thick left bright dim")
    with pytest.raises(ValueError, match="takes no image here"):
        jp.generate(card, "seven", image=image(1.0))
    with pytest.raises(ValueError, match="unknown routing policy 'mixed'"):
        digit_cards.bundled_config("bagel-mot", "mixed")
