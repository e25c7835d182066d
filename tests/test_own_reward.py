"""Bring your own card, prompts and reward: a card from no world, a prompt file, a reward written here.

Through the Python API (a pure JAX reward and the same reward as host Python, inside the one jitted
step) and through the command line (``jaxpipe train flow-grpo --model FOLDER --prompts FILE --reward
FILE.py:function``) on a tiny random FLUX pipeline folder, the reward rises.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed

import jaxpipe as jp
from jaxpipe import prompts, rewards
from jaxpipe.cards import toy_t2i
from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, Sampling, rollout
from jaxpipe.training.fit import fit
from jaxpipe.training.runs.heldout import HeldOut, held_out_quality

WORDS = ("red", "blue", "green", "circle", "square", "small", "big")
PROMPTS = [
    "red circle",
    "blue square",
    "green circle",
    "big red square",
    "small blue circle",
    "green square",
    "big green circle",
    "small red square",
]
CONFIG = FlowGRPOConfig(
    group=Group(4),
    sampling=Sampling(num_steps=3, sampler="sde", sde_window=(0, 2)),
    beta=0.0,
    optimizer=Optimizer(3e-3),
)


def brightness(artifacts, prompts):
    """A user's reward: the mean pixel of each rendered image, (B, H, W, C) -> (B,)."""
    return jnp.mean(artifacts["image"], axis=(1, 2, 3))


@rewards.host
def host_brightness(artifacts, prompts):
    """The same reward as plain NumPy on the host (as a PyTorch model or an HTTP server would be called)."""
    assert isinstance(artifacts["image"], np.ndarray) and all(isinstance(p, str) for p in prompts)
    return artifacts["image"].mean(axis=(1, 2, 3))


@pytest.fixture(scope="module")
def card():
    """A text-to-image card of no world: a toy family with a vocabulary of its own, random weights."""
    card = toy_t2i.build(toy_t2i.Config(vocabulary=WORDS), seed=0, model_id="shapes-t2i")
    return card.replace(transformer=perturbed(card["transformer"], seed=1))


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("# my prompts\n" + "\n".join(PROMPTS) + "\n")
    return path


def test_your_reward_and_prompt_file_train_a_card_of_no_world(card, prompt_file):
    train, heldout = prompts.read(prompt_file).split(0.25, seed=0)
    assert (len(train), len(heldout)) == (6, 2) and set(train.texts) | set(heldout.texts) == set(PROMPTS)
    method = FlowGRPO(card, brightness, CONFIG)
    settings = HeldOut(samples=2, diversity_prompts=2, diversity_seeds=2, num_steps=3, guidance=1.0)
    before = held_out_quality(card, brightness, heldout, settings)
    state, history = fit(
        method.step, method.init(), train.batches(card, 2, seed=0), steps=12, key=jax.random.key(0), progress=False
    )
    rewards_seen = [row["reward_mean"] for row in history]
    assert np.mean(rewards_seen[-4:]) > np.mean(rewards_seen[:4]) + 0.05, rewards_seen
    after = held_out_quality(method.card(state), brightness, heldout, settings)
    assert after["reward_mean"] > before["reward_mean"], (before, after)  # on prompts it never trained on
    assert after["samples"] == 2 and after["diversity"] > 0


@pytest.mark.slow  # ~15 s: a second trainer compile; by default your reward and prompt file train a card of no world
def test_a_host_reward_scores_inside_the_one_jitted_step_like_the_jax_one(card):
    rows = prompts.PromptSet.from_list(PROMPTS[:2])
    batch = next(rows.batches(card, 2, seed=0))
    jax_method, host_method = FlowGRPO(card, brightness, CONFIG), FlowGRPO(card, host_brightness, CONFIG)
    state = jax_method.init()
    key = jax.random.key(3)
    ours, theirs = jax_method.rollout(state, batch, key), host_method.rollout(state, batch, key)
    np.testing.assert_allclose(theirs.rewards, ours.rewards, rtol=1e-6)
    np.testing.assert_array_equal(theirs.generated.images, ours.generated.images)
    # combined, each reward is a logged part and the total their weighted sum, inside jit as in a step
    both = rewards.combine({"bright": brightness, "host": host_brightness}, {"host": 0.5})
    repeated = batch.repeat(CONFIG.group.size)
    total, parts = jax.jit(lambda images: rewards.score(both, {"image": images}, repeated))(ours.generated.images)
    metrics = rollout.reward_metrics(total, parts)
    assert {"reward_bright", "reward_host"} <= set(metrics)
    np.testing.assert_allclose(metrics["reward_mean"], 1.5 * float(jnp.mean(ours.rewards)), rtol=1e-5)


def test_a_reward_of_the_wrong_shape_or_prompts_the_card_cannot_read_fail_clearly(card):
    with pytest.raises(ValueError, match="unknown word"):
        next(prompts.PromptSet.from_list(["purple triangle"]).batches(card, 1))
    batch = next(prompts.PromptSet.from_list(PROMPTS[:1]).batches(card, 1))
    method = FlowGRPO(card, lambda artifacts, prompts: jnp.ones((3,)), CONFIG)
    with pytest.raises(ValueError, match=r"returned shape \(3,\)"):
        method.step(method.init(), batch, jax.random.key(0))


# ------------------------------------------------------------------------------------------ the command line
@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    """A tiny random ``FluxPipeline`` saved by diffusers, tokenizers included (``test_real_pipelines``'s)."""
    pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
    from test_real_pipelines import flux_pipeline

    folder = tmp_path_factory.mktemp("flux-tiny")
    flux_pipeline().save_pretrained(folder)
    return folder


@pytest.mark.slow  # ~35 s: a subprocess-free CLI run, but its own compiles; the Python API path above is the default tier's
def test_jaxpipe_train_takes_your_model_folder_prompts_and_reward(flux_folder, tmp_path):
    from typer.testing import CliRunner

    from jaxpipe.cli import app

    (tmp_path / "prompts.txt").write_text("a red cat\na cat on the moon\nthe red moon\na seven\nthe cat\na red seven\n")
    (tmp_path / "my_reward.py").write_text(
        "import jax.numpy as jnp\n\n\ndef brightness(artifacts, prompts):\n"
        "    return jnp.mean(artifacts['image'], axis=(1, 2, 3))\n"
    )
    out = tmp_path / "run"
    args = [
        "train",
        "flow-grpo",
        "--model",
        str(flux_folder),
        "--model-option",
        "height=16",
        "--model-option",
        "width=16",
        "--model-option",
        "max_sequence_length=16",
        "--prompts",
        str(tmp_path / "prompts.txt"),
        "--reward",
        f"{tmp_path / 'my_reward.py'}:brightness",
        "--steps",
        "8",
        "--out",
        str(out),
        "-P",
        "2",
        "-K",
        "4",
        "--num-steps",
        "2",
        "--sde-window",
        "all",
        "--beta",
        "0",
        "--lr",
        "1e-3",
        "--heldout",
        "0.34",
        "--eval-samples",
        "2",
        "--diversity-prompts",
        "2",
        "--diversity-seeds",
        "2",
        "--save-every",
        "100",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards_seen = [row["reward_mean"] for row in rows]
    assert len(rows) == 8 and np.mean(rewards_seen[-3:]) > np.mean(rewards_seen[:3]), rewards_seen
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["prompts"]["heldout"] == 2 and "heldout_reward" in report["summary"]
    assert jp.cards.load(out).spec.family == "flux"  # the trained card loads back
