"""wan-causal: the block-causal DiT and its chunk KV cache, the chunk_rollout loop through the engine,
and video continuation (tiny random cards: the mechanics, not the quality)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed
from flax import nnx

import jaxpipe as jp
from jaxpipe import parity, workflow
from jaxpipe.cards import generator
from jaxpipe.digits import cards as digit_cards
from jaxpipe.digits import workflows
from jaxpipe.engine import Engine
from jaxpipe.loops import chunk
from jaxpipe.nn import DiTCond, DiTConfig
from jaxpipe.nn.causal_dit import ChunkCond, init_cache

F = 2  # frames per chunk
DIT = DiTConfig(dim=32, depth=2, heads=2)
TOKENS = F * 4 * 4  # 8x8 latents, patch 2


@pytest.fixture(scope="module")
def card():
    built = jp.cards.build("wan-causal", seed=3, config=digit_cards.config("wan-causal", dit=DIT))
    return built.replace(transformer=perturbed(built["transformer"], seed=4))


@pytest.fixture(scope="module")
def inputs():
    keys = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(keys[0], (2, 4 * F, 8, 8, 4))
    context = jax.random.normal(keys[1], (2, 5, DIT.text_dim))
    return x, context, jnp.ones((2, 5), bool)


# One compiled function each, reused by every test below.
_full = jax.jit(
    lambda dit, x, sigma, ctx, mask, window: dit(x, sigma, ctx, mask, chunk_frames=F, window=window), static_argnums=5
)
_velocity = jax.jit(lambda dit, x, sigma, cond: dit.velocity(x, sigma, cond))
_write = jax.jit(lambda dit, x, cond: dit.write(x, cond))


def _cached(dit, x, sigma, context, mask, window):
    """Write chunks 0..n-2 of ``x`` clean into a ``window``-chunk cache, then the last chunk's velocity."""
    n = x.shape[1] // F
    cache = init_cache(dit.cfg, x.shape[0], window, TOKENS)
    for c in range(n - 1):
        cache = _write(dit, x[:, c * F : (c + 1) * F], ChunkCond(context, mask, cache))
    return _velocity(dit, x[:, -F:], sigma, ChunkCond(context, mask, cache)), cache


def test_cached_equals_recomputed(card, inputs):
    x, context, mask = inputs
    dit = card["transformer"]
    sigma = jnp.array([[0.0, 0.0, 0.0, 0.8], [0.0, 0.0, 0.0, 0.3]])
    full = _full(dit, x, sigma, context, mask, None)
    cached, cache = _cached(dit, x, sigma[:, -1], context, mask, 4)
    assert float(jnp.abs(full).max()) > 0.1  # a non-trivial velocity
    np.testing.assert_allclose(cached, full[:, -F:], atol=1e-5)
    np.testing.assert_array_equal(cache.written, [3, 3])
    np.testing.assert_array_equal(cache.valid, [[True, True, True, False]] * 2)


def test_block_causal_mask(card, inputs):
    x, context, mask = inputs
    dit = card["transformer"]
    sigma = jnp.full((2, 4), 0.5)
    base = _full(dit, x, sigma, context, mask, None)
    later = _full(dit, x.at[:, 3 * F :].add(1.0), sigma, context, mask, None)
    np.testing.assert_array_equal(later[:, : 3 * F], base[:, : 3 * F])  # earlier chunks cannot see a later one
    assert float(jnp.abs(later[:, 3 * F :] - base[:, 3 * F :]).max()) > 1e-3
    earlier = _full(dit, x.at[:, :F].add(1.0), sigma, context, mask, None)
    assert float(jnp.abs(earlier[:, 3 * F :] - base[:, 3 * F :]).max()) > 1e-3  # a later chunk sees an earlier one
    # per-chunk noise levels: changing chunk 3's sigma changes only chunk 3
    other = _full(dit, x, sigma.at[:, 3].set(0.9), context, mask, None)
    np.testing.assert_array_equal(other[:, : 3 * F], base[:, : 3 * F])


def test_window_slides_the_oldest_chunk_out(card, inputs):
    x, context, mask = inputs
    dit = card["transformer"]
    sigma = jnp.array([[0.0, 0.0, 0.0, 0.6]] * 2)
    cached, cache = _cached(dit, x, sigma[:, -1], context, mask, 2)
    # 3 chunks written into 2 slots: chunk 2 overwrote chunk 0's slot, chunk 1 is still there
    np.testing.assert_array_equal(cache.written, [3, 3])
    np.testing.assert_array_equal(cache.valid, [[True, True]] * 2)
    windowed = _full(dit, x, sigma, context, mask, 2)
    np.testing.assert_allclose(cached, windowed[:, -F:], atol=1e-5)
    everything = _full(dit, x, sigma, context, mask, None)
    assert float(jnp.abs(windowed[:, -F:] - everything[:, -F:]).max()) > 1e-4  # chunk 0 is really gone
    # a one-chunk video keeps no slots: writing only moves the position of the next chunk
    empty = init_cache(dit.cfg, 2, 0, TOKENS)
    np.testing.assert_array_equal(dit.write(x[:, :F], ChunkCond(context, mask, empty)).written, [1, 1])


@pytest.fixture(scope="module")
def engine(card):
    served = Engine()
    served.register(card)
    return served


def _requests():
    return [jp.Request("wan-causal", prompt=p, seed=s, num_steps=2) for p, s in [("seven moving right", 0), ("one", 1)]]


def test_fused_run_matches_the_engine_and_serial_equals_interleaved(card, engine):
    requests = _requests()
    report = parity.interleave_gate(engine, requests)
    assert report.passed and report.max_abs_diff == 0.0, report
    fused = jp.generate(card, [r.prompt for r in requests], seed=[0, 1], num_steps=2)
    served = engine.run_many(requests, mode="serial")
    assert fused["video"].shape == (2, 8, 16, 16, 1) and fused["latents"].shape == (2, 8, 8, 8, 4)
    for i, out in enumerate(served):
        np.testing.assert_allclose(out["latents"], fused["latents"][i], atol=parity.TOLERANCE)
    assert float(jnp.abs(fused["video"][0] - fused["video"][1]).max()) > 1e-3  # the prompt (and seed) matter


def test_batched_rows_at_different_chunks(card, engine, inputs):
    requests = _requests()
    report = parity.batch_invariance(engine, requests + [requests[0].replace(seed=5)])
    assert report.passed, report
    # one batched step over rows at different chunks and steps == each row stepped on its own
    dit, config = card["transformer"], chunk.ChunkConfig(num_steps=2)
    step = jax.jit(lambda s: chunk.step((dit,), s, config))

    def start(seed, ctx):
        return chunk.init(
            dit, generator.request_keys([seed]), (8, 8, 8, 4), DiTCond(ctx, jnp.ones((1, 5), bool)), config
        )

    _, context, _ = inputs
    ahead, fresh = start(0, context[:1]), start(1, context[1:])
    for _ in range(3):  # chunk 1, step 1
        ahead = step(ahead)
    both = step(jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ahead, fresh))
    alone = [step(ahead), step(fresh)]
    for i, row in enumerate(alone):
        np.testing.assert_allclose(both.video[i], row.video[0], atol=parity.TOLERANCE)
        np.testing.assert_allclose(both.x[i], row.x[0], atol=parity.TOLERANCE)
        assert int(both.chunk[i]) == int(row.chunk[0]) and int(both.step[i]) == int(row.step[0])
    assert [int(c) for c in both.chunk] == [2, 0] and [int(c) for c in both.step] == [0, 1]


def test_chunks_stream_through_on_step(engine):
    events = []
    engine.run_many(
        _requests()[:1], mode="serial", on_step=lambda e: events.append((e.step, e.num_steps, np.asarray(e.latents)))
    )
    assert [(s, n) for s, n, _ in events] == [(i, 8) for i in range(1, 9)]  # 4 chunks x 2 steps
    filled = [int((np.abs(lat).reshape(4, -1).max(axis=1) > 0).sum()) for _, _, lat in events]
    assert filled == [0, 1, 1, 2, 2, 3, 3, 4]  # a chunk appears when its last step is done
    # a finished chunk never changes afterwards
    np.testing.assert_array_equal(events[1][2][:F], events[-1][2][:F])


@pytest.mark.slow  # ~10 s: by default test_parity runs the continuation workflow (C1)
def test_continuation_prefills_the_given_video(card, engine):
    t2v = jp.cards.build("wan-t2v", seed=3, config=digit_cards.config("wan-t2v", dit=DIT))
    engine.register(t2v.replace(transformer=perturbed(t2v["transformer"], seed=5)))
    assert "video.t2v_continue" in [w.id for w in workflow.bundled()]  # Engine.default() serves it with its cards
    engine.register_workflow(workflows.t2v_continue())
    out = engine.run(jp.Request("video.t2v_continue", prompt="seven moving right", num_steps=2, inputs={"chunks": 2}))
    assert out["video"].shape == (12, 16, 16, 1) and out["more:latents"].shape == (12, 8, 8, 4)
    np.testing.assert_array_equal(out["video"][:8], out["t2v:video"])
    # the causal stage's first 8 frames are the given video, encoded (prefilled into its cache)
    encoded = card["vae"].encode_video(jnp.asarray(out["t2v:video"])[None] * 2.0 - 1.0)[0]
    np.testing.assert_allclose(out["more:latents"][:8], encoded, atol=1e-5)
    assert float(np.abs(out["more:latents"][8:]).max()) > 0  # new chunks were generated after it


def test_bad_input_is_refused(card):
    with pytest.raises(ValueError, match="does not divide frames=8"):
        digit_cards.config("wan-causal", sampling=chunk.ChunkConfig(chunk_frames=3))
    with pytest.raises(ValueError, match="window must be None"):
        chunk.ChunkConfig(window=0)
    with pytest.raises(ValueError, match="chunks"):
        dataclasses.replace(digit_cards.config("wan-causal"), frames=6)
    with pytest.raises(ValueError, match="ODE only"):
        chunk.ChunkConfig(sampler="sde")
    with pytest.raises(ValueError, match="capture=True is not supported"):
        chunk.run((card["transformer"],), None, chunk.ChunkConfig(), capture=True)
    with pytest.raises(ValueError, match="multiple of chunk_frames=2"):
        jp.generate(card, "seven", inputs={"video": np.zeros((3, 16, 16, 1), np.float32)})
    with pytest.raises(ValueError, match="takes no image"):
        jp.generate(card, "seven", image=np.zeros((16, 16, 1), np.float32))
    with pytest.raises(ValueError, match="positive int"):
        jp.generate(card, "seven", inputs={"chunks": 0})


BUNDLED = {"wan-causal", "wan-t2v"} <= set(jp.cards.available())


@pytest.mark.skipif(not BUNDLED, reason="bundled cards missing")
def test_bundled_card_shares_wan_t2v_components():
    causal, t2v = jp.cards.load("wan-causal"), jp.cards.load("wan-t2v")
    assert type(causal["transformer"]).__name__ == "CausalDiT"
    assert causal.spec.loops[0].kind == "chunk_rollout" and causal.spec.config.sampling.chunks == 4
    for name in ("text_encoder", "vae"):  # stored once, in wan-t2v (save_card base=)
        for mine, base in zip(
            jax.tree.leaves(nnx.state(causal[name])), jax.tree.leaves(nnx.state(t2v[name])), strict=True
        ):
            np.testing.assert_array_equal(mine, base)


@pytest.mark.slow  # quality of the bundled card (benchmarks/causal.py measures it on more prompts)
@pytest.mark.skipif(not BUNDLED, reason="bundled cards missing")
def test_bundled_card_matches_the_bidirectional_card():
    from jaxpipe.digits import quality

    scorer = jp.cards.load("digit-scorer")
    causal, t2v = (quality.t2v_quality(jp.cards.load(m), scorer, samples=40)["full"] for m in ("wan-causal", "wan-t2v"))
    assert causal["motion_accuracy"] >= 0.9, causal
    for key in ("first_frame_digit_accuracy", "last_frame_digit_accuracy"):  # same prompts and seeds
        assert causal[key] >= t2v[key] - 0.15, (causal, t2v)
