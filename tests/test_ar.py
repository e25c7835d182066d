"""The AR loop and the refiner LM: KV cache == uncached forward, greedy/sampling determinism,
captured log-probs == teacher-forced recomputation (C2), EOS masking, batch invariance, jit,
config validation, abstract construction of a large LM."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxpipe.digits.words import VOCABULARY
from jaxpipe.loops import ar
from jaxpipe.loops.ar import ARConfig
from jaxpipe.nn.lm import LMConfig, RefinerLM
from jaxpipe.nn.text import Tokenizer

TOK = Tokenizer(VOCABULARY)
PROMPTS = ["seven", "one thin left", "three bright"]
WIDTH = 4


@pytest.fixture(scope="module")
def lm():
    return RefinerLM(LMConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0))


def prompt_ids(prompts=PROMPTS, width=WIDTH):
    return jnp.asarray(TOK.encode(prompts, width))


def keys(*seeds):
    return jnp.stack([jax.random.key(s) for s in seeds])


@functools.partial(jax.jit, static_argnames=("config", "capture"))
def generate(model, ids, request_keys, config, capture=True):
    return ar.run(model, ar.init(model, ids, request_keys, config), config, capture=capture)


@functools.partial(jax.jit, static_argnames="config")
def start(model, ids, request_keys, config):
    return ar.init(model, ids, request_keys, config)


@jax.jit
def forward(model, ids, mask=None):
    return model(ids, mask)


@jax.jit
def prefill(model, ids, lengths):
    return model.prefill(ids, lengths, model.init_cache(ids.shape[0]))


@jax.jit
def recompute(model, state):
    mask = ar.generated_mask(state.prompt_length, state.length, state.tokens.shape[1])
    return ar.sequence_log_probs(model, state.tokens, state.prompt_length, mask), mask


def test_cached_decoding_equals_uncached_forward(lm):
    ids = jax.random.randint(jax.random.key(1), (3, lm.cfg.max_len), 2, TOK.vocab_size)
    lengths = jnp.array([3, 5, 1])
    full = forward(lm, ids)
    logits, cache = prefill(lm, ids[:, :5] * (jnp.arange(5) < lengths[:, None]), lengths)
    rows = jnp.arange(3)
    np.testing.assert_allclose(logits, full[rows, lengths - 1], atol=1e-5)
    decode = jax.jit(lm.decode_step)
    position = lengths
    for _ in range(lm.cfg.max_len - 5):
        logits, cache = decode(ids[rows, position], position, cache)
        np.testing.assert_allclose(logits, full[rows, position], atol=1e-5)
        position = position + 1


def test_padding_does_not_change_valid_logits(lm):
    ids = prompt_ids(width=8)
    noisy = jnp.where(ids == 0, 5, ids)
    mask = ids != 0
    clean, dirty = forward(lm, ids, mask), forward(lm, noisy, mask)
    np.testing.assert_allclose(jnp.where(mask[..., None], clean, 0), jnp.where(mask[..., None], dirty, 0), atol=1e-6)


def test_greedy_is_deterministic_and_matches_uncached_argmax(lm):
    config = ARConfig(max_new_tokens=6, temperature=0.0)
    a, rec = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    b, _ = generate(lm, prompt_ids(), keys(5, 6, 7), config)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert bool(jnp.all(rec.valid)) and bool(jnp.all(a.done))
    np.testing.assert_array_equal(a.length - a.prompt_length, 6)
    full = forward(lm, a.tokens, ar.generated_mask(jnp.zeros(3, jnp.int32), a.length, a.tokens.shape[1]))
    for t in range(6):
        pos = rec.position[t]
        np.testing.assert_array_equal(rec.token[t], jnp.argmax(full[jnp.arange(3), pos - 1], axis=-1))


def test_same_key_same_sample_other_key_other_sample(lm):
    config = ARConfig(max_new_tokens=8, temperature=1.0)
    a, _ = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    b, _ = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    c, _ = generate(lm, prompt_ids(), keys(3, 4, 5), config)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    # The same key in another slot of the batch gives the same request.
    d, _ = generate(lm, prompt_ids(PROMPTS[::-1]), keys(2, 1, 0), config)
    np.testing.assert_array_equal(a.tokens, d.tokens[::-1])


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_captured_log_probs_equal_recomputation(lm, temperature):
    config = ARConfig(max_new_tokens=8, temperature=temperature)
    state, rec = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    recomputed, mask = recompute(lm, state)
    captured = ar.scatter_steps(rec.log_prob, rec, state.tokens.shape[1])
    np.testing.assert_array_equal(mask, ar.scatter_steps(jnp.ones_like(rec.log_prob), rec, mask.shape[1]) > 0)
    np.testing.assert_allclose(jnp.exp(recomputed - captured), 1.0, atol=1e-5)
    assert bool(jnp.all(jnp.where(mask, captured, -1.0) < 0))


def test_eos_masking_and_ratio_after_early_stop(lm):
    free, free_rec = generate(lm, prompt_ids(), keys(0, 1, 2), ARConfig(max_new_tokens=8))
    eos = int(free_rec.token[1, 0])  # request 0 emits it at step 1 (or earlier)
    config = ARConfig(max_new_tokens=8, eos_id=eos)
    state, rec = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    stop = int(np.argmax(np.asarray(rec.token[:, 0]) == eos))
    assert stop <= 1
    np.testing.assert_array_equal(rec.valid[: stop + 1, 0], True)
    np.testing.assert_array_equal(rec.valid[stop + 1 :, 0], False)
    np.testing.assert_array_equal(rec.token[stop + 1 :, 0], 0)
    np.testing.assert_array_equal(rec.log_prob[stop + 1 :, 0], 0.0)
    assert int(state.length[0]) == int(state.prompt_length[0]) + stop + 1 and bool(state.done[0])
    np.testing.assert_array_equal(state.tokens[0, int(state.length[0]) :], 0)
    # Until its EOS, request 0 is the same as without EOS; every valid token after an EOS is impossible.
    np.testing.assert_array_equal(rec.token[: stop + 1, 0], free_rec.token[: stop + 1, 0])
    tokens, valid = np.asarray(rec.token), np.asarray(rec.valid)
    for b in range(3):
        hits = np.flatnonzero(tokens[:, b] == eos)
        if hits.size:
            assert not valid[hits[0] + 1 :, b].any()
    recomputed, mask = recompute(lm, state)
    captured = ar.scatter_steps(rec.log_prob, rec, state.tokens.shape[1])
    assert int(mask[0].sum()) == stop + 1
    np.testing.assert_allclose(jnp.exp(recomputed - captured), 1.0, atol=1e-5)


def test_mixed_prompt_lengths_equal_each_alone(lm):
    config = ARConfig(max_new_tokens=6, temperature=1.0)
    batch, batch_rec = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    for i, prompt in enumerate(PROMPTS):
        alone, rec = generate(lm, prompt_ids([prompt]), keys(i), config)
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[i])
        np.testing.assert_allclose(rec.log_prob[:, 0], batch_rec.log_prob[:, i], atol=1e-5)
    # Without the batch's padding too (a narrower prompt array).
    alone, rec = generate(lm, prompt_ids(PROMPTS[:1], width=1), keys(0), config)
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[0])
    np.testing.assert_allclose(rec.log_prob[:, 0], batch_rec.log_prob[:, 0], atol=1e-5)


def test_stepwise_driving_equals_fused_scan(lm):
    config = ARConfig(max_new_tokens=5, temperature=1.0, eos_id=3)
    state = start(lm, prompt_ids(), keys(0, 1, 2), config)
    fused, rec = generate(lm, prompt_ids(), keys(0, 1, 2), config)
    one = jax.jit(ar.step, static_argnames="config")
    for t in range(config.max_new_tokens):
        state, r = one(lm, state, config=config)
        np.testing.assert_array_equal(r.token, rec.token[t])
    np.testing.assert_array_equal(state.tokens, fused.tokens)
    # Stepping past the budget changes nothing.
    after, r = one(lm, state, config=config)
    np.testing.assert_array_equal(after.tokens, state.tokens)
    assert not bool(jnp.any(r.valid))


def test_serve_without_capture(lm):
    config = ARConfig(max_new_tokens=4, temperature=0.0)
    state, rec = generate(lm, prompt_ids(), keys(0, 1, 2), config, capture=False)
    assert rec is None and bool(jnp.all(state.done))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": -2}, "max_new_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"eos_id": -1}, "eos_id"),
    ],
)
def test_bad_config_raises(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ARConfig(**kwargs)


def test_prompt_too_long_raises(lm):
    config = ARConfig(max_new_tokens=lm.cfg.max_len - 2)
    with pytest.raises(ValueError, match="prompt_ids.*max_new_tokens"):
        ar.init(lm, prompt_ids(), keys(0, 1, 2), config)
    with pytest.raises(ValueError, match="prompt_ids"):
        ar.init(lm, jnp.zeros((1, 3), jnp.int32), keys(0), ARConfig())
    with pytest.raises(ValueError, match="keys"):
        ar.init(lm, prompt_ids(), jax.random.split(jax.random.PRNGKey(0), 3), ARConfig())


def test_bad_lm_config_raises():
    with pytest.raises(ValueError, match="heads"):
        LMConfig(vocab_size=10, dim=30, heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        LMConfig(vocab_size=0)


def test_large_lm_constructs_abstractly():
    big = nnx.eval_shape(lambda: RefinerLM(LMConfig.large(32_000), rngs=nnx.Rngs(0)))
    params = sum(x.size for x in jax.tree.leaves(nnx.state(big, nnx.Param)))
    assert params > 1e9
    cache = jax.eval_shape(lambda: big.init_cache(2))
    assert cache.k[0].shape == (2, 2048, 16, 128) and len(cache.k) == 24


def test_sequence_log_probs_is_differentiable(lm):
    state, _ = generate(lm, prompt_ids(), keys(0, 1, 2), ARConfig(max_new_tokens=8))
    graphdef, params, rest = nnx.split(lm, nnx.Param, ...)
    mask = ar.generated_mask(state.prompt_length, state.length, state.tokens.shape[1])

    def objective(p):
        model = nnx.merge(graphdef, p, rest)
        return jnp.sum(ar.sequence_log_probs(model, state.tokens, state.prompt_length, mask))

    grads = jax.jit(jax.grad(objective))(params)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
    assert all(np.isfinite(norms)) and max(norms) > 0
    assert float(jnp.linalg.norm(grads["head"]["kernel"][...])) > 0
