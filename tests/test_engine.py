"""The engine: registry, run, run_many modes, continuous batching, previews, cancellation, bad input."""

import threading

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.engine import Engine, EngineError


@pytest.fixture()
def engine(t2i_card, i2v_card):
    engine = Engine(max_batch=4)
    engine.register(t2i_card)
    engine.register(i2v_card)
    return engine


def t2i(seed, steps=2, prompt="seven thick"):
    return jp.Request("flux-t2i", prompt=prompt, seed=seed, num_steps=steps)


def frame(value):
    return jnp.full((16, 16, 1), value, jnp.float32)


def snapshot(engine):
    return engine.models(), {m: engine.versions(m) for m in engine.cards()}, engine.cache.stats(), engine.cache.keys()


def test_registry_and_models(engine, t2i_card):
    assert engine.models() == ["flux-t2i", "wan-i2v"]
    assert engine.serves("flux-t2i") and not engine.serves("nope")
    assert engine.card("flux-t2i") is t2i_card
    assert engine.versions("flux-t2i") == {"text_encoder": 0, "transformer": 0, "vae": 0}
    with pytest.raises(EngineError, match="already registered"):
        engine.register(t2i_card)
    engine.register(t2i_card, replace=True)
    assert engine.versions("flux-t2i") == {"text_encoder": 1, "transformer": 1, "vae": 1}


def test_each_card_runs_standalone(engine):
    image = engine.run(t2i(0))
    assert image.model == "flux-t2i" and image["image"].shape == (16, 16, 1) and image["text"] == "seven thick"
    assert 0.0 <= float(image["image"].min()) and float(image["image"].max()) <= 1.0
    video = engine.run(jp.Request("wan-i2v", prompt="seven moving right", image=image["image"], num_steps=2))
    assert video["video"].shape == (8, 16, 16, 1) and video["latents"].shape == (8, 8, 8, 4)
    with pytest.raises(KeyError, match="produced no artifact 'video'"):
        image["video"]


def test_run_matches_the_fused_path_within_c3(engine, t2i_card):
    out = engine.run(t2i(5, steps=3, prompt="one thin"))
    fused = jp.generate(t2i_card, "one thin", seed=5, num_steps=3)
    np.testing.assert_allclose(out["image"], fused["image"][0], atol=parity.TOLERANCE)
    np.testing.assert_allclose(out["latents"], fused["latents"][0], atol=parity.TOLERANCE)


def test_run_many_modes_agree(engine):
    requests = [t2i(0), t2i(1, 3), t2i(2, prompt="one thin"), t2i(0)]
    serial = engine.run_many(requests, "serial")
    interleaved = engine.run_many(requests, "interleaved")
    batched = engine.run_many(requests, "batched")
    assert parity.compare(serial, interleaved).passed  # bit for bit
    report = parity.compare(serial, batched, tolerance=parity.TOLERANCE)
    assert report.passed, report
    np.testing.assert_array_equal(serial[0]["image"], serial[3]["image"])  # same seed, same bits
    assert float(jnp.abs(serial[0]["image"] - serial[1]["image"]).max()) > 1e-3


def test_continuous_batching_with_mixed_step_counts(engine):
    steps = [2, 3, 2, 3, 2, 3]
    requests = [t2i(i, n) for i, n in enumerate(steps)]
    events = []
    outs = engine.run_many(requests, "batched", on_step=lambda e: events.append((e.tick, e.index, e.step, e.num_steps)))
    ticks = {}
    for tick, index, _step, _total in events:
        ticks.setdefault(tick, []).append(index)
    assert max(len(v) for v in ticks.values()) == 4  # max_batch requests advance in one batched step
    assert len(ticks) < sum(steps)  # far fewer ticks than steps: they really shared steps
    # every request took exactly its own number of steps, in order
    for i, n in enumerate(steps):
        assert [s for _, j, s, _ in events if j == i] == list(range(1, n + 1))
    # requests 0-3 fill the 4 slots; when 0 and 2 (2 steps) leave after tick 2, requests 4 and 5
    # take their slots while 1 and 3 do their third step
    first_tick_of = {i: min(t for t, j, *_ in events if j == i) for i in range(len(steps))}
    assert [first_tick_of[i] for i in range(6)] == [1, 1, 1, 1, 3, 3]
    assert sorted(j for t, j, *_ in events if t == 3) == [1, 3, 4, 5] and (3, 1, 3, 3) in events
    assert len(ticks) == 5
    serial = engine.run_many(requests, "serial")
    report = parity.compare(serial, outs, tolerance=parity.TOLERANCE)
    assert report.passed, report


def test_preview_callback_streams_every_step(engine):
    seen = []

    def preview(event):
        seen.append((event.index, event.step, event.num_steps, event.loop, event.latents.shape))

    out = engine.run(t2i(0, 3), on_step=preview)
    assert seen == [(0, s, 3, "t2i_denoise", (1, 8, 8, 4)) for s in (1, 2, 3)]
    np.testing.assert_array_equal(out["image"], engine.run(t2i(0, 3))["image"])  # streaming changes no bits


@pytest.mark.parametrize("mode", ["serial", "interleaved", "batched"])
def test_cancel_one_request_at_a_step_boundary(engine, mode):
    requests = [t2i(0), t2i(1, 3), t2i(2)]
    outs = engine.run_many(requests, mode, on_step=lambda e: not (e.index == 1 and e.step == 1))
    assert outs[1].cancelled and outs[1].cancelled_at == (1, 3)
    with pytest.raises(KeyError, match="cancelled at step 1/3"):
        outs[1]["image"]
    reference = engine.run_many(requests, "serial")
    tolerance = parity.TOLERANCE if mode == "batched" else 0.0
    assert parity.compare([outs[0], outs[2]], [reference[0], reference[2]], tolerance=tolerance).passed
    # the engine is still usable and unchanged by the cancellation
    assert parity.compare(engine.run_many(requests, mode), reference, tolerance=tolerance).passed


def test_cancel_everything(engine):
    stop = threading.Event()

    def preview(event):
        if event.step == 1:
            stop.set()

    outs = engine.run_many([t2i(0), t2i(1)], "interleaved", on_step=preview, cancel=stop)
    assert all(o.cancelled for o in outs)
    outs = engine.run_many([t2i(0), t2i(1)], "serial", cancel=lambda: True)
    assert [o.cancelled_at for o in outs] == [(0, 0), (0, 0)]
    assert not engine.run(t2i(0)).cancelled


def test_bad_input_fails_before_anything_changes(engine):
    engine.run(t2i(0))
    before = snapshot(engine)
    good = t2i(7, prompt="nine bright")
    with pytest.raises(EngineError, match=r"unknown model 'flux'; this engine serves \['flux-t2i', 'wan-i2v'\]"):
        engine.run_many([good, jp.Request("flux", prompt="seven")], "batched")
    with pytest.raises(ValueError, match=r"image must have shape \(16, 16, 1\)"):
        engine.run_many([good, jp.Request("wan-i2v", prompt="seven still", image=jnp.zeros((8, 8, 1)))], "interleaved")
    with pytest.raises(ValueError, match="needs image"):
        engine.run(jp.Request("wan-i2v", prompt="seven still"))
    with pytest.raises(ValueError, match="unknown word"):
        engine.run_many([good, jp.Request("flux-t2i", prompt="seven purple")])
    with pytest.raises(ValueError, match="num_steps must be a positive int"):
        engine.run_many([good, jp.Request("flux-t2i", prompt="seven", num_steps=0)])
    with pytest.raises(ValueError, match="num_steps must be a positive int"):
        jp.Request("flux-t2i", prompt="seven", num_steps=-3)
    with pytest.raises(EngineError, match="mode must be one of"):
        engine.run_many([good], "parallel")
    assert snapshot(engine) == before  # the good request never ran: no cache entry, no version change
    engine.run(good)
    assert engine.cache.stats().entries == before[2].entries + 1


def test_publish_bumps_only_the_published_components(engine, t2i_card):
    before = engine.run(t2i(0))
    new = perturbed(t2i_card["transformer"], seed=9)
    versions = engine.publish("flux-t2i", {"transformer": new})
    assert versions == {"text_encoder": 0, "transformer": 1, "vae": 0}
    after = engine.run(t2i(0))
    assert float(jnp.abs(after["image"] - before["image"]).max()) > 1e-3
    with pytest.raises(KeyError, match="no component"):
        engine.publish("flux-t2i", {"unet": new})


def test_a_replacement_during_a_run_waits_for_the_card_to_drain(engine, t2i_card):
    before = engine.run(t2i(0))
    replaced = []

    def replace_once(event):
        if not replaced:
            replaced.append(
                engine.register(t2i_card.replace(transformer=perturbed(t2i_card["transformer"], seed=3)), replace=True)
            )
            assert engine.versions("flux-t2i")["transformer"] == 0  # deferred: the running request keeps its card
            assert engine.pending_publishes()["flux-t2i"]["transformer"] == 1

    out = engine.run(t2i(0), on_step=replace_once)
    np.testing.assert_array_equal(out["image"], before["image"])  # finished on the old card, bit for bit
    assert (
        engine.versions("flux-t2i") == {"text_encoder": 1, "transformer": 1, "vae": 1}
        and not engine.pending_publishes()
    )
    assert float(jnp.abs(engine.run(t2i(0))["image"] - before["image"]).max()) > 1e-3
    engine.register(t2i_card, replace=True)


@pytest.mark.skipif(not {"flux-t2i", "wan-i2v"} <= set(jp.cards.available()), reason="bundled cards not trained yet")
def test_bundled_cards_and_the_workflow_are_served():
    engine = Engine()  # Engine.default() serves every bundled card: test_parity's bundled run
    for model_id in ("flux-t2i", "wan-i2v", "digit-scorer"):
        engine.register(jp.cards.load(model_id))
    engine.register_workflow(next(w for w in jp.workflow.bundled() if w.id == "image_video.t2i_i2v"))
    out = engine.run(jp.Request("image_video.t2i_i2v", prompt="seven moving right", seed=0, num_steps=4))
    assert out["video"].shape[0] > 1 and out["image"].ndim == 3
    if "digit-scorer" in engine.models():
        scores = engine.run(jp.Request("digit-scorer", image=out["image"]))["scores"]
        assert scores["digit"].shape == (10,) and abs(float(scores["digit"].sum()) - 1.0) < 1e-5


def test_a_reward_card_is_served_by_a_loop_free_program(engine):
    engine.register(jp.cards.build("digit-scorer", seed=0))
    images = [frame(0.1), frame(0.9), frame(0.5)]
    requests = [jp.Request("digit-scorer", image=im) for im in images]
    serial = engine.run_many(requests)
    assert set(serial[0]["scores"]) == {"digit", "stroke", "position", "brightness"}
    assert serial[0]["scores"]["digit"].shape == (10,) and abs(float(serial[0]["scores"]["digit"].sum()) - 1) < 1e-5
    assert parity.compare(serial, engine.run_many(requests, "batched"), tolerance=parity.TOLERANCE).passed
    with pytest.raises(ValueError, match="needs image"):
        engine.run(jp.Request("digit-scorer"))
    engine.unregister("digit-scorer")
    assert not engine.serves("digit-scorer")
