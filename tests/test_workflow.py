"""Cross-model workflows: text -> image -> video across two cards, nesting, and registration checks."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.digits import workflows
from jaxpipe.engine import Engine
from jaxpipe.workflow import Stage, Workflow, WorkflowError


@pytest.fixture()
def engine(t2i_card, i2v_card):
    engine = Engine(max_batch=4)
    engine.register(t2i_card)
    engine.register(i2v_card)
    engine.register_workflow(workflows.t2i_i2v())
    return engine


def job(prompt="seven moving right", seed=0, steps=2, model="image_video.t2i_i2v"):
    return jp.Request(model, prompt=prompt, seed=seed, num_steps=steps)


def test_text_to_image_to_video(engine):
    assert engine.models() == ["flux-t2i", "image_video.t2i_i2v", "wan-i2v"]
    out = engine.run(job())
    assert out.model == "image_video.t2i_i2v"
    assert out["video"].shape == (8, 16, 16, 1) and out["image"].shape == (16, 16, 1)
    assert float(out["video"].min()) >= 0.0 and float(out["video"].max()) <= 1.0
    assert float(jnp.abs(out["video"][1:] - out["video"][:1]).max()) > 1e-3  # frames differ: a real video
    np.testing.assert_array_equal(out["image"], out["t2i:image"])
    np.testing.assert_array_equal(out["video"], out["i2v:video"])


def test_two_distinct_cards_with_distinct_weights(engine, t2i_card, i2v_card):
    t2i, i2v = engine.card("flux-t2i"), engine.card("wan-i2v")
    assert t2i is t2i_card and i2v is i2v_card and t2i.model_id != i2v.model_id
    assert [s.model for s in engine.workflow("image_video.t2i_i2v").stages] == ["flux-t2i", "wan-i2v"]
    a, b = t2i["text_encoder"].embed.embedding[...], i2v["text_encoder"].embed.embedding[...]
    assert a.shape == b.shape and float(jnp.abs(a - b).max()) > 1e-3
    assert t2i["transformer"].patch_embed.kernel.shape != i2v["transformer"].patch_embed.kernel.shape  # frame input
    # each stage really ran its own card: the stages' artifacts equal the cards run alone
    out = engine.run(job(seed=3))
    alone = engine.run(jp.Request("flux-t2i", prompt="seven left", seed=3, num_steps=2))  # room to move right
    np.testing.assert_array_equal(out["image"], alone["image"])
    video = engine.run(jp.Request("wan-i2v", prompt="seven moving right", seed=3, num_steps=2, image=alone["image"]))
    np.testing.assert_array_equal(out["video"], video["video"])


def test_the_prompt_reaches_both_stages(engine):
    out = engine.run(job("seven thick moving up"))
    assert out["t2i:text"] == "seven thick" and out["i2v:text"] == "seven moving up"
    other_motion = engine.run(job("seven thick moving down"))
    np.testing.assert_array_equal(out["image"], other_motion["image"])  # the image prompt is unchanged
    assert float(jnp.abs(out["video"] - other_motion["video"]).max()) > 1e-3  # the motion reached stage 2
    other_digit = engine.run(job("one thick moving up"))
    assert float(jnp.abs(out["image"] - other_digit["image"]).max()) > 1e-3  # the digit reached stage 1
    still = engine.run(job("seven thick"))
    assert still["i2v:text"] == "seven still"  # no motion in the prompt: the default
    rightward = engine.run(job("seven moving right"))
    assert rightward["t2i:text"] == "seven left"  # an unplaced digit moving right starts left, as in training


def test_the_conditioning_image_matters(engine):
    image = engine.run(jp.Request("flux-t2i", prompt="seven", num_steps=2))["image"]
    animate = lambda im: engine.run(jp.Request("wan-i2v", prompt="seven moving right", num_steps=2, image=im))["video"]
    a, again, swapped = animate(image), animate(image), animate(1.0 - image)
    np.testing.assert_array_equal(a, again)
    assert float(jnp.abs(a - swapped).max()) > 1e-3


@pytest.mark.parametrize("model", ["flux-t2i", "wan-i2v"])
def test_each_card_passes_the_interleave_gate_on_its_own(engine, model):
    if model == "flux-t2i":
        requests = [
            jp.Request(model, prompt=p, seed=s, num_steps=n)
            for p, s, n in [("seven", 0, 2), ("one thin", 1, 3), ("seven", 2, 2)]
        ]
    else:
        frames = [jnp.full((16, 16, 1), v, jnp.float32) for v in (0.2, 0.7)]
        requests = [
            jp.Request(model, prompt="seven moving up", seed=s, num_steps=2, image=f) for s, f in enumerate(frames)
        ]
    report = parity.interleave_gate(engine, requests)
    assert report.passed and report.max_abs_diff == 0.0, report


def test_workflow_modes_agree(engine):
    requests = [job(seed=0), job("one thin", seed=1), jp.Request("flux-t2i", prompt="two", num_steps=2)]
    serial = engine.run_many(requests, "serial")
    assert parity.compare(serial, engine.run_many(requests, "interleaved")).passed
    report = parity.compare(serial, engine.run_many(requests, "batched"), tolerance=parity.TOLERANCE)
    assert report.passed, report


def test_nested_workflow_extends_the_video(engine):
    engine.register_workflow(workflows.t2i_i2v_extended())
    out = engine.run(job(model="image_video.t2i_i2v_extended"))
    base = engine.run(job())
    assert out["video"].shape == (15, 16, 16, 1)
    np.testing.assert_array_equal(out["video"][:8], base["video"])
    np.testing.assert_array_equal(out["base:t2i:image"], base["image"])
    assert out["more:text"] == "seven moving right"
    # nesting to any depth: a workflow over the nested workflow
    deeper = Workflow(
        "test.deeper",
        (
            Stage(
                "inner",
                "image_video.t2i_i2v_extended",
                lambda s: s["request"].replace(model="image_video.t2i_i2v_extended"),
            ),
        ),
    )
    engine.register_workflow(deeper)
    np.testing.assert_array_equal(engine.run(job(model="test.deeper"))["video"], out["video"])


def test_a_mismatched_stage_is_an_error(engine):
    bad = Workflow(
        "test.mismatch", (Stage("t2i", "wan-i2v", lambda s: jp.Request("flux-t2i", prompt=s["prompt"], num_steps=2)),)
    )
    engine.register_workflow(bad)
    with pytest.raises(WorkflowError, match="stage 't2i' declares model 'wan-i2v' but built a request for 'flux-t2i'"):
        engine.run(jp.Request("test.mismatch", prompt="seven"))


def test_registration_rejects_missing_requirements_cycles_and_collisions(engine, t2i_card):
    before = engine.models()
    with pytest.raises(WorkflowError, match="stage 'video' requires 'hunyuan-i2v', which is not registered"):
        engine.register_workflow(Workflow("test.missing", (Stage("video", "hunyuan-i2v", lambda s: None),)))
    with pytest.raises(WorkflowError, match=r"forms a cycle: test.self -> test.self"):
        engine.register_workflow(Workflow("test.self", (Stage("again", "test.self", lambda s: None),)))
    engine.register_workflow(Workflow("test.a", (Stage("t2i", "flux-t2i", lambda s: None),)))
    engine.register_workflow(Workflow("test.b", (Stage("a", "test.a", lambda s: None),)))
    with pytest.raises(WorkflowError, match=r"forms a cycle: test.a -> test.b -> test.a"):
        engine.register_workflow(Workflow("test.a", (Stage("b", "test.b", lambda s: None),)), replace=True)
    with pytest.raises(WorkflowError, match="already registered"):
        engine.register_workflow(workflows.t2i_i2v())
    with pytest.raises(WorkflowError, match="dotted and namespaced"):
        Workflow("t2i_i2v", (Stage("t2i", "flux-t2i", lambda s: None),))
    dotted_card = jp.cards.build("flux-t2i").with_id("image_video.card")
    engine.register(dotted_card)
    with pytest.raises(WorkflowError, match="collides with a registered card"):
        engine.register_workflow(Workflow("image_video.card", (Stage("t2i", "flux-t2i", lambda s: None),)))
    with pytest.raises(Exception, match="collides with a registered workflow"):
        engine.register(jp.cards.build("flux-t2i").with_id("test.a"))
    with pytest.raises(Exception, match="workflows .* require it"):
        engine.unregister("flux-t2i")
    assert engine.models() == sorted(before + ["image_video.card", "test.a", "test.b"])


def test_run_time_cycle_guard(engine):
    # registration makes cycles impossible; the run-time guard still catches one smuggled in
    loop = Workflow("test.loop", (Stage("t2i", "flux-t2i", lambda s: jp.Request("flux-t2i", prompt="one")),))
    engine.register_workflow(loop)
    engine._workflows._workflows["test.loop"] = Workflow(
        "test.loop", (Stage("again", "test.loop", lambda s: s["request"]),)
    )
    with pytest.raises(WorkflowError, match="cycle at run time: test.loop -> test.loop"):
        engine.run(jp.Request("test.loop", prompt="one"))
    assert not engine.run(jp.Request("flux-t2i", prompt="one", num_steps=2)).cancelled  # still usable


def test_bad_workflow_input_fails_before_anything_runs(engine):
    before = engine.cache.stats()
    with pytest.raises(ValueError, match="need a prompt"):
        engine.run_many([job(), jp.Request("image_video.t2i_i2v")], "batched")
    with pytest.raises(ValueError, match="vocabulary"):
        engine.run(job("seven purple moving right"))
    assert engine.cache.stats() == before
