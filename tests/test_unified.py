"""The ``unified`` card: refiner LM (pretrained, bundled by reference to ``flux-t2i``) -> generator.

Card and config checks, the pretrained LM's grammar, checkpoints with a base card, and the
program the engine serves (``jp.generate``'s fused path within ``parity.TOLERANCE``; serial ==
interleaved bit for bit; batched within ``parity.TOLERANCE``).
"""

import functools
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.card import Card
from jaxpipe.cards import load_card, save_card, toy_t2i, toy_unified
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import data as digits
from jaxpipe.digits.pretrain import lm as pretrain_lm
from jaxpipe.loops import ar, registry
from jaxpipe.nn import DiTConfig, LMConfig

BUNDLED = "unified" in jp.cards.available()
needs_bundled = pytest.mark.skipif(not BUNDLED, reason="bundled unified card missing")
GENERATOR = ("text_encoder", "transformer", "vae")


def _leaves_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


def random_card(config, seed: int = 0, family=toy_unified, model_id: str = "unified") -> Card:
    """A card of ``config`` with random weights drawn by NumPy: built abstractly, so no per-parameter
    eager init (seconds on a busy CPU). Kernels ``N(0, 1/fan_in)``, norm scales and latent std
    ``1 + N(0, 0.1²)``, other vectors ``N(0, 0.05²)``: every component computes something."""
    abstract = nnx.eval_shape(lambda: family.build(config, seed=0, model_id=model_id))
    graphdef, state = nnx.split(abstract.components)
    rng = np.random.default_rng(seed)
    paths, treedef = jax.tree_util.tree_flatten_with_path(state)
    leaves = []
    for path, spec in paths:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        if name.endswith(("scale/value", "latent_std/value")):
            value = 1.0 + 0.1 * rng.standard_normal(spec.shape)
        elif len(spec.shape) < 2:
            value = 0.05 * rng.standard_normal(spec.shape)
        else:
            value = rng.standard_normal(spec.shape) / np.sqrt(np.prod(spec.shape[:-1]))
        leaves.append(jnp.asarray(value, spec.dtype))
    return Card(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves)), abstract.spec)


@pytest.fixture(scope="module")
def tiny():
    """A default-size (tiny) unified card with random weights."""
    return random_card(digit_cards.config("unified"), seed=0)


@pytest.fixture(scope="module")
def bundled():
    return jp.cards.load("unified") if BUNDLED else None


# ------------------------------------------------------------------------------------------ card and config


def test_card_builds_with_its_loops(tiny):
    spec = tiny.spec
    assert set(tiny.components) == {"text_encoder", "llm", "transformer", "vae"}
    assert spec.recipe == ("refine", "denoise")
    refine = spec.loop("refine")
    assert refine.kind == "ar_decode" and refine.binds == ("llm",)
    assert refine.config.eos_id == toy_unified.eos_id(tiny) == spec.tokenizer.vocab_size == 23
    assert tiny["llm"].cfg.vocab_size == 24
    assert spec.config.max_prompt_words == spec.config.text.max_len - refine.config.max_new_tokens
    assert "unified" in jp.cards.buildable()


def test_config_validation_names_the_problem():
    with pytest.raises(ValueError, match=r"lm.vocab_size must be the tokenizer's 23 words \+ <eos> = 24"):
        digit_cards.config("unified", lm=LMConfig(vocab_size=23))
    with pytest.raises(ValueError, match="refine.eos_id must be the LM's <eos> id 23"):
        digit_cards.config("unified", refine=ar.ARConfig(max_new_tokens=3, eos_id=5))
    with pytest.raises(ValueError, match="must leave room for a prompt"):
        digit_cards.config("unified", refine=ar.ARConfig(max_new_tokens=8, eos_id=23))
    with pytest.raises(ValueError, match=r"lm.max_len \(4\) must be >= text.max_len \(8\)"):
        digit_cards.config("unified", lm=LMConfig(vocab_size=24, max_len=4))


def test_refined_ids_maps_eos_to_pad_and_fits_the_width():
    tokens = jnp.asarray([[9, 12, 23, 0, 0, 0], [9, 12, 14, 17, 0, 0]])
    np.testing.assert_array_equal(toy_unified.refined_ids(tokens, 23, 4), [[9, 12, 0, 0], [9, 12, 14, 17]])
    np.testing.assert_array_equal(toy_unified.refined_ids(tokens[:, :3], 23, 5), [[9, 12, 0, 0, 0], [9, 12, 14, 0, 0]])


# ------------------------------------------------------------------------------------------ the pretrained LM


def _text(card, ids) -> str:
    return card.spec.tokenizer.decode(np.asarray(ids).reshape(1, -1))[0]


@functools.partial(jax.jit, static_argnums=(3,))
def _refine_jit(card, ids, keys, config):
    final, _ = ar.run(card["llm"], ar.init(card["llm"], ids, keys, config), config)
    return toy_unified.refined_ids(final.tokens, toy_unified.eos_id(card), ids.shape[1])


def _refine(card, prompts, seeds, temperature):
    """Refined prompts (text) of ``prompts``, request ``i`` keyed ``jax.random.key(seeds[i])``."""
    config = card.spec.loop("refine").config.replace(temperature=temperature)
    ids = jnp.asarray(card.spec.tokenizer.encode(prompts, card["text_encoder"].cfg.max_len))
    keys = jnp.stack([jax.random.key(s) for s in seeds])
    return [_text(card, row) for row in _refine_jit(card, ids, keys, config)]


def _canonical(text: str) -> bool:
    """A valid caption (parse_caption) whose words are in the canonical order (digit, stroke, position, brightness)."""
    try:
        labels = digits.parse_caption(text)
    except ValueError:
        return False
    return labels["motion"] is None and digits.caption(*(labels[k] for k in ("digit", *digits.ATTRIBUTES))) == text


FULL = [digits.caption(d, s, p, b) for d, s, p, b in [(7, 1, 0, 1), (3, 0, 2, 0), (0, 1, 1, 1), (9, 0, 0, 0)]]


@needs_bundled
def test_pretrained_lm_ends_full_prompts_and_continues_seven(bundled):
    words = bundled.spec.tokenizer.words
    attributes = [w for name in digits.ATTRIBUTES for w in digits.ATTRIBUTE_WORDS[name]]
    probs = pretrain_lm.next_token_probs(bundled, FULL + ["seven"])
    assert (probs[:4, -1] > 0.9).all(), probs[:4, -1]  # P(<eos> | full compositional prompt)
    seven = probs[4]
    assert sum(seven[words.index(w)] for w in attributes) > 0.8, seven
    assert all(seven[words.index(w)] > 0.02 for w in attributes), seven  # a spread, not one favourite word

    sampled = _refine(bundled, FULL + ["seven"] * 60, range(64), temperature=1.0)
    assert sampled[:4] == FULL  # nothing added to a full prompt
    valid = [t for t in sampled[4:] if t.startswith("seven") and _canonical(t)]
    assert len(valid) >= 0.9 * 60, [t for t in sampled[4:] if t not in valid]
    assert len({w for t in valid for w in t.split()[1:]}) >= 6  # most attribute words appear
    assert sum(t != "seven" for t in valid) >= 45  # it does refine
    greedy = _refine(bundled, ["seven"], [0], temperature=0.0)[0]
    assert greedy.startswith("seven ") and _canonical(greedy), greedy


# ------------------------------------------------------------------------------------------ checkpoints with a base


@needs_bundled
def test_bundled_card_stores_only_its_llm(bundled):
    meta = json.loads((jp.cards.path("unified") / "config.json").read_text())
    assert meta["base"] == "flux-t2i" and meta["base_components"] == list(GENERATOR)
    assert (jp.cards.path("unified") / "weights.safetensors").stat().st_size < 1_000_000
    flux = jp.cards.load("flux-t2i")
    for name in GENERATOR:
        assert _leaves_equal(bundled[name], flux[name]), name


@needs_bundled
def test_base_round_trip_is_bit_for_bit(bundled, tmp_path):
    save_card(bundled, tmp_path / "based", base="flux-t2i", base_components=GENERATOR)
    save_card(bundled, tmp_path / "full")
    based, full = load_card(tmp_path / "based"), load_card(tmp_path / "full")
    assert _leaves_equal(based, bundled) and _leaves_equal(full, bundled)
    assert "base" not in json.loads((tmp_path / "full" / "config.json").read_text())
    assert (tmp_path / "based" / "weights.safetensors").stat().st_size * 5 < (
        tmp_path / "full" / "weights.safetensors"
    ).stat().st_size


def test_base_errors_are_clear(tiny, tmp_path):
    generator = random_card(digit_cards.config("flux-t2i"), seed=5, family=toy_t2i, model_id="flux-t2i")
    save_card(generator, tmp_path / "base")
    card = tiny.replace(**{n: generator[n] for n in GENERATOR})
    save_card(card, tmp_path / "card", base=str(tmp_path / "base"), base_components=GENERATOR)
    assert _leaves_equal(load_card(tmp_path / "card"), card)  # bit for bit through a directory base

    with pytest.raises(ValueError, match=r"components \['transformer'\] of 'unified' differ from the base card"):
        save_card(
            tiny.replace(text_encoder=generator["text_encoder"], vae=generator["vae"]),
            tmp_path / "x",
            base=str(tmp_path / "base"),
            base_components=GENERATOR,
        )
    with pytest.raises(ValueError, match="base_components must name distinct components"):
        save_card(card, tmp_path / "x", base=str(tmp_path / "base"), base_components=("unet",))
    with pytest.raises(ValueError, match="needs base="):
        save_card(card, tmp_path / "x", base_components=GENERATOR)
    with pytest.raises(ValueError, match="cannot be its own base"):
        save_card(card, tmp_path / "base", base=str(tmp_path / "base"), base_components=GENERATOR)
    assert not (tmp_path / "x").exists()  # nothing written on an error

    # Same shapes, new weights: loads, with a warning.
    save_card(
        random_card(digit_cards.config("flux-t2i"), seed=6, family=toy_t2i, model_id="flux-t2i"), tmp_path / "base"
    )
    with pytest.warns(UserWarning, match="not the weights this card was saved with"):
        load_card(tmp_path / "card")
    # Other shapes: a clear error naming the tensor and where it came from.
    wider = digit_cards.config("flux-t2i", dit=DiTConfig(dim=32))
    save_card(random_card(wider, seed=6, family=toy_t2i, model_id="flux-t2i"), tmp_path / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"transformer/.* \(from the base card .*\) has shape"):
            load_card(tmp_path / "card")
    # A missing base.
    meta = json.loads((tmp_path / "card" / "config.json").read_text())
    (tmp_path / "card" / "config.json").write_text(json.dumps({**meta, "base": "no-such-card"}))
    with pytest.raises(FileNotFoundError, match="the base card 'no-such-card' cannot be loaded"):
        load_card(tmp_path / "card")


# ------------------------------------------------------------------------------------------ program and engine


def test_program_declares_its_nodes():
    prog = toy_unified.program()
    assert [n.name for n in prog.nodes] == ["encode_null", "refine", "refined", "encode_refined", "denoise", "decode"]
    assert [n.loop for n in prog.loops] == ["refine", "denoise"]
    assert [n.name for n in prog.cached_nodes] == ["encode_null"]  # the refined prompt is known only after refine
    assert dict(prog.outputs) == {"image": "image", "latents": "latents", "refined": "refined"}
    assert prog.inputs == ("ids", "null_ids", "key", "refine")
    assert isinstance(registry.driver("ar_decode"), ar.Driver)


def test_ar_driver_steps_equal_the_fused_run(tiny):
    loop = tiny.spec.loop("refine")
    drive = registry.driver("ar_decode")
    ids = jnp.asarray(tiny.spec.tokenizer.encode(["seven", "two left"], 8))
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])

    @jax.jit
    def both(card):
        models = card.bound("refine")
        state = ar.init(card["llm"], ids, keys, loop.config)
        fused, _ = drive.run(models, state, loop.config)
        stepped = jax.lax.fori_loop(
            0, drive.num_steps(loop.config), lambda _, s: drive.step(models, s, loop.config), state
        )
        inert = drive.step(models, drive.empty(state, 3), loop.config)
        return fused.tokens, stepped.tokens, inert, drive.deactivate(state, jnp.asarray([True, False])).done

    fused, stepped, inert, done = both(tiny)
    np.testing.assert_array_equal(stepped, fused)
    assert inert.tokens.shape == (3, 16) and bool(inert.done.all()) and not inert.tokens.any()  # inert rows stay inert
    np.testing.assert_array_equal(done, [True, False])


@pytest.fixture(scope="module")
def engine(tiny):
    engine = jp.Engine(max_batch=4)
    engine.register(tiny)
    return engine


REQUESTS = [("seven", 0, 2), ("three thin", 1, 2), ("one", 2, 2)]  # one num_steps: fewer compiles


@pytest.fixture(scope="module")
def serial(engine):
    return engine.run_many([jp.Request("unified", prompt=p, seed=s, num_steps=n) for p, s, n in REQUESTS])


def test_engine_equals_the_fused_path_within_c3(serial, tiny):
    for out, (prompt, seed, steps) in zip(serial, REQUESTS):
        fused = jp.generate(tiny, prompt, seed=seed, num_steps=steps)
        np.testing.assert_allclose(out["image"], fused["image"][0], atol=parity.TOLERANCE)
        np.testing.assert_array_equal(out["refined"], fused["refined"][0])  # the same words
        assert out["text"] == prompt and fused["text"] == [prompt]
        assert out["latents"].shape == (1, 8, 8, 4) and out["refined"].shape == (8,)


def test_refine_false_renders_the_prompt_as_written_with_the_same_noise(tiny):
    """What group rollouts (skip rows) and evaluation ("original") use: the program, refine off."""
    as_written = jp.generate(tiny, ["seven", "one thin"], seed=3, num_steps=2, inputs={"refine": False})
    np.testing.assert_array_equal(as_written["refined"], tiny.spec.tokenizer.encode(["seven", "one thin"], 8))
    t2i = jp.generate(tiny, ["seven", "one thin"], seed=3, num_steps=2, program=_t2i_with_stream_one())
    np.testing.assert_allclose(as_written["image"], t2i["image"], atol=parity.TOLERANCE)


@functools.cache
def _t2i_with_stream_one():
    """A text-to-image program over the unified card's generator with its denoise key (``fold_in(key, 1)``)."""
    from jaxpipe.cards import generator
    from jaxpipe.program import ComponentNode, LoopNode, Program

    return Program(
        "t2i-stream-1",
        ("ids", "null_ids", "key"),
        (
            *generator.text_nodes(),
            LoopNode("denoise", generator.start_denoise(stream=1), reads=generator.DENOISE_READS, writes=("latents",)),
            ComponentNode("decode", generator.decode_image, reads=("latents",), writes=("image",), component="vae"),
        ),
        (("image", "image"),),
        lambda card, request: generator.bind_text(card, request, "denoise"),
    )


@pytest.mark.slow  # ~12 s: by default test_parity holds the bundled unified card to C1
def test_serial_equals_interleaved_and_batched_within_tolerance(engine, serial):
    requests = [jp.Request("unified", prompt=p, seed=s, num_steps=n) for p, s, n in REQUESTS]
    interleaved = engine.run_many(requests, mode="interleaved")
    assert parity.compare(serial, interleaved, tolerance=0.0).passed
    batched = engine.run_many(requests, mode="batched")
    report = parity.compare(serial, batched, tolerance=parity.TOLERANCE)
    assert report.passed, report
    for s, b in zip(serial, batched):
        np.testing.assert_array_equal(s["refined"], b["refined"])


def test_engine_refuses_a_prompt_too_long_to_refine(engine, tiny):
    limit = tiny.spec.config.max_prompt_words
    with pytest.raises(ValueError, match=f"at most max_prompt_words = {limit}"):
        engine.run(jp.Request("unified", prompt="seven thick left bright moving up", seed=0))
    with pytest.raises(ValueError, match="at least one word"):
        engine.run(jp.Request("unified", prompt="", seed=0))
    with pytest.raises(ValueError, match="temperature must be"):
        engine.run(jp.Request("unified", prompt="seven", inputs={"temperature": -1.0}))


@needs_bundled
def test_the_engine_serves_the_bundled_card():
    engine = jp.Engine()  # Engine.default() serves it too: test_parity's bundled run
    engine.register(jp.cards.load("unified"))
    assert engine.program("unified") is toy_unified.program()
    out = engine.run(jp.Request("unified", prompt="seven", seed=3, num_steps=2, guidance=1.0))
    refined = _text(engine.card("unified"), out["refined"])
    assert refined.startswith("seven") and _canonical(refined), refined
    assert out["image"].shape == (16, 16, 1)
