"""The feature cache: K samples of one prompt encode once; weight versions invalidate only their own entries."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.cache import CacheKey, FeatureCache, content_hash
from jaxpipe.engine import Engine


@pytest.fixture()
def engine(t2i_card, i2v_card):
    engine = Engine(max_batch=4)
    engine.register(t2i_card)
    engine.register(i2v_card)
    return engine


def group(prompt, k, steps=2):
    return [jp.Request("flux-t2i", prompt=prompt, seed=s, num_steps=steps) for s in range(k)]


@pytest.mark.parametrize("mode", ["serial", pytest.param("batched", marks=pytest.mark.slow)])
def test_k_samples_of_one_prompt_encode_once(engine, mode):
    outs = engine.run_many(group("seven thick", 4), mode)
    stats = engine.cache.stats()
    # misses: the prompt once and the empty (CFG) prompt once; every other lookup hits
    assert (stats.misses, stats.hits, stats.entries) == (2, 6, 2)
    assert {k.component for k in engine.cache.keys()} == {"text_encoder"}
    assert all(k.model == "flux-t2i" and k.version == 0 for k in engine.cache.keys())
    assert float(jnp.abs(outs[0]["image"] - outs[1]["image"]).max()) > 1e-3  # different seeds, one encoding
    engine.run_many(group("one thin", 2), mode)
    assert engine.cache.stats().misses == 3  # a new prompt: one more encoding; the empty prompt is shared


def test_cached_and_uncached_runs_give_the_same_bits(engine, t2i_card):
    first = engine.run(group("seven thick", 1)[0])  # miss: encodes
    second = engine.run(group("seven thick", 1)[0])  # hit
    np.testing.assert_array_equal(first["image"], second["image"])
    np.testing.assert_allclose(
        first["image"], jp.generate(t2i_card, "seven thick", num_steps=2)["image"][0], atol=parity.TOLERANCE
    )


def test_publishing_a_component_invalidates_only_its_entries(engine, t2i_card):
    engine.run_many(group("seven thick", 2))
    engine.run(jp.Request("wan-i2v", prompt="seven still", num_steps=2, image=jnp.zeros((16, 16, 1))))
    assert {(k.model, k.version) for k in engine.cache.keys()} == {("flux-t2i", 0), ("wan-i2v", 0)}
    before = engine.run(group("seven thick", 1)[0])

    # new DiT weights: the text encoder's entries stay valid and keep hitting
    engine.publish("flux-t2i", {"transformer": perturbed(t2i_card["transformer"], seed=5)})
    assert engine.versions("flux-t2i") == {"text_encoder": 0, "transformer": 1, "vae": 0}
    misses = engine.cache.stats().misses
    engine.run(group("seven thick", 1)[0])
    assert engine.cache.stats().misses == misses and len(engine.cache) == 4

    # new text-encoder weights: only flux-t2i's text-encoder entries go; wan-i2v's stay
    engine.publish("flux-t2i", {"text_encoder": perturbed(t2i_card["text_encoder"], seed=6, scale=0.5)})
    assert engine.versions("flux-t2i") == {"text_encoder": 1, "transformer": 1, "vae": 0}
    assert {(k.model, k.version) for k in engine.cache.keys()} == {("wan-i2v", 0)}
    after = engine.run(group("seven thick", 1)[0])
    assert engine.cache.stats().misses == misses + 2  # re-encoded under version 1
    assert {k.version for k in engine.cache.keys() if k.model == "flux-t2i"} == {1}
    assert float(jnp.abs(after["image"] - before["image"]).max()) > 1e-3


def test_feature_cache_unit():
    cache = FeatureCache(max_entries=2)
    digest = content_hash("encode_text", {"ids": np.array([[1, 2]])})
    assert digest == content_hash("encode_text", {"ids": np.array([[1, 2]])})
    assert digest != content_hash("encode_text", {"ids": np.array([[1, 3]])})
    assert digest != content_hash("encode_null", {"ids": np.array([[1, 2]])})
    a, b, c = (CacheKey("m", comp, 0, digest) for comp in ("text", "vae", "lm"))
    cache.put(a, 1)
    cache.put(b, 2)
    assert cache.get(a) == 1 and cache.get(CacheKey("m", "text", 1, digest)) is None  # other version: miss
    cache.put(c, 3)  # evicts b, the least recently used
    assert b not in cache and a in cache and cache.stats().evicted == 1
    assert cache.invalidate("m", ["text"]) == 1 and list(cache.keys()) == [c]
    assert cache.stats().hits == 1 and cache.stats().misses == 1
