"""Adding a card family without touching the package: one folder's worth of code plus one registry call.

The ``toy_flow`` family (``toy_family.py``: its own config, denoiser, build, program and flow data)
is registered, then built by id, served by the engine through its program, fine-tuned with
``Finetune`` and round-tripped through ``save_card`` / ``load_card``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toy_family as toy
from conftest import leaves_equal

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.training import Finetune, FinetuneConfig, Optimizer
from jaxpipe.training.fit import fit


@pytest.fixture(scope="module")
def family():
    jp.cards.register_family(toy.FAMILY)
    yield toy.FAMILY
    jp.cards.unregister_family(toy.FAMILY.name)


def requests(n=3):
    return [jp.Request(toy.MODEL_ID, prompt=str(i % 10), seed=i) for i in range(n)]


def test_register_build_serve_finetune_and_round_trip(family, tmp_path):
    assert jp.cards.family("toy_flow") is family and toy.MODEL_ID in jp.cards.buildable()
    card = jp.cards.build(toy.MODEL_ID, seed=0)
    assert card.spec.family == "toy_flow" and set(card.components) == {"embed", "denoiser"}

    # served by the engine through the family's program (its default, from the registry)
    engine = jp.Engine(max_batch=4)
    engine.register(card)
    assert engine.program(toy.MODEL_ID) is toy.program()
    serial = engine.run_many(requests(), mode="serial")
    assert serial[0]["sample"].shape == toy.SHAPE
    assert parity.interleave_gate(engine, requests()).max_abs_diff == 0.0
    assert parity.batch_invariance(engine, requests()).passed
    fused = jp.generate(card, ["0", "1", "2"], seed=0)
    np.testing.assert_allclose(fused["sample"], jnp.stack([o["sample"] for o in serial]), atol=parity.TOLERANCE)
    with pytest.raises(ValueError, match="one of '0'..'9'"):
        engine.run(jp.Request(toy.MODEL_ID, prompt="seven"))

    # fine-tuned by flow matching through the family's FlowData hooks
    optimizer = Optimizer(1e-2, weight_decay=1e-4, schedule="warmup_cosine", warmup_steps=5, total_steps=150)
    config = FinetuneConfig(optimizer=optimizer, trainable=("embed", "denoiser"))
    method = Finetune(card, config)
    batch, key = toy.data(128), jax.random.key(0)
    state, history = fit(
        lambda s, b, k: method.step(s, b, key), method.init(), iter([batch] * 150), steps=150, key=key, progress=False
    )
    first, last = np.mean([h["loss"] for h in history[:5]]), np.mean([h["loss"] for h in history[-5:]])
    assert last < 0.5 * first, (first, last)
    trained = method.card(state)
    assert not leaves_equal(trained["denoiser"], card["denoiser"])

    # the trained card samples its classes: the sample's sign pattern is the class's
    samples = jp.generate(trained, [str(d) for d in range(10)] * 2, seed=0, num_steps=8)["sample"]
    patterns = np.sign(np.asarray(samples).reshape(20, 16))
    labels = np.arange(20) % 10
    expected = ((labels[:, None] >> np.arange(16) % 4) & 1) * 2.0 - 1.0
    assert np.mean(patterns == expected) > 0.9

    # checkpoints: saved through the registry, rebuilt abstractly, identical weights and outputs
    loaded = jp.cards.load(jp.cards.save_card(trained, tmp_path / "toy"))
    assert loaded.spec == trained.spec and leaves_equal(loaded.components, trained.components)
    np.testing.assert_array_equal(
        jp.generate(loaded, "3", seed=5)["sample"], jp.generate(trained, "3", seed=5)["sample"]
    )


def test_registry_errors_name_the_problem(family):
    with pytest.raises(ValueError, match="already registered"):
        jp.cards.register_family(toy.FAMILY)
    with pytest.raises(ValueError, match="unknown card family 'nope'"):
        jp.cards.family("nope")
    clash = jp.cards.Family(
        name="other", config=toy.Config, build=toy.build, programs={"p": toy.program}, model_id="flux-t2i"
    )
    with pytest.raises(ValueError, match="already built by family 'toy_t2i'"):
        jp.cards.register_family(clash)
    with pytest.raises(ValueError, match="names no program"):
        jp.cards.Family(name="x", config=toy.Config, build=toy.build, programs={})
    card = toy.build(toy.Config())
    jp.cards.unregister_family("toy_flow")
    try:
        with pytest.raises(ValueError, match="unknown card family 'toy_flow'"):
            jp.cards.save_card(card, "/nonexistent/never-written")
    finally:
        jp.cards.register_family(toy.FAMILY)
