"""Flow-matching finetuning and the autoencoder trainer learn on real digits, and guard bad steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpipe as jp
from jaxpipe.digits import data as digits
from jaxpipe.training.autoencoder import AutoencoderTrainConfig, AutoencoderTrainer
from jaxpipe.training.finetune import Finetune, FinetuneConfig
from jaxpipe.training.fit import fit
from conftest import leaves_equal


@pytest.fixture(scope="module")
def image_batch():
    images, labels = digits.load_images("train")
    data = digits.augment(images[:32], labels[:32], seed=0)
    tok = jp.cards.build("flux-t2i").spec.tokenizer
    return {"image": jnp.asarray(data.image), "ids": jnp.asarray(tok.encode(list(data.caption), 8))}


def test_flow_matching_loss_falls_and_frozen_parts_stay(image_batch):
    card = jp.cards.build("flux-t2i", seed=0)
    method = Finetune(card, FinetuneConfig(learning_rate=3e-3, warmup_steps=5, total_steps=60, cond_dropout=0.0))
    key = jax.random.key(0)
    # Same key every step: the loss is evaluated on identical (σ, ε) draws, so the drop is learning, not noise.
    state, history = fit(lambda s, b, k: method.step(s, b, key), method.init(), iter([image_batch] * 60),
                         steps=60, key=key, progress=False)
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    trained = method.card(state)
    assert leaves_equal(trained["vae"], card["vae"])
    assert not leaves_equal(trained["transformer"], card["transformer"])
    assert not leaves_equal(trained["text_encoder"], card["text_encoder"])
    assert int(state.step) == 60


@pytest.mark.slow  # the bundled wan-i2v card is trained this way and checked (test_pretrained.py)
def test_video_batches_condition_on_the_first_frame():
    images, labels = digits.load_images("train")
    vids = digits.make_videos(images[:8], labels[:8], seed=0)
    card = jp.cards.build("wan-i2v", seed=0)
    batch = {"video": jnp.asarray(vids.video), "ids": jnp.asarray(card.spec.tokenizer.encode(list(vids.caption), 8))}
    method = Finetune(card, FinetuneConfig(total_steps=10))
    state, metrics = method.step(method.init(), batch, jax.random.key(0))
    assert np.isfinite(float(metrics["loss"])) and float(metrics["skipped"]) == 0.0


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
    with pytest.raises(ValueError, match="sigma_sampling"):
        FinetuneConfig(sigma_sampling="cosine")
    with pytest.raises(ValueError, match="cond_dropout"):
        FinetuneConfig(cond_dropout=1.0)
    with pytest.raises(ValueError, match="steps"):
        fit(lambda s, b, k: (s, {}), None, iter([]), steps=0, key=jax.random.key(0))


def test_autoencoder_learns_to_reconstruct_and_whitens(image_batch):
    ae = jp.cards.build("flux-t2i", seed=0)["vae"]
    trainer = AutoencoderTrainer(ae, AutoencoderTrainConfig(learning_rate=3e-3, warmup_steps=5, total_steps=80))
    state, history = fit(trainer.step, trainer.init(), iter([{"image": image_batch["image"]}] * 80),
                         steps=80, key=jax.random.key(0), progress=False)
    assert history[-1]["recon"] < 0.3 * history[0]["recon"]
    model = trainer.model(state).fit_latent_stats(image_batch["image"])
    z = model.encode(image_batch["image"])
    np.testing.assert_allclose(z.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(z.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
    err_before = float(jnp.mean((trainer.model(state).decode(trainer.model(state).encode(image_batch["image"])) - image_batch["image"]) ** 2))
    err_after = float(jnp.mean((model.decode(z) - image_batch["image"]) ** 2))
    assert err_after == pytest.approx(err_before, rel=1e-3)  # whitening is invisible to reconstruction
