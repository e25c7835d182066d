"""Flow-matching finetuning and the autoencoder trainer learn on real digits, and guard bad steps
(the guarded optimiser step every trainer shares, ``jaxpipe.training.update``, is tested here too)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import leaves_equal

import jaxpipe as jp
from jaxpipe.digits import data as digits
from jaxpipe.training import Finetune, FinetuneConfig, NoiseLevels, Optimizer, update
from jaxpipe.training.autoencoder import AutoencoderTrainConfig, AutoencoderTrainer
from jaxpipe.training.fit import fit


def warmup_cosine(learning_rate, warmup_steps, total_steps, weight_decay=1e-4):
    """The pretraining recipes' schedule (``FinetuneConfig``'s default optimiser) at other settings."""
    return Optimizer(
        learning_rate,
        weight_decay=weight_decay,
        schedule="warmup_cosine",
        warmup_steps=warmup_steps,
        total_steps=total_steps,
    )


@pytest.fixture(scope="module")
def image_batch():
    images, labels = digits.load_images("train")
    data = digits.augment(images[:32], labels[:32], seed=0)
    tok = jp.cards.build("flux-t2i").spec.tokenizer
    return {"image": jnp.asarray(data.image), "ids": jnp.asarray(tok.encode(list(data.caption), 8))}


def test_flow_matching_loss_falls_and_frozen_parts_stay(image_batch):
    card = jp.cards.build("flux-t2i", seed=0)
    method = Finetune(card, FinetuneConfig(optimizer=warmup_cosine(3e-3, 5, 60), cond_dropout=0.0))
    key = jax.random.key(0)
    # Same key every step: the loss is evaluated on identical (σ, ε) draws, so the drop is learning, not noise.
    state, history = fit(
        lambda s, b, k: method.step(s, b, key),
        method.init(),
        iter([image_batch] * 60),
        steps=60,
        key=key,
        progress=False,
    )
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    trained = method.card(state)
    assert leaves_equal(trained["vae"], card["vae"])
    assert not leaves_equal(trained["transformer"], card["transformer"])
    assert not leaves_equal(trained["text_encoder"], card["text_encoder"])
    assert int(state.step) == 60 and sorted(state.params) == ["model"]
    assert sorted(state.params["model"]) == ["text_encoder", "transformer"] and sorted(state.frozen) == ["vae"]


@pytest.mark.slow  # the bundled wan-i2v card is trained this way and checked (test_pretrained.py)
def test_video_batches_condition_on_the_first_frame():
    images, labels = digits.load_images("train")
    vids = digits.make_videos(images[:8], labels[:8], seed=0)
    card = jp.cards.build("wan-i2v", seed=0)
    batch = {"video": jnp.asarray(vids.video), "ids": jnp.asarray(card.spec.tokenizer.encode(list(vids.caption), 8))}
    method = Finetune(card, FinetuneConfig(optimizer=dataclasses.replace(FinetuneConfig().optimizer, total_steps=10)))
    state, metrics = method.step(method.init(), batch, jax.random.key(0))
    assert np.isfinite(float(metrics["loss"])) and float(metrics["skipped"]) == 0.0


@pytest.mark.slow  # ~11 s of its own compile; the guarded step's skip is unit-tested below in the default tier
def test_non_finite_step_is_skipped_and_leaves_state_unchanged(image_batch):
    card = jp.cards.build("flux-t2i", seed=0)
    method = Finetune(card)
    state = method.init()
    before = jax.tree.map(jnp.array, (state.params, state.opt_state))
    bad = {**image_batch, "image": image_batch["image"].at[0, 0, 0, 0].set(jnp.nan)}
    state, metrics = method.step(state, bad, jax.random.key(0))
    assert float(metrics["skipped"]) == 1.0
    assert leaves_equal((state.params, state.opt_state), before)


def test_bad_finetune_configs():
    card = jp.cards.build("flux-t2i", seed=0)
    with pytest.raises(ValueError, match="lacks"):
        Finetune(card, FinetuneConfig(trainable=("llm",)))
    with pytest.raises(ValueError, match="noise level sampling"):
        FinetuneConfig(noise=NoiseLevels("cosine"))
    with pytest.raises(ValueError, match="total_steps > 0"):
        FinetuneConfig(optimizer=warmup_cosine(1e-3, 5, 0))
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 0"):
        FinetuneConfig(optimizer=warmup_cosine(1e-3, -1, 10))
    with pytest.raises(ValueError, match="cond_dropout"):
        FinetuneConfig(cond_dropout=1.0)
    with pytest.raises(ValueError, match="steps"):
        fit(lambda s, b, k: (s, {}), None, iter([]), steps=0, key=jax.random.key(0))


@pytest.mark.slow  # ~10 s; the autoencoder recipe's first steps are also pinned by test_behaviour (-m slow)
def test_autoencoder_learns_to_reconstruct_and_whitens(image_batch):
    ae = jp.cards.build("flux-t2i", seed=0)["vae"]
    trainer = AutoencoderTrainer(ae, AutoencoderTrainConfig(optimizer=warmup_cosine(3e-3, 5, 80, weight_decay=0.0)))
    state, history = fit(
        trainer.step,
        trainer.init(),
        iter([{"image": image_batch["image"]}] * 80),
        steps=80,
        key=jax.random.key(0),
        progress=False,
    )
    assert history[-1]["recon"] < 0.3 * history[0]["recon"]
    model = trainer.model(state).fit_latent_stats(image_batch["image"])
    z = model.encode(image_batch["image"])
    np.testing.assert_allclose(z.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(z.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
    err_before = float(
        jnp.mean(
            (trainer.model(state).decode(trainer.model(state).encode(image_batch["image"])) - image_batch["image"]) ** 2
        )
    )
    err_after = float(jnp.mean((model.decode(z) - image_batch["image"]) ** 2))
    assert err_after == pytest.approx(err_before, rel=1e-3)  # whitening is invisible to reconstruction


# ------------------------------------------------------------------------------------------ the shared guard
def test_the_guarded_step_applies_finite_steps_and_skips_the_others():
    """``update.step``: a finite step moves the params and the Adam moments; a non-finite loss or gradient,
    or ``when=False``, keeps both bit for bit (``finite`` says which it was)."""
    tx = Optimizer(0.1).make()
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    opt = tx.init(params)
    loss = lambda p, x: (jnp.sum(p["w"] * x), {"x_sum": jnp.sum(x)})
    good = update.step(loss, tx, params, opt, jnp.array([1.0, 2.0, 3.0]))
    assert bool(good.finite) and float(update.skipped(good.finite)) == 0.0 and float(good.aux["x_sum"]) == 6.0
    assert not leaves_equal(good.params, params) and not leaves_equal(good.opt_state, opt)
    np.testing.assert_allclose(good.grad_norm, np.sqrt(14.0), rtol=1e-6)
    for bad in (jnp.array([jnp.nan, 1.0, 1.0]), jnp.array([jnp.inf, 0.0, 0.0])):
        out = update.step(loss, tx, params, opt, bad)
        assert not bool(out.finite) and float(update.skipped(out.finite)) == 1.0
        assert leaves_equal((out.params, out.opt_state), (params, opt))
    held = update.step(loss, tx, params, opt, jnp.array([1.0, 2.0, 3.0]), when=False)  # e.g. a warm-up
    assert bool(held.finite) and leaves_equal((held.params, held.opt_state), (params, opt))


def test_guarded_steps_skip_only_the_non_finite_step_and_leave_no_trace_in_adam():
    """``update.steps`` (a critic's several updates): per optimiser step, not all-or-nothing. The steps around a
    NaN one apply, and the result is exactly the two finite steps run alone (the skipped one left the Adam
    moments and count untouched)."""
    tx = Optimizer(0.1, b1=0.0).make()
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    opt = tx.init(params)
    xs = jnp.array([[1.0, 2.0, 3.0], [jnp.nan, 0.0, 0.0], [0.5, -1.0, 2.0]])  # any per-step input serves as the "keys"
    loss = lambda p, x: jnp.sum(p["w"] * x) + jnp.sum(p["w"] ** 2)
    got, got_opt, losses, norms, skips = jax.jit(lambda p, o: update.steps(loss, tx, p, o, xs))(params, opt)
    assert skips.tolist() == [0.0, 1.0, 0.0] and bool(jnp.isnan(losses[1])) and losses.shape == norms.shape == (3,)
    want, want_opt = params, opt
    for x in (xs[0], xs[2]):
        out = update.step(lambda p, x: (loss(p, x), None), tx, want, want_opt, x)
        want, want_opt = out.params, out.opt_state
    for a, b in zip(jax.tree.leaves((got, got_opt)), jax.tree.leaves((want, want_opt))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(optax.tree_utils.tree_get(got_opt, "count")) == 2  # two Adam steps counted, not three
