"""`jaxpipe train unified | joint | nft`: tiny runs write metrics, curves, a report and a loadable card; bad flags fail
clearly. (`train flow-grpo`'s outputs are checked in test_stop_resume.py, with its stop and resume.)"""

import json
import math
import re

import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe.cards.checkpoint import save_card
from jaxpipe.cli import app
from jaxpipe.digits import data as digits
from jaxpipe.digits import prompts as digit_prompts
from jaxpipe.digits import runs as rl_runs

runner = CliRunner()
needs_cards = pytest.mark.skipif(
    not {"flux-t2i", "unified", "digit-scorer"} <= set(jp.cards.available()), reason="bundled cards missing"
)
TINY = [
    "--steps",
    "2",
    "-P",
    "2",
    "-K",
    "2",
    "--num-steps",
    "2",
    "--sde-window",
    "0,1",
    "--eval-samples",
    "4",
    "--diversity-prompts",
    "2",
    "--diversity-seeds",
    "2",
]


def read_metrics(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1]  # one object per step
    assert all(math.isfinite(row["reward_mean"]) for row in rows)
    return rows


def same(a, b):
    return all(bool(np.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow  # ~25 s: a whole unified CLI run; the UnifiedRL trainer itself is tested in test_unified_rl
@needs_cards
def test_train_unified_prompt_only_logs_refined_vs_original_and_keeps_the_generator(tmp_path):
    out = tmp_path / "uni"
    result = runner.invoke(
        app,
        ["train", "unified", "--out", str(out), "--prompt-only", "--prefer", "stroke=thick", "--mention", "0.5", *TINY],
    )
    assert result.exit_code == 0, result.output
    rows = read_metrics(out)
    assert all(math.isfinite(row["reward_refined"]) and math.isfinite(row["reward_original"]) for row in rows)
    for png in ("reward.png", "refined_vs_original.png"):
        assert Image.open(out / png).format == "PNG"
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert {"refined_all_right", "original_all_right", "preferred_word_rate", "diversity"} <= set(summary)
    # every judged number twice: by the scorer (the reward) and by the independent evaluators
    assert {"refined_all_right (independent)", "original_all_right (independent)", "reward_vs_independent"} <= set(
        summary
    )
    after = json.loads((out / "report.json").read_text())["after"]
    assert set(after["refined"]["independent"]) == {"all_right", "prompted_right", "accuracy"}
    trained, base = jp.cards.load(out), jp.cards.load("unified")
    assert same(trained["transformer"], base["transformer"])  # prompt-only: generator untouched
    assert not same(trained["llm"], base["llm"])
    jp.Engine().register(trained)


@needs_cards
def test_the_nft_and_dmd2_runs_judge_their_cards_and_draw_their_curves(t2i_card):
    """What `train nft` / `train dmd2` build (their full CLI runs below are -m slow: two more compiled steps;
    the CLI path they share, `_train` and `runs.execute`, runs in the suite with flow-grpo and unified)."""
    from jaxpipe.training import DMD2, DiffusionNFT, DiffusionNFTConfig, DMD2Config, Sampling

    scorer = jp.cards.load("digit-scorer")
    nft = rl_runs.nft_run(t2i_card, scorer, DiffusionNFTConfig(sampling=Sampling(num_steps=3)), prompts_per_step=2)
    assert isinstance(nft.method, DiffusionNFT) and {"reward.png", "loss.png", "old_policy.png"} <= set(nft.curves)
    dmd = rl_runs.dmd2_run(t2i_card, scorer, DMD2Config(student_steps=2), prompts_per_step=2)
    assert isinstance(dmd.method, DMD2) and dmd.name == "dmd2 (2-step student)" and "dm_loss" in dmd.summary_keys
    assert next(dmd.batches).ids.shape[0] == 2 and dmd.settings["config"]["student_steps"] == 2
    assert dmd.method.card(dmd.method.init(jax.random.key(0))).spec.config.sampling.num_steps == 2


@needs_cards
@pytest.mark.slow  # ~10 s (a compiled NFT step); the run's parts are tested above and in test_nft
def test_train_nft_writes_its_curves_and_a_loadable_card_and_keeps_the_text_encoder(tmp_path, t2i_card):
    out, base = tmp_path / "nft", save_card(t2i_card, tmp_path / "tiny")  # a tiny card directory: small compiles
    tiny = [a for a in TINY if a not in ("--sde-window", "0,1")]
    result = runner.invoke(
        app,
        [
            "train",
            "nft",
            "--out",
            str(out),
            "--model",
            str(base),
            "--no-eval",
            "--preset",
            "none",
            "--beta",
            "0.5",
            "--ema-ramp",
            "0",
            *tiny,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "gradient signal-to-noise" in result.output  # measured by default at the start of an nft run
    noise = json.loads((out / "gradient_snr.json").read_text())
    assert noise["rollouts"] == 4 and noise["images"] == 4 and math.isfinite(noise["snr"])
    rows = read_metrics(out)
    assert all(0.0 <= row["r_mean"] <= 1.0 and row["ema_decay"] == 0.5 and row["skipped"] == 0.0 for row in rows)
    for png in ("reward.png", "loss.png", "old_policy.png"):
        assert Image.open(out / png).format == "PNG"
    report = json.loads((out / "report.json").read_text())
    assert report["method"] == "nft" and report["settings"]["config"]["beta"] == 0.5
    assert report["gradient_snr"] == noise
    trained, base = jp.cards.load(out), jp.cards.load(base)
    assert same(trained["text_encoder"], base["text_encoder"]) and not same(trained["transformer"], base["transformer"])
    jp.Engine().register(trained)


@needs_cards
@pytest.mark.slow  # ~20 s (a compiled FlowGRPO step with adapters); LoRA training is tested by default in test_lora
def test_train_flow_grpo_with_lora_saves_a_merged_card_that_serves(tmp_path, t2i_card):
    out, base = tmp_path / "lora", save_card(t2i_card, tmp_path / "tiny")
    result = runner.invoke(
        app,
        [
            "train",
            "flow-grpo",
            "--out",
            str(out),
            "--model",
            str(base),
            "--eval-every",
            "1",
            "--snr-rollouts",
            "0",
            "--lr",
            "1e-2",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "8",
            "--lora-targets",
            "attn.q,attn.kv,mlp.fc1",
            *TINY,
        ],
    )
    assert result.exit_code == 0, result.output
    read_metrics(out)
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["config"]["lora"]["rank"] == 4
    assert "gradient_snr" not in report and not (out / "gradient_snr.json").exists()  # --snr-rollouts 0
    judged = [json.loads(line) for line in (out / "evaluations.jsonl").read_text().splitlines()]
    assert [row["step"] for row in judged] == [0, 1, 2] and report["curve"] == judged  # before, every step, after
    assert judged[0]["all_attributes_correct"] == report["before"]["all_attributes_correct"]
    assert Image.open(out / "evaluation.png").format == "PNG"
    assert report["settings"]["config"]["lora"]["target_modules"] == ["attn.q", "attn.kv", "mlp.fc1"]
    trained, base = jp.cards.load(out), jp.cards.load(base)  # the plain DiT: the adapters are merged in
    assert same(trained["text_encoder"], base["text_encoder"]) and not same(trained["transformer"], base["transformer"])
    flat = lambda card: nnx.to_flat_state(nnx.state(card["transformer"], nnx.Param))
    changed = [
        "/".join(map(str, path))
        for (path, a), (_, b) in zip(flat(trained), flat(base))
        if not np.array_equal(a[...], b[...])
    ]
    assert changed and all(re.search(r"(attn/(q|kv)|mlp/fc1)/kernel$", path) for path in changed)  # the targets only
    jp.Engine().register(trained)


@needs_cards
@pytest.mark.slow  # ~18 s (a compiled DMD2 step); the run's parts are tested above and in test_dmd2
def test_train_dmd2_writes_its_curves_and_a_few_step_student_card(tmp_path, t2i_card):
    out, base = tmp_path / "turbo", save_card(t2i_card, tmp_path / "tiny")  # a tiny teacher directory: small compiles
    result = runner.invoke(
        app,
        [
            "train",
            "dmd2",
            "--out",
            str(out),
            "--model",
            str(base),
            "--no-eval",
            "--steps",
            "2",
            "-P",
            "2",
            "-K",
            "1",
            "--student-steps",
            "1",
            "--critic-steps",
            "2",
            "--guidance",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1] and all(math.isfinite(row["dm_loss"]) for row in rows)
    for png in ("losses.png", "gaps.png"):
        assert Image.open(out / png).format == "PNG"
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["config"]["dm"]["real_guidance"] == 3.0 and "dm_loss" in report["rewards"]
    student, teacher = jp.cards.load(out), jp.cards.load(base)
    assert student.spec.config.sampling.num_steps == 1 and student.spec.config.sampling.guidance == 1.0
    assert same(student["text_encoder"], teacher["text_encoder"]) and not same(
        student["transformer"], teacher["transformer"]
    )
    engine = jp.Engine()
    engine.register(student)
    assert engine.run(jp.Request(student.model_id, prompt="seven thick"))["image"].shape == (16, 16, 1)


@needs_cards
@pytest.mark.slow  # the tour notebook runs `train joint` and shows its per-expert curves by default
def test_train_joint_writes_per_expert_curves_and_a_loadable_multi_expert_card(tmp_path):
    out = tmp_path / "joint"
    result = runner.invoke(app, ["train", "joint", "--out", str(out), "--refiners", "3", "--prompt-only", *TINY])
    collapsed = json.loads((out / "report.json").read_text())["summary"]["diversity_collapse"]
    assert result.exit_code == (3 if collapsed else 0), result.output  # a FAILED verdict exits 3
    rows = read_metrics(out)
    assert all(f"refiner_{i}_loss" in rows[0] for i in range(3))
    assert {"reward_stroke", "reward_position", "reward_brightness"} <= set(rows[0])
    for png in ("reward.png", "reward_per_expert.png", "refiner_losses.png"):
        assert Image.open(out / png).format == "PNG"
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert {"preferred_stroke_rate", "preferred_position_rate", "preferred_brightness_rate"} <= set(summary)
    trained = jp.cards.load(out)
    assert trained.spec.config.num_refiners == 3
    assert same(trained["transformer"], jp.cards.load("unified")["transformer"])  # prompt-only
    jp.Engine().register(trained)


@pytest.mark.parametrize(
    "args, message",
    [
        (["flow-grpo", "-K", "1"], "group size (K) must be >= 2"),
        (["flow-grpo", "--terms", "digit,colour"], "unknown reward term(s) ['colour']"),
        (["flow-grpo", "--terms", "stroke"], "must include digit"),
        (["flow-grpo", "--sde-window", "0-4"], "--sde-window must be START,STOP"),
        (["flow-grpo", "--steps", "0"], "--steps must be a positive integer"),
        (["flow-grpo", "--diversity-seeds", "1"], "diversity needs >= 2 seeds"),
        (["unified", "-K", "3", "--skip", "3"], "skip must be in 0..K-1"),
        (["unified", "--prefer", "stroke=wide"], "preferred stroke must be one of thin, thick"),
        (["unified", "--prefer", "colour=red"], "a preference is ATTRIBUTE=WORD"),
        (["unified", "--prefer", "stroke=thick", "--mention", "1"], "with mention 1 every prompt names it"),
        (["unified", "--prefer", "stroke=thick", "--terms", "digit,position"], "needs stroke among the reward terms"),
        (["joint", "--credit", "blame"], "credit must be one of"),
        (["flow-grpo", "--kl", "official"], "kl must be one of ('exact', 'flowgrpo')"),
        (["flow-grpo", "--minibatches", "3"], "minibatches=3 must divide the rollout's 16 rows"),
        (["joint", "-P", "2", "-K", "3", "--minibatches", "4"], "minibatches=4 must divide the rollout's 6 rows"),
        (["unified", "--timestep-fraction", "0"], "timestep_fraction must be in (0, 1]"),
        (["flow-grpo", "--timestep-fraction", "1.5"], "timestep_fraction must be in (0, 1]"),
        (["unified", "--inner-epochs", "0"], "inner_epochs must be a positive int"),
        (["unified", "--kl", "approx"], "kl must be one of"),
        (["joint", "-K", "2", "--skip", "2"], "skip must be in 0..K-1"),
        (
            ["mot", "-K", "2", "--skip", "2"],
            "skip must be in 0..K-1 = 0..1: at least one sample per group must rewrite",
        ),
        (["mot", "--minibatches", "5"], "minibatches=5 must divide the rollout's 16 rows"),
        (["mot", "--token-weight", "-1"], "token_weight must be >= 0"),
        (["nft", "--preset", "none", "--beta", "0"], "beta must be in (0, 1]"),
        (
            ["nft", "--beta", "0.5"],
            "drop --beta (or pass --preset none and set them all); the digits world trains nft with --preset geneval",
        ),
        (["nft", "--preset", "none", "--sigma-sampling", "beta"], "noise level sampling must be one of"),
        (["flow-grpo", "--lora-rank", "-1"], "--lora-rank must be >= 0"),
        (
            ["nft", "--preset", "none", "--lora-alpha", "8"],
            "--lora-alpha and --lora-targets set up LoRA adapters: they need --lora-rank",
        ),
        (["dmd2", "--lora-rank", "4", "--lora-alpha", "0"], "LoRAConfig.alpha must be a finite number > 0"),
        (["unified", "--lora-rank", "4", "--prompt-only"], "which prompt-only RL (joint=False) keeps frozen"),
        (["flow-grpo", "--lora-rank", "4", "--lora-targets", " , "], "--lora-targets must name layers"),
        (["flow-grpo", "--snr-rollouts", "1"], "--snr-rollouts must be 0 (off) or >= 2"),
        (["nft", "--eval-every", "2", "--no-eval"], "--eval-every must be a positive number of steps, with --eval"),
    ],
)
def test_bad_flags_fail_clearly_before_any_work(args, message, tmp_path):
    command, *rest = args
    base = ["train", command, "--out", str(tmp_path / "x")]
    if "--steps" not in rest:
        base += ["--steps", "2"]
    result = runner.invoke(app, base + rest)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "x").exists()


@needs_cards
@pytest.mark.parametrize(
    "command, model, message",
    [
        ("unified", "flux-t2i", "needs a card with a refiner LM"),
        ("flow-grpo", "unified", "use `train unified`"),
        ("mot", "unified", "needs a Mixture-of-Transformers card"),
        ("dmd2 --student-steps 9", "flux-t2i", "exceeds the teacher's 8 sampling steps"),
        ("self-forcing", "wan-t2v", "SelfForcing trains a causal card"),
        (
            "flow-grpo --lora-rank 2 --lora-targets to_q",
            "flux-t2i",
            "component 'transformer': LoRA: target_modules ('to_q',) match no linear layer of DiT",
        ),
    ],
)
def test_the_wrong_card_fails_clearly(command, model, message, tmp_path):
    result = runner.invoke(
        app, ["train", *command.split(), "--steps", "2", "--out", str(tmp_path / "x"), "--model", model]
    )
    assert result.exit_code == 2 and message in result.output, result.output


def test_prompts_name_what_they_label_and_preferences_fill_the_rest():
    spec = rl_runs.PromptSpec(mention=0.5, prefer=(("stroke", 1),))
    prompts = digit_prompts.sample_prompts(spec, 200, np.random.default_rng(0))
    for i, text in enumerate(prompts.captions):
        parsed = digits.parse_caption(text)
        assert parsed["digit"] == prompts.labels["digit"][i]
        for name in digits.ATTRIBUTES:
            assert (parsed[name] is not None) == prompts.named[name][i]
            if prompts.named[name][i]:
                assert parsed[name] == prompts.labels[name][i]
    unnamed = ~prompts.named["stroke"]
    assert 0 < unnamed.sum() < 200 and np.all(prompts.labels["stroke"][unnamed] == 1)  # preferred: thick
    assert np.all(prompts.labels["position"][~prompts.named["position"]] == -1)  # not preferred: not rewarded
    full = digit_prompts.sample_prompts(rl_runs.PromptSpec(), 20, np.random.default_rng(0))
    assert all(len(c.split()) == 4 for c in full.captions)  # mention 1: full compositional prompts


def test_a_scorer_gain_the_independent_judges_do_not_see_is_flagged_as_reward_hacking():
    from jaxpipe.digits.runs import HACKING_GAP, _judged

    def judged(scorer, independent):
        return {"run_prompts": {"all_right": scorer, "independent": {"all_right": independent}}}

    headline = {"run_prompts_all_right": ("run_prompts", "all_right")}
    agree = _judged(judged(0.80, 0.78), judged(0.90, 0.87), headline)
    assert agree["run_prompts_all_right"]["change"] == pytest.approx(0.10)
    assert agree["run_prompts_all_right (independent)"]["change"] == pytest.approx(0.09)
    assert agree["reward_vs_independent"].startswith("reward and independent evaluators agree")
    hacked = _judged(judged(0.80, 0.78), judged(0.95, 0.78 + 0.15 - HACKING_GAP - 0.01), headline)
    assert (
        hacked["reward_vs_independent"].startswith("REWARD HACKING")
        and "run_prompts_all_right" in hacked["reward_vs_independent"]
    )
