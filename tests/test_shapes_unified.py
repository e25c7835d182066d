"""``shapes-unified``: the shapes world's refiner LM in front of ``shapes-t2i``'s generator (stored by reference).

It loads with exactly ``shapes-t2i``'s generator, its LM has learnt the caption grammar (it ends the prompts
nothing can follow and continues partial ones), it renders, and with ``refine`` off it draws what
``shapes-t2i`` draws from the same noise. The recipe reproduces its weights bit for bit (slow tier).
"""

import dataclasses
import functools
import json

import jax
import numpy as np
import pytest
from flax import nnx

import jaxpipe as jp
from jaxpipe.cards import generator, toy_t2i
from jaxpipe.program import ComponentNode, LoopNode, Program
from jaxpipe.shapes import cards, grammar, refiner

pytestmark = pytest.mark.skipif(
    not {"shapes-t2i", "shapes-unified"} <= set(jp.cards.available()), reason="bundled cards missing"
)

PROMPTS = [
    "a blue square and a yellow triangle",
    "three green circles",
    "a red circle left of a blue triangle",
    "a red circle",
]


@pytest.fixture(scope="module")
def card():
    return jp.cards.load("shapes-unified")


def test_the_card_is_shapes_t2i_s_generator_plus_a_refiner(card):
    t2i = jp.cards.load("shapes-t2i")
    config = card.spec.config
    for field in dataclasses.fields(toy_t2i.Config):  # text encoder, DiT, autoencoder, served sampling, vocabulary
        assert getattr(config, field.name) == getattr(t2i.spec.config, field.name), field.name
    for name in refiner.BASE_COMPONENTS:  # bit for bit (NumPy: one comparison per leaf without a dispatch each)
        mine, theirs = jax.tree.leaves(nnx.state(card[name])), jax.tree.leaves(nnx.state(t2i[name]))
        assert len(mine) == len(theirs) and all(
            np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(mine, theirs)
        ), name
    shipped = json.loads((jp.cards.path("shapes-unified") / "config.json").read_text())
    assert shipped["base"] == "shapes-t2i" and sorted(shipped["base_components"]) == sorted(refiner.BASE_COMPONENTS)
    # every GenEval prompt of the grammar fits: the longest image prompt has 8 words (a relation), 9 are allowed
    longest = max(
        len(p.text.split())
        for c in grammar.CATEGORIES
        for split in grammar.SPLITS
        for p in grammar.prompt_set(c, 24, split=split)
    )
    assert longest == 8 and config.max_prompt_words == cards.MAX_WORDS - 3 == 9


def test_the_lm_ends_complete_prompts_and_continues_partial_ones(card):
    """Measured (pretrain.json): p(<eos>) ≥ 0.99 after the test prompts nothing can follow (two things, a relation, a
    count); ~0.3 after a one-object prompt, which also starts every two-thing prompt. Floors well below."""
    eos = refiner.eos_on_test_prompts(card, prompts=8)
    for category in ("two_object", "counting", "position", "color_attr"):
        assert eos[category] > 0.9, eos
    assert 0.1 < eos["colors"] < 0.7, eos  # the grammar's ambiguity, not a failure: "a red circle" may go on
    words = card.spec.tokenizer.words + ("<eos>",)
    probs = refiner.next_token_probs(card, ["a red", "a red circle left", "three"])
    assert words[int(np.argmax(probs[0]))] in grammar.SHAPES and words[int(np.argmax(probs[1]))] == "of"
    assert words[int(np.argmax(probs[2]))] in grammar.COLOURS


@functools.cache
def _t2i_on_stream_one() -> Program:
    """``shapes-t2i``'s program with the unified denoise loop's noise (``fold_in(key, 1)``: the LM draws from stream 0)."""
    return Program(
        "t2i-stream-1",
        ("ids", "null_ids", "key"),
        (
            *generator.text_nodes(),
            LoopNode(
                toy_t2i.LOOP_ID, generator.start_denoise(stream=1), reads=generator.DENOISE_READS, writes=("latents",)
            ),
            ComponentNode("decode", generator.decode_image, reads=("latents",), writes=("image",), component="vae"),
        ),
        (("image", "image"),),
        lambda card, request: generator.bind_text(card, request, toy_t2i.LOOP_ID),
    )


def test_it_renders_its_refinement_and_with_refine_off_the_prompt_as_written(card):
    refined = jp.generate(card, PROMPTS, seed=3, num_steps=1)
    assert refined["image"].shape == (4, 32, 32, 3)
    for prompt, text in zip(PROMPTS, refined["refined_text"]):
        assert text.split()[: len(prompt.split())] == prompt.split()  # the refiner appends, never rewrites
    assert refined["refined_text"][:3] == PROMPTS[:3]  # nothing follows two things, a count or a relation: <eos>
    as_written = jp.generate(card, PROMPTS, seed=3, num_steps=1, inputs={"refine": False})  # the same compiled program
    assert as_written["refined_text"] == PROMPTS
    np.testing.assert_array_equal(as_written["image"][:3], refined["image"][:3])  # the same words, the same noise


@pytest.mark.slow  # two more programs to compile (~11 s)
def test_refine_off_draws_what_shapes_t2i_draws_from_the_same_noise(card):
    """Not from the same seed: the unified program draws its LM from ``fold_in(key, 0)`` and its denoiser from
    ``fold_in(key, 1)``, where ``shapes-t2i``'s program uses the key itself (measured: the images differ by up to ~1)."""
    as_written = jp.generate(card, PROMPTS, seed=3, num_steps=2, inputs={"refine": False})
    t2i = jp.generate("shapes-t2i", PROMPTS, seed=3, num_steps=2, program=_t2i_on_stream_one())
    np.testing.assert_allclose(as_written["image"], t2i["image"], atol=1e-5)
    plain = jp.generate("shapes-t2i", PROMPTS, seed=3, num_steps=2)
    assert float(np.abs(plain["image"] - as_written["image"]).max()) > 0.1


@pytest.mark.slow  # two tiny runs of the recipe (~1 min): the same seed gives the same bits, and the CLI refuses bad flags
def test_the_recipe_reproduces_its_lm_bit_for_bit(tmp_path):
    tiny = refiner.RefinerPretrainConfig(steps=3, batch_size=8)
    first = refiner.pretrain_refiner(tmp_path / "a", tiny, progress=False)
    refiner.pretrain_refiner(tmp_path / "b", tiny, progress=False)
    assert (tmp_path / "a" / "weights.safetensors").read_bytes() == (
        tmp_path / "b" / "weights.safetensors"
    ).read_bytes()
    report = json.loads((tmp_path / "a" / "pretrain.json").read_text())
    assert (
        report["command"].startswith("python -m jaxpipe.shapes.pretrain shapes-unified")
        and report["settings"]["steps"] == 3
    )
    assert first.num_params() == jp.cards.load("shapes-unified").num_params()
    with pytest.raises(SystemExit):
        from jaxpipe.shapes import pretrain

        pretrain.main(["shapes-unified", "--out", str(tmp_path / "c"), "--steps", "0"])
