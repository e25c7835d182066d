"""The engine's request lifecycle: submit -> Handle, tick, continuous admission, per-request failure,
cancellation, events and previews, asyncio, and changes while serving that drain first."""

import asyncio
import threading

import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe.engine import Engine, EngineError
from jaxpipe.workflow import Stage, Workflow


def t2i(seed, steps=3, prompt="seven thick"):
    return jp.Request("flux-t2i", prompt=prompt, seed=seed, num_steps=steps)


@pytest.fixture(scope="module")
def offline(t2i_card):
    """``engine.run`` (serial) of seeds 0..3: what every live mode must reproduce."""
    engine = Engine()
    engine.register(t2i_card)
    return {seed: engine.run(t2i(seed)) for seed in range(4)}


def live(card, mode, **kwargs):
    engine = Engine(mode=mode, max_batch=4, **kwargs)
    engine.register(card)
    return engine


def drive(engine, limit=200):
    for _ in range(limit):
        if not engine.tick():
            return
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("mode", ["serial", "interleaved", "batched"])
def test_a_request_submitted_mid_run_joins_and_every_result_matches_offline(t2i_card, offline, mode):
    engine = live(t2i_card, mode)
    first = [engine.submit(t2i(0)), engine.submit(t2i(1))]
    assert [h.status for h in first] == ["queued", "queued"] and engine.load().queued == 2
    engine.tick()
    assert first[0].status == "running" and first[0].progress.step == 1
    late = [engine.submit(t2i(2)), engine.submit(t2i(3))]  # while the first two run
    engine.tick()
    if mode != "serial":  # the late requests joined the next step: four rows step together
        assert all(h.status == "running" for h in late) and engine.load().running == 4
    drive(engine)
    assert engine.idle and engine.load() == jp.engine.Load()
    for seed, handle in enumerate(first + late):
        out = handle.result(timeout=0)
        if mode == "batched":  # C3: batched rows agree with serial within the measured tolerance
            np.testing.assert_allclose(out["image"], offline[seed]["image"], atol=jp.parity.TOLERANCE)
        else:  # C1: the same jitted step on the same shapes, bit for bit
            np.testing.assert_array_equal(out["image"], offline[seed]["image"])
    kinds = [e.kind for e in first[0].events()]
    assert kinds[:2] == ["queued", "started"] and kinds.count("step") == 3 and kinds[-1] == "completed"


def boom(state):
    raise RuntimeError("stage builder broke")


@pytest.mark.parametrize("mode", ["interleaved", "batched"])
def test_a_failing_request_fails_alone(t2i_card, offline, mode):
    engine = live(t2i_card, mode)
    engine.register_workflow(
        Workflow("test.broken", (Stage("t2i", "flux-t2i", lambda s: t2i(0)), Stage("again", "flux-t2i", boom)))
    )
    good = [engine.submit(t2i(0)), engine.submit(t2i(1))]
    bad = engine.submit(jp.Request("test.broken", prompt="seven"))
    drive(engine)
    assert bad.status == "failed" and isinstance(bad.exception(0), RuntimeError)
    with pytest.raises(RuntimeError, match="stage builder broke"):
        bad.result(0)
    assert [e.kind for e in bad.events()][-1] == "failed"
    for seed, handle in enumerate(good):
        assert handle.status == "completed"
        np.testing.assert_allclose(handle.result()["image"], offline[seed]["image"], atol=jp.parity.TOLERANCE)
    with pytest.raises(RuntimeError, match="stage builder broke"):  # run_many reports it too, after the others
        engine.run_many([t2i(0), jp.Request("test.broken", prompt="seven")], "interleaved")


@pytest.mark.parametrize("mode", ["interleaved", "batched"])
def test_cancel_frees_the_slot_at_the_next_step(t2i_card, offline, mode):
    engine = live(t2i_card, mode)
    keep, drop = engine.submit(t2i(0)), engine.submit(t2i(1))
    engine.tick()
    assert drop.cancel() and engine.load().running == 2
    engine.tick()
    assert drop.status == "cancelled" and drop.result(0).cancelled_at == (1, 3)
    assert engine.load().running == 1 and engine.load().rows == 1
    assert not drop.cancel()  # already done
    queued = engine.submit(t2i(2))
    queued.cancel()
    drive(engine)
    assert queued.result(0).cancelled_at == (0, 0) and keep.status == "completed"
    np.testing.assert_allclose(keep.result()["image"], offline[0]["image"], atol=jp.parity.TOLERANCE)


def test_previews_carry_latents_and_the_decoded_image(t2i_card):
    engine = live(t2i_card, "batched")
    handle = engine.submit(t2i(0, steps=2), previews=True)
    plain = engine.submit(t2i(1, steps=2))
    drive(engine)
    steps = [e for e in handle.events() if e.kind == "step"]
    assert [e.step for e in steps] == [1, 2] and steps[0].latents.shape == (1, 8, 8, 4)
    assert steps[-1].image.shape == (16, 16, 1) and 0 <= steps[-1].image.min() <= steps[-1].image.max() <= 1
    np.testing.assert_allclose(steps[-1].image, handle.result()["image"], atol=1e-5)  # the last preview is the image
    assert all(e.latents is None for e in plain.events())


def test_a_handle_is_awaited_and_its_events_iterated_from_asyncio(t2i_card, offline):
    engine = live(t2i_card, "batched")
    stop = threading.Event()
    ticker = threading.Thread(target=lambda: [engine.tick() or stop.wait(0.001) for _ in iter(stop.is_set, True)])

    async def client():
        handle = engine.submit(t2i(0))
        kinds = [e.kind async for e in handle.events()]
        return kinds, await handle, await engine.submit(t2i(1))

    ticker.start()
    try:
        kinds, first, second = asyncio.run(asyncio.wait_for(client(), 60))
    finally:
        stop.set()
        ticker.join()
    assert kinds[0] == "queued" and kinds[-1] == "completed"
    np.testing.assert_allclose(first["image"], offline[0]["image"], atol=jp.parity.TOLERANCE)
    np.testing.assert_allclose(second["image"], offline[1]["image"], atol=jp.parity.TOLERANCE)


def test_changes_while_serving_drain_the_card_first(t2i_card, offline):
    engine = live(t2i_card, "interleaved")
    started = engine.submit(t2i(0))
    engine.tick()
    new = perturbed(t2i_card["transformer"], seed=4)
    assert engine.publish("flux-t2i", {"transformer": new})["transformer"] == 1
    later = engine.submit(t2i(0))
    engine.tick()
    assert later.status == "queued"  # held until the card drains
    drive(engine)
    np.testing.assert_array_equal(started.result()["image"], offline[0]["image"])  # old weights, bit for bit
    assert float(np.abs(np.asarray(later.result()["image"]) - np.asarray(offline[0]["image"])).max()) > 1e-3
    assert engine.versions("flux-t2i")["transformer"] == 1
    # a replacement and an unregister wait too; requests held for a card that goes away fail alone
    running = engine.submit(t2i(1))
    engine.tick()
    engine.register(t2i_card, replace=True)
    engine.tick()
    engine.unregister("flux-t2i")
    assert "flux-t2i" not in engine.models() and engine.serves("flux-t2i")
    with pytest.raises(EngineError, match="being unregistered"):
        engine.submit(t2i(2))
    drive(engine)
    published = Engine()
    published.register(t2i_card.replace(transformer=new))
    np.testing.assert_array_equal(
        running.result()["image"], published.run(t2i(1))["image"]
    )  # on the card it started on
    assert not engine.serves("flux-t2i")


def test_bad_submissions_raise_at_once(t2i_card):
    engine = live(t2i_card, "batched")
    with pytest.raises(EngineError, match="unknown model 'nope'"):
        engine.submit(jp.Request("nope"))
    with pytest.raises(ValueError, match="unknown word"):
        engine.submit(jp.Request("flux-t2i", prompt="seven purple"))
    with pytest.raises(EngineError, match="mode must be one of"):
        Engine(mode="parallel")
    assert engine.idle and engine.load().queued == 0
