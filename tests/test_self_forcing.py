"""SelfForcing: the training rollout is the served rollout, where its gradient flows, the direction of an
update, the two finite guards, the non-causal refusal (tiny random causal student and bidirectional teacher)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed, rl_batch
from flax import nnx

import jaxpipe as jp
from jaxpipe import samplers
from jaxpipe.cards.checkpoint import save_card
from jaxpipe.digits import cards as digit_cards
from jaxpipe.loops import chunk
from jaxpipe.nn import DiTConfig
from jaxpipe.nn.causal_dit import ChunkCond
from jaxpipe.training import DistributionMatching, NoiseLevels, Optimizer, Sampling
from jaxpipe.training.distribution_matching import dm_gradient
from jaxpipe.training.methods.self_forcing import LOSS_KEY, SelfForcing, SelfForcingConfig

DIT = DiTConfig(dim=32, depth=1, heads=2)
CHUNKS = 2  # of 2 frames: a 4-frame video (8x8 latents), the smallest with a cache to fill and read
# the teacher guides (CFG 2, so g != 0 while the critic is still its copy); the student samples with one forward to
# keep the compiles small (its guided rollout is checked against the served one on the bundled card by
# benchmarks/self_forcing.py)
CONFIG = SelfForcingConfig(
    student=Optimizer(1e-3, b1=0.0),
    dm=DistributionMatching(critic=Optimizer(1e-3, b1=0.0), critic_steps=2, real_guidance=2.0),
    critic_warmup=1,
    sampling=Sampling(num_steps=2, guidance=1.0),
)


def leaves_equal(a, b) -> bool:
    """Same leaves bit for bit, compared in NumPy (no per-shape compiles of an eager comparison)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def teacher():
    card = jp.cards.build("wan-t2v", seed=5, config=digit_cards.config("wan-t2v", dit=DIT, frames=2 * CHUNKS))
    return card.replace(transformer=perturbed(card["transformer"], seed=6))


@pytest.fixture(scope="module")
def method(teacher):
    config = digit_cards.config("wan-causal", dit=DIT, frames=2 * CHUNKS, sampling=chunk.ChunkConfig(chunks=CHUNKS))
    card = jp.cards.build("wan-causal", seed=3, config=config)
    return SelfForcing(card.replace(transformer=perturbed(card["transformer"], seed=4)), teacher, CONFIG)


@pytest.fixture(scope="module")
def batch(method):
    return rl_batch(method.card(method.init()))


def test_training_rollout_is_the_served_rollout(method, batch):
    """Same keys => the differentiable training rollout renders the video the card's program serves."""
    state = method.init()
    trained = method.render(state, batch, jax.random.key(0))
    served = method.serve(state, batch, jax.random.key(0))
    assert trained.shape == served["latents"].shape == (2, 4, 8, 8, 4) and served["video"].shape == (2, 4, 16, 16, 1)
    np.testing.assert_allclose(trained, served["latents"], atol=1e-5)
    assert float(jnp.abs(trained[0] - trained[1]).max()) > 1e-2  # rows differ (prompt and key)
    assert float(jnp.abs(trained[:, -2:]).max()) > 1e-2  # the last chunk was generated too
    other = method.render(state, batch, jax.random.key(1))
    assert float(jnp.abs(other - trained).max()) > 1e-2  # the check can fail: other keys, other video


def test_gradient_flows_only_through_each_chunks_last_step(method, batch):
    """d⟨w, video⟩/dθ equals the sum over chunks of the last step alone, its input and cache held constant."""
    state = method.init()
    ids, keys = method._rows(batch, jax.random.key(0))
    w = jax.random.normal(jax.random.key(9), (2, 4, 8, 8, 4))

    @jax.jit
    def both(params):
        def weighted(p):
            video, trace = method.rollout_video(p, state.frozen, ids, keys)
            return jnp.sum(w * video), trace

        full, trace = jax.grad(weighted, has_aux=True)(params)
        start = method._start(method.components({"student": params}, state.frozen), ids, keys)

        def last_steps(p):
            model = method.components({"student": p}, state.frozen)[method.denoiser]
            total = 0.0
            for c in range(method.sampling.chunks):
                cache = jax.tree.map(lambda a, c=c: a[c], trace.cache)
                cond = ChunkCond(start.cond.context, start.cond.context_mask, cache)
                v = model.velocity(trace.x[c], trace.sigma[c], cond)
                clean = samplers.euler_step(trace.x[c], v, trace.sigma[c], jnp.zeros_like(trace.sigma[c]))
                total += jnp.sum(w[:, 2 * c : 2 * c + 2] * clean)
            return total

        return full, jax.grad(last_steps)(params)

    full, reference = both(state.params["student"])
    flat, ref = jax.tree.leaves(full), jax.tree.leaves(reference)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in flat)
    assert float(optax_norm(full)) > 1e-3
    for g, r in zip(flat, ref, strict=True):
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-5 * float(jnp.abs(r).max() + 1e-6))


def optax_norm(tree):
    return jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(tree)))


@pytest.mark.slow  # ~16 s (renders and scores twice); by default: the served rollout, the gradient path, the guard
def test_step_moves_the_video_toward_the_teacher(method, batch):
    """After a critic-only warm-up step, one student update moves its own (same-key) video against
    g = fake − real: ⟨Δvideo, g⟩ < 0."""
    start = method.init()
    state, metrics = method.step(start, batch, jax.random.key(1))  # warm-up: the critic alone moves
    assert float(metrics["student_updated"]) == 0.0 and float(metrics["skipped"]) == 0.0
    assert leaves_equal(state.params["student"], start.params["student"])
    assert not leaves_equal(state.params["critic"], start.params["critic"])
    key = jax.random.key(2)
    new, metrics = method.step(state, batch, key)
    assert float(metrics["student_updated"]) == 1.0 and float(metrics["critic_skipped"]) == 0.0
    assert all(np.isfinite(float(v)) for v in metrics.values()) and int(new.step) == 2
    assert not leaves_equal(new.params["student"], state.params["student"])
    assert not leaves_equal(new.params["critic"], state.params["critic"])
    assert leaves_equal(new.copies["teacher"], state.copies["teacher"]) and leaves_equal(new.frozen, state.frozen)
    before, after = method.render(state, batch, key), method.render(new, batch, key)
    ids, _ = method._rows(batch, key)
    real, fake = jax.jit(method.scores)(state, before, ids, jax.random.fold_in(key, LOSS_KEY))
    g = dm_gradient(before, real, fake)
    assert float(jnp.mean(jnp.abs(g))) > 1e-2
    moved = float(jnp.sum((after - before) * g))
    assert moved < 0, moved
    # the returned card serves what it trained: its program renders the trained rollout
    np.testing.assert_allclose(method.serve(new, batch, key)["latents"], after, atol=1e-5)


@pytest.mark.slow  # ~15 s of extra compiles; the non-finite guard is shared (update.step) and tested in the default tier by test_finetune
def test_non_finite_steps_skip_each_optimiser(method, batch):
    state = method.init()._replace(step=jnp.asarray(CONFIG.critic_warmup, jnp.int32))  # past the warm-up
    poison = lambda tree, name: jax.tree_util.tree_map_with_path(
        lambda path, a: a * jnp.inf if name in jax.tree_util.keystr(path) else a, tree
    )
    # an infinite teacher DiT: the student's gradient is not finite (skipped); the critic still learns
    bad_teacher = state._replace(copies={"teacher": poison(state.copies["teacher"], "'transformer'")})
    new, metrics = method.step(bad_teacher, batch, jax.random.key(3))
    assert float(metrics["skipped"]) == 1.0 and float(metrics["critic_skipped"]) == 0.0
    assert float(metrics["student_updated"]) == 0.0
    assert leaves_equal(new.params["student"], state.params["student"])
    assert leaves_equal(new.opt_state["student"], state.opt_state["student"])
    assert not leaves_equal(new.params["critic"], state.params["critic"]) and int(new.step) == state.step + 1
    # an infinite critic: every critic update is skipped, and the student's too (the fake score is not finite)
    bad_critic = state._replace(params={**state.params, "critic": poison(state.params["critic"], "proj_out")})
    new, metrics = method.step(bad_critic, batch, jax.random.key(3))
    assert float(metrics["critic_skipped"]) == CONFIG.dm.critic_steps and float(metrics["skipped"]) == 1.0
    assert leaves_equal(new.params["student"], state.params["student"])
    for a, b in zip(jax.tree.leaves(new.params["critic"]), jax.tree.leaves(bad_critic.params["critic"]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_non_causal_cards_and_bad_configs_are_refused(teacher, t2i_card, method, tmp_path):
    for card in (teacher, t2i_card):
        with pytest.raises(ValueError, match="chunk_rollout"):
            SelfForcing(card, teacher, CONFIG)
    with pytest.raises(ValueError, match="critic_steps"):
        SelfForcingConfig(dm=DistributionMatching(critic_steps=0))
    with pytest.raises(ValueError, match="critic_warmup"):
        SelfForcingConfig(critic_warmup=-1)
    with pytest.raises(ValueError, match="noise.min must be > 0"):
        SelfForcingConfig(dm=DistributionMatching(noise=NoiseLevels(min=0.0)))
    # the trained card saves and loads as a causal card with the trained sampling
    trained = method.card(method.init())
    loaded = jp.cards.load(save_card(trained, tmp_path / "sf"))
    assert loaded.spec.loops[0].kind == "chunk_rollout" and loaded.spec.loops[0].config == method.sampling
    assert isinstance(loaded.spec.loops[0].config, chunk.ChunkConfig)
    assert leaves_equal(nnx.state(loaded["transformer"], nnx.Param), nnx.state(trained["transformer"], nnx.Param))


def test_the_cli_run_trains_on_digit_and_motion_prompts(method, teacher):
    """What `jaxpipe train self-forcing` builds (runs.self_forcing_run): the trainer, its prompt stream
    (digit-and-motion captions in the student's vocabulary) and curves; the run itself is -m slow below."""
    from jaxpipe.digits import data as digits
    from jaxpipe.digits import runs

    card = method.card(method.init())
    run = runs.self_forcing_run(
        card, teacher, jp.cards.build("digit-scorer", seed=0), CONFIG, prompts_per_step=3, seed=1
    )
    assert run.name == "self-forcing" and isinstance(run.method, SelfForcing) and "losses.png" in run.curves
    batch = next(run.batches)
    assert batch.ids.shape == (3, card["text_encoder"].cfg.max_len) and set(batch.metadata) == {"digit", "motion"}
    caption = digits.caption(int(batch.metadata["digit"][0]), motion=int(batch.metadata["motion"][0]))
    assert batch.strings()[0] == caption
    np.testing.assert_array_equal(batch.ids[:1], card.spec.tokenizer.encode([caption], batch.ids.shape[1]))
    assert run.settings["teacher"] == teacher.model_id


@pytest.mark.slow  # ~17 s: a second compile of the step (the CLI builds its own trainer); the run's parts are tested above
def test_train_self_forcing_on_the_cli_writes_its_run_and_a_loadable_causal_card(method, teacher, tmp_path):
    """`jaxpipe train self-forcing` on card directories (the tiny student and teacher): metrics, curves,
    report and the trained causal card (the same settings as CONFIG, so the same compiled step)."""
    from typer.testing import CliRunner

    from jaxpipe.cli import app

    student = save_card(method.card(method.init()), tmp_path / "student")
    real = save_card(teacher, tmp_path / "teacher")
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "self-forcing",
            "--model",
            str(student),
            "--teacher",
            str(real),
            "--out",
            str(out),
            "--no-eval",
            "--steps",
            "2",
            "-P",
            "2",
            "-K",
            "1",
            "--num-steps",
            "2",
            "--critic-steps",
            "2",
            "--critic-warmup",
            "1",
            "--lr",
            "1e-3",
            "--critic-lr",
            "1e-3",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["student_updated"] for r in rows] == [0.0, 1.0] and all(np.isfinite(r["critic_loss"]) for r in rows)
    assert (out / "losses.png").is_file() and json.loads((out / "report.json").read_text())["method"] == "self-forcing"
    trained = jp.cards.load(out)
    assert trained.spec.loops[0].kind == "chunk_rollout"
    assert not leaves_equal(
        nnx.state(trained["transformer"], nnx.Param), nnx.state(jp.cards.load(student)["transformer"], nnx.Param)
    )
