"""The ``multi-expert`` card: N refiners stored stacked, its program, per-expert versions and weight sync.

Card construction (any N, abstractly at a large size), expert slices, composing, slot
restriction, checkpoints; the engine's output equals ``jp.generate``'s within C3; each published
expert bumps only its own version, the text encoder keeps ``v0`` and its cache entries; weight
sync publishes only the experts that changed; bad publishes change nothing.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaves_equal
from flax import nnx

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.cards import generator, load_card, save_card, toy_multi_expert
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits.data import ATTRIBUTE_WORDS
from jaxpipe.engine import Engine, EngineError, UnknownComponentError
from jaxpipe.nn import LMConfig, RefinerLM
from jaxpipe.training import weight_sync

MODEL = "multi-expert"
N = 3
V0 = {"text_encoder": 0, "refiner_0": 0, "refiner_1": 0, "refiner_2": 0, "transformer": 0, "vae": 0}


def words(card, ids) -> str:
    return card.spec.tokenizer.decode(np.asarray(ids).reshape(1, -1))[0]


def served_by_a_fresh_engine(card, prompt, seed):
    """The image a fresh engine serving ``card`` renders (the engine's own path, bit for bit)."""
    engine = Engine()
    engine.register(card)
    return engine.run(jp.Request(MODEL, prompt=prompt, seed=seed, num_steps=2))["image"]


def with_expert(card, i, lm):
    """``card`` with refiner ``i`` replaced by ``lm``."""
    lms = [lm if j == i else toy_multi_expert.expert(card, j) for j in range(card.spec.config.num_refiners)]
    return card.replace(refiners=toy_multi_expert.stack(lms))


@pytest.fixture(scope="module")
def built():
    return jp.cards.build(MODEL, config=digit_cards.config("multi-expert", num_refiners=N))


def noisy(module, seed, scale=0.05):
    """``conftest.perturbed`` with the noise drawn and added by NumPy: no per-leaf-shape compiles."""
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    rng = np.random.default_rng(seed)
    add = lambda p: jnp.asarray(np.asarray(p) + scale * rng.standard_normal(p.shape).astype(p.dtype))
    return nnx.merge(graphdef, jax.tree.map(add, params), rest)


@pytest.fixture(scope="module")
def card(built):
    """Non-trivial weights: the transformer (adaLN-zero) and every refiner perturbed, each expert differently."""
    return built.replace(transformer=noisy(built["transformer"], 1), refiners=noisy(built["refiners"], 2, 0.5))


@pytest.fixture()
def engine(card):
    engine = Engine(max_batch=4)
    engine.register(card)
    return engine


def request(prompt="seven", seed=0, steps=2):
    return jp.Request(MODEL, prompt=prompt, seed=seed, num_steps=steps)


# ---- the card ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 4])
def test_builds_for_any_number_of_refiners(built, n):
    card = (
        built
        if n == N
        else nnx.eval_shape(lambda: jp.cards.build(MODEL, config=digit_cards.config("multi-expert", num_refiners=n)))
    )
    assert set(card.components) == {"text_encoder", "refiners", "transformer", "vae"}
    assert toy_multi_expert.expert_names(card) == tuple(f"refiner_{i}" for i in range(n))
    assert jp.cards.stacked_components(card) == {"refiners": toy_multi_expert.expert_names(card)}
    assert all(x.shape[0] == n for x in jax.tree.leaves(card["refiners"]))
    assert card.spec.recipe == ("refine", "denoise") and card.spec.loop("refine").binds == ("refiners",)
    assert card.spec.config.max_prompt_words == card.spec.config.text.max_len - n


def test_constructs_abstractly_at_a_large_size():
    # wide rather than deep: tracing cost grows with the number of parameters, not their size
    base = digit_cards.bundled_config("multi-expert", num_refiners=1)
    config = digit_cards.bundled_config(
        "multi-expert",
        num_refiners=8,
        text=dataclasses.replace(base.text, max_len=32),
        lm=LMConfig(vocab_size=base.lm.vocab_size, dim=4096, depth=2, heads=32, max_len=64),
        dit=dataclasses.replace(base.dit, dim=2048, heads=16),
    )
    card = nnx.eval_shape(lambda: jp.cards.build("multi-expert", config=config))
    assert card["refiners"].blocks[0].mlp.fc1.kernel.shape == (8, 4096, 16384)
    assert card.num_params() > 8 * 2 * 12 * 4096**2  # eight 2-layer LMs of width 4096 (~400M each)


def test_expert_is_the_unstacked_lm(built):
    config = built.spec.config
    for i in range(N):
        assert leaves_equal(toy_multi_expert.expert(built, i), RefinerLM(config.lm, rngs=nnx.Rngs(1 + i)))
    assert not leaves_equal(toy_multi_expert.expert(built, 0), toy_multi_expert.expert(built, 1))
    assert leaves_equal(
        toy_multi_expert.stack([toy_multi_expert.expert(built, i) for i in range(N)]), built["refiners"]
    )
    with pytest.raises(IndexError, match="out of range for 3"):
        toy_multi_expert.expert(built, N)


def test_compose_orders_by_expert_and_drops_eos():
    eos = 9
    ids = jnp.array([[5, 6, 0, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0, 0]])
    # (N=3, B=2, T=4): buffers hold the prompt, then each expert's generated tokens
    tokens = jnp.array(
        [
            [[5, 6, 1, eos], [7, 1, 2, 0]],
            [[5, 6, eos, 0], [7, 3, 0, 0]],
            [[5, 6, 4, 2], [7, eos, 0, 0]],
        ]
    )
    prompt_lengths = jnp.array([[2, 1]] * 3)
    generated = (jnp.arange(4) >= prompt_lengths[..., None]) & (tokens != 0)
    out = toy_multi_expert.compose(ids, tokens, generated, eos, 7)
    np.testing.assert_array_equal(out, [[5, 6, 1, 4, 2, 0, 0], [7, 1, 2, 3, 0, 0, 0]])
    assert toy_multi_expert.compose(ids, tokens, generated, eos, 3).shape == (2, 3)


def test_each_refiner_says_only_its_slot(card):
    config = card.spec.config
    ids = generator.tokenize(card, ["seven"] * 32)
    keys = jax.random.split(jax.random.key(0), 32)
    settings = (("refine", card.spec.loop("refine").config.replace(temperature=2.0)),)
    node = next(n for n in toy_multi_expert.program().nodes if n.name == "refine")
    out = jax.jit(lambda c, i, k: node(c, {"ids": i, "key": k}, settings))(card, ids, keys)
    refinements = toy_multi_expert.expert_major(out["refinements"])
    assert refinements.tokens.shape == (N, 32, 16) and refinements.log_prob.shape == (N, 32, 16)
    words = card.spec.tokenizer.words
    emitted = np.asarray(refinements.tokens)[:, :, 1]  # one new token after the one-word prompt
    eos = card.spec.tokenizer.vocab_size
    for i in range(N):
        allowed = {words.index(w) for w in ATTRIBUTE_WORDS[config.slot(i)]} | {eos}
        assert set(emitted[i].tolist()) <= allowed, (i, config.slot(i))
        assert set(emitted[i].tolist()) - {eos}  # the slot's words are actually said
    assert np.asarray(config.allowed_tokens()).sum(axis=1).tolist() == [
        len(ATTRIBUTE_WORDS[config.slot(i)]) + 1 for i in range(N)
    ]


def test_checkpoint_round_trip(card, tmp_path):
    loaded = load_card(save_card(card, tmp_path / "me"))
    assert loaded.spec == card.spec and set(loaded.components) == set(card.components)
    assert leaves_equal(loaded.components, card.components)


# ---- the engine ----------------------------------------------------------------------------

REQUESTS = [("seven", 0), ("three thin", 1)]


@pytest.mark.slow  # the bundled multi-expert card's fused path is checked against the engine in test_parity.py
def test_engine_equals_the_fused_path_within_c3(engine, card):
    outs = engine.run_many([request(p, s) for p, s in REQUESTS])
    for out, (prompt, seed) in zip(outs, REQUESTS):
        fused = jp.generate(card, prompt, seed=seed, num_steps=2)
        np.testing.assert_allclose(out["image"], fused["image"][0], atol=parity.TOLERANCE)
        np.testing.assert_array_equal(out["refined"], fused["refined"][0])  # the same composed words
        assert out["text"] == prompt
        assert out["latents"].shape == (1, 8, 8, 4) and out["refined"].shape == (8,)
    assert any(words(card, o["refined"]) != p for o, (p, _) in zip(outs, REQUESTS))
    with pytest.raises(ValueError, match="max_prompt_words = 5"):
        engine.run(request("seven thick left bright dim dim"))


def test_versions_per_expert_and_the_text_encoder_cache_survives(engine, card):
    assert engine.versions(MODEL) == V0
    assert engine.experts(MODEL) == {"refiners": ("refiner_0", "refiner_1", "refiner_2")}
    before = engine.run(request())
    keys = engine.cache.keys()
    assert sorted((k.component, k.version) for k in keys) == [("refiners", 0)] * 2 + [("text_encoder", 0)] * 2
    engine.run(request())
    assert (engine.cache.stats().misses, engine.cache.stats().hits) == (4, 4)  # the second run hits all four

    lm = noisy(toy_multi_expert.expert(card, 1), 3, 1e-3)  # moves the weights, not the words
    assert engine.publish(MODEL, {"refiner_1": lm}) == {**V0, "refiner_1": 1}
    assert engine.versions(MODEL) == {**V0, "refiner_1": 1}
    assert [k for k in engine.cache.keys() if k.component == "text_encoder"] == [
        k for k in keys if k.component == "text_encoder"
    ]
    assert not [k for k in engine.cache.keys() if k.component == "refiners"]  # only the refiners' entries went
    served = engine.card(MODEL)
    assert leaves_equal(toy_multi_expert.expert(served, 1), lm)
    for i in (0, 2):  # the other slices are untouched
        assert leaves_equal(toy_multi_expert.expert(served, i), toy_multi_expert.expert(card, i))
    assert all(served[n] is card[n] for n in ("text_encoder", "transformer", "vae"))

    stats = engine.cache.stats()
    after = engine.run(request())
    new = engine.cache.stats()
    assert new.misses - stats.misses == 2 and new.hits - stats.hits == 2  # refine + compose redone; both encodings hit
    np.testing.assert_array_equal(after["refined"], before["refined"])
    np.testing.assert_array_equal(after["image"], served_by_a_fresh_engine(with_expert(card, 1, lm), "seven", 0))
    assert {(k.component, k.version) for k in engine.cache.keys()} == {("text_encoder", 0), ("refiners", 1)}

    assert engine.publish(MODEL, {"refiners": card["refiners"]}) == {
        **V0,
        "refiner_0": 1,
        "refiner_1": 2,
        "refiner_2": 1,
    }
    assert leaves_equal(engine.card(MODEL)["refiners"], card["refiners"])
    engine.register(card, replace=True)
    assert engine.versions(MODEL) == {**{n: 1 for n in V0}, "refiner_0": 2, "refiner_1": 3, "refiner_2": 2}


def test_publish_an_expert_during_a_run_drains_then_swaps(engine, card):
    lm = noisy(toy_multi_expert.expert(card, 2), 4, 0.5)
    new_card = with_expert(card, 2, lm)
    seen = {}

    def on_step(event):
        if event.index == 0 and event.step == 1:
            seen["returned"] = engine.publish(MODEL, {"refiner_2": lm})
            seen["versions"] = engine.versions(MODEL)
            seen["pending"] = leaves_equal(toy_multi_expert.expert(engine.card(MODEL, pending=True), 2), lm)

    outs = engine.run_many([request("seven", 0), request("seven", 1)], "serial", on_step=on_step)
    assert seen == {"returned": {**V0, "refiner_2": 1}, "versions": V0, "pending": True}
    assert engine.versions(MODEL) == {**V0, "refiner_2": 1}
    np.testing.assert_array_equal(outs[0]["image"], served_by_a_fresh_engine(card, "seven", 0))
    np.testing.assert_array_equal(outs[1]["image"], served_by_a_fresh_engine(new_card, "seven", 1))


def test_weight_sync_publishes_only_the_changed_experts(engine, card):
    assert weight_sync.changed_components(engine, card) == ()
    assert weight_sync.publish(engine, card) == V0
    trained = with_expert(card, 2, noisy(toy_multi_expert.expert(card, 2), 5))
    assert weight_sync.changed_components(engine, trained) == ("refiner_2",)
    assert weight_sync.publish(engine, trained) == {**V0, "refiner_2": 1}
    assert weight_sync.publish(engine, trained) == {**V0, "refiner_2": 1}  # already served: no second bump
    assert leaves_equal(engine.card(MODEL)["refiners"], trained["refiners"])

    both = with_expert(trained, 0, noisy(toy_multi_expert.expert(card, 0), 6))
    both = both.replace(transformer=noisy(card["transformer"], 7))
    assert weight_sync.changed_components(engine, both) == ("refiner_0", "transformer")
    assert weight_sync.publish(engine, both) == {**V0, "refiner_0": 1, "refiner_2": 1, "transformer": 1}
    # named experts are published even when equal
    assert weight_sync.publish(engine, both, "refiner_1") == {
        **V0,
        "refiner_0": 1,
        "refiner_1": 1,
        "refiner_2": 1,
        "transformer": 1,
    }
    with pytest.raises(UnknownComponentError, match=r"refiner_7.*experts \['refiner_0'"):
        weight_sync.publish(engine, both, ("refiner_7",))


def test_bad_publish_raises_and_changes_nothing(engine, card):
    engine.run(request())
    before = engine.versions(MODEL), engine.card(MODEL).components, engine.cache.keys()
    lm = toy_multi_expert.expert(card, 1)
    leaves, treedef = jax.tree.flatten(lm)
    wrong_shape = jax.tree.unflatten(treedef, [leaves[0][..., :-1], *leaves[1:]])
    four = toy_multi_expert.stack([lm] * 4)

    with pytest.raises(
        UnknownComponentError,
        match=r"\['refiner_7'\].*stacked 'refiners' has experts \['refiner_0', 'refiner_1', 'refiner_2'\]",
    ):
        engine.publish(MODEL, {"refiner_7": lm})
    with pytest.raises(UnknownComponentError):  # nothing applies when any name is unknown
        engine.publish(MODEL, {"refiner_1": lm, "refiner_7": lm})
    with pytest.raises(EngineError, match=r"expert 'refiner_1' \(slice 1 of stacked 'refiners'\): leaf .* has shape"):
        engine.publish(MODEL, {"refiner_1": wrong_shape})
    with pytest.raises(EngineError, match="expert 'refiner_1'.*has shape"):
        engine.publish(MODEL, {"refiner_1": card["refiners"]})  # the stacked module is not one expert
    with pytest.raises(EngineError, match="component 'refiners'.*has shape"):
        engine.publish(MODEL, {"refiners": four})
    with pytest.raises(EngineError, match="expected a RefinerLM"):
        engine.publish(MODEL, {"refiner_0": card["vae"]})
    with pytest.raises(EngineError, match="published both whole and by expert"):
        engine.publish(MODEL, {"refiners": card["refiners"], "refiner_1": lm})
    with pytest.raises(EngineError, match="has shape"):  # a trained card of another N
        weight_sync.publish(engine, card.replace(refiners=four))
    assert (engine.versions(MODEL), engine.card(MODEL).components, engine.cache.keys()) == before


def test_register_rejects_a_stacked_component_of_the_wrong_size(card):
    bad = jp.Card(
        {**card.components, "refiners": toy_multi_expert.stack([toy_multi_expert.expert(card, 0)] * 2)}, card.spec
    )
    engine = Engine()
    with pytest.raises(EngineError, match="3 experts, but leaves of shape \\(2,"):
        engine.register(bad)
    assert not engine.serves(MODEL)
