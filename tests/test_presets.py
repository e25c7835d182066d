"""The official RL recipes as presets: the fields the official configs set, the 2-core batch, and the CLI's --preset."""

import pytest
from typer.testing import CliRunner

from jaxpipe.cli import app
from jaxpipe.training import presets


def test_presets_carry_the_official_settings():
    grpo = presets.get("flow-grpo", "geneval")
    c = grpo.config
    assert (c.group.size, c.group.adv_clip, c.group.global_std) == (24, 5.0, True)
    assert c.sampling.sampler == "sde" and c.sampling.num_steps == 10 and c.sampling.guidance is None  # the card's CFG
    assert (c.clip_eps, c.beta, c.kl, c.detach_uncond, c.filter_zero_advantages) == (1e-4, 0.04, "flowgrpo", True, True)
    assert (c.lora.rank, c.lora.alpha) == (32, 64.0)
    assert (c.optimizer.learning_rate, c.optimizer.weight_decay) == (3e-4, 1e-4)
    assert c.ppo.steps_kept(10) == 9 and c.ppo.updates == 2
    assert grpo.images_per_step == 96 and grpo.official_prompts_per_step == 48
    fast = presets.get("flow-grpo", "fast-nocfg").config
    assert fast.sampling.guidance == 1.0 and fast.sampling.sde_window == (0, 2)
    nft = presets.get("nft", "geneval").config
    assert (nft.weighting, nft.kl_beta, nft.schedule_levels, nft.sampling.guidance) == ("adaptive", 1e-4, 9, 1.0)
    assert nft.ema.start == 0.001 and nft.ema.start + (
        nft.ema.end - nft.ema.start
    ) * 100 / nft.ema.ramp_steps == pytest.approx(0.101)
    assert presets.get("nft", "geneval", prompts_per_step=48).images_per_step == 1152
    with pytest.raises(ValueError, match="its presets: geneval"):
        presets.get("nft", "fast-nocfg")
    with pytest.raises(ValueError, match="no presets for method"):
        presets.get("dmd2", "geneval")


def test_the_cli_refuses_method_flags_beside_a_preset_and_unknown_presets(tmp_path):
    runner = CliRunner()
    args = ["train", "flow-grpo", "--steps", "1", "--out", str(tmp_path / "a"), "--preset", "geneval"]
    done = runner.invoke(app, [*args, "--beta", "0.1"])
    assert done.exit_code != 0 and "drop --beta" in done.output
    done = runner.invoke(app, ["train", "nft", "--steps", "1", "--out", str(tmp_path / "b"), "--preset", "nope"])
    assert done.exit_code != 0 and "nft has no preset 'nope'" in done.output
