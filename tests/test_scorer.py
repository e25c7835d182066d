"""The ``digit-scorer`` card: bundled weights that generalise, pure scoring, a trainer that learns."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxpipe as jp
from jaxpipe.cards import load_card, save_card
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer
from jaxpipe.digits.digit_scorer.network import HEADS, DigitScorer, ScorerConfig
from jaxpipe.digits.pretrain import scorer as training

TARGETS = {"digit": 0.95, "stroke": 0.95, "position": 0.95, "brightness": 0.95}


def _key(seed):
    # Random draws in these tests use the "rbg" PRNG: the code takes any key, and rbg compiles far
    # faster than threefry on CPU, which keeps this file fast (the bundled run uses threefry keys).
    return jax.random.key(seed, impl="rbg")


def _tiny_batch():
    images, labels = digits.load_images(training.TRAIN_SPLIT)
    data = digits.augment(images[:32], labels[:32], seed=0)
    return {name: jnp.asarray(getattr(data, name)) for name in ("image", *HEADS)}


@pytest.fixture(scope="module")
def card():
    return jp.cards.load("digit-scorer")


@pytest.fixture(scope="module")
def unseen():
    """200 of the generators' train digits (never seen by the scorer), random attributes."""
    images, labels = digits.load_images("train")
    pick = np.random.default_rng(0).choice(len(labels), 200, replace=False)
    return digits.augment(images[pick], labels[pick], seed=7)


def test_bundled_card_loads_as_a_score_card(card):
    assert "digit-scorer" in jp.cards.available() and "digit-scorer" in jp.cards.buildable()
    assert isinstance(card, jp.Card) and card.model_id == "digit-scorer"
    assert card.spec.loop("score").kind == "score" and card.spec.loop("score").binds == ("scorer",)
    assert card.spec.recipe == ("score",) and card.spec.capabilities == ("score",)
    assert isinstance(card["scorer"], DigitScorer) and card.spec.config == digit_scorer.Config()
    assert 0 < card.num_params() < 200_000


def test_bundled_card_generalises_to_the_generators_digits(card, unseen):
    pred = jax.jit(digit_scorer.predict)(card, jnp.asarray(unseen.image))
    acc = {name: float(np.mean(np.asarray(pred[name]) == getattr(unseen, name))) for name in HEADS}
    assert acc["digit"] >= 0.90, acc
    for name in ("stroke", "position", "brightness"):
        assert acc[name] >= 0.97, acc


def test_bundled_metrics_report_the_targets():
    report = json.loads((jp.cards.path("digit-scorer") / "metrics.json").read_text())
    for name, target in TARGETS.items():
        assert report["accuracy"]["train_split"][name] >= target, report["accuracy"]
    assert report["skipped_steps"] == 0
    assert (jp.cards.path("digit-scorer") / "weights.safetensors").stat().st_size < 1_000_000


_score = jax.jit(digit_scorer.score)


def test_score_is_probabilities_and_predict_is_its_argmax(card, unseen):
    x = jnp.asarray(unseen.image[:24])
    probs = _score(card, x)
    pred = jax.jit(digit_scorer.predict)(card, x)
    assert {k: v.shape for k, v in probs.items()} == {k: (24, n) for k, n in HEADS.items()}
    for name, p in probs.items():
        assert np.all(np.asarray(p) >= 0.0)
        np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(pred[name]), np.asarray(p).argmax(-1))


def test_score_works_under_jit_and_vmap(card, unseen):
    x = jnp.asarray(unseen.image[:24])
    jitted = _score(card, x)
    mapped = jax.jit(jax.vmap(digit_scorer.score, in_axes=(None, 0)))(card, x.reshape(4, 6, 16, 16, 1))
    for name in HEADS:
        np.testing.assert_allclose(mapped[name].reshape(24, -1), jitted[name], atol=1e-5)


def test_bad_image_shapes_raise_clear_errors(card):
    for shape in [(16, 16, 1), (2, 16, 16), (2, 8, 8, 1), (2, 16, 16, 3)]:
        with pytest.raises(ValueError, match=r"\(B, 16, 16, 1\)"):
            digit_scorer.score(card, jnp.zeros(shape))
    with pytest.raises(ValueError, match="floating point"):
        digit_scorer.score(card, jnp.zeros((2, 16, 16, 1), jnp.int32))
    with pytest.raises(ValueError, match="multiple of the downsampling"):
        ScorerConfig(image_size=18)


def test_checkpoint_round_trip_gives_identical_scores(card, unseen, tmp_path):
    save_card(card, tmp_path / "scorer")
    again = load_card(tmp_path / "scorer")
    assert again.spec == card.spec
    x = jnp.asarray(unseen.image[:24])
    a, b = _score(card, x), _score(again, x)
    for name in HEADS:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def test_scorer_trains_only_on_digits_the_generators_never_see():
    ours = digits.split_indices(training.TRAIN_SPLIT)
    theirs = digits.split_indices("train")
    assert len(ours) > 0 and np.intersect1d(ours, theirs).size == 0
    data = training.training_data(seed=3, copies=2)
    images, labels = digits.load_images(training.TRAIN_SPLIT)
    expected = digits.augment(images, labels, seed=3, copies=2)
    assert len(data) == 2 * len(ours)
    np.testing.assert_array_equal(data.image, expected.image)
    np.testing.assert_array_equal(data.digit, expected.digit)


def test_perturbation_keeps_peak_ink_and_range():
    x = jnp.asarray(_tiny_batch()["image"])
    shape_only = jax.jit(lambda x, k: training.perturb(x, k, rotate=10.0, zoom=0.08, shear=0.1, elastic=0.5, blur=0.6))
    out = shape_only(x, _key(0))
    assert out.shape == x.shape and float(out.min()) >= -1.0 and float(out.max()) <= 1.0
    np.testing.assert_allclose(out.max(axis=(1, 2, 3)), x.max(axis=(1, 2, 3)), atol=1e-5)  # brightness kept
    assert float(jnp.abs(out - x).max()) > 0.1 and float(jnp.abs(out - shape_only(x, _key(1))).max()) > 0.1
    same = training.warp(x, _key(1), rotate=0.0, zoom=0.0, shear=0.0, elastic=0.0)
    np.testing.assert_allclose(same, x, atol=1e-6)


@pytest.fixture(scope="module")
def tiny():
    """A trainer without the random perturbation (so its loss is a function of the weights) and one batch."""
    off = dict(rotate=0.0, zoom=0.0, shear=0.0, elastic=0.0, gain=0.0, blur=0.0, noise=0.0)
    config = training.ScorerTrainConfig(steps=40, batch_size=32, warmup_steps=1, **off)
    return training.ScorerTrainer(config), _tiny_batch()


@pytest.mark.slow  # the bundled scorer is trained by this trainer and measured (test_scorer, README)
def test_a_few_trainer_steps_reduce_the_loss(tiny):
    trainer, batch = tiny
    state = trainer.init(_key(0))
    losses = []
    for i in range(41):
        state, metrics = trainer.step(state, batch, _key(i))  # metrics: the loss before the update
        losses.append(float(metrics["loss"]))
        assert float(metrics["skipped"]) == 0.0
    assert int(state.step) == 41
    assert losses[-1] < 0.5 * losses[0], losses
    assert isinstance(trainer.card(state), jp.Card)


@pytest.mark.slow  # ~10 s: by default a few trainer steps reduce the loss and the bundled weights are checked
def test_trainer_is_deterministic_and_skips_non_finite_batches(tiny):
    trainer, batch = tiny
    runs = []
    for _ in range(2):
        state = trainer.init(_key(5))
        for i in range(2):
            state, _ = trainer.step(state, batch, _key(i))
        runs.append(state)
    for a, b in zip(jax.tree.leaves(runs[0].params), jax.tree.leaves(runs[1].params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    bad = {**batch, "image": batch["image"].at[0, 0, 0, 0].set(jnp.nan)}
    kept = jax.tree.map(np.asarray, runs[0])  # the step donates the state it is given
    new, metrics = trainer.step(runs[0], bad, _key(9))
    assert float(metrics["skipped"]) == 1.0 and int(new.step) == int(kept.step) + 1
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(kept.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_large_config_builds_abstractly():
    big = nnx.eval_shape(lambda: DigitScorer(ScorerConfig.large(), rngs=nnx.Rngs(0)))
    n = sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(big, nnx.Param)))
    assert n > 10_000_000
    out = jax.eval_shape(lambda m, x: m(x), big, jax.ShapeDtypeStruct((2, 128, 128, 3), jnp.float32))
    assert {k: v.shape for k, v in out.items()} == {k: (2, n) for k, n in HEADS.items()}
