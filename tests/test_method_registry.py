"""A training method is one module plus one registration: ``register_method`` makes ``jaxpipe train`` offer it,
with the flag groups it names, through the one command path every built-in method takes."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jaxpipe.cli.train import build_train_app
from jaxpipe.training.methods import registry
from jaxpipe.training.methods.flags import LoRAFlags, PolicyFlags

BUILT_IN = ("flow-grpo", "nft", "dmd2", "self-forcing", "unified", "mot", "joint")


@pytest.fixture
def my_rl():
    info = registry.MethodInfo(
        "my-rl",
        "MyRL: a new policy-gradient method on a text-to-image card.",
        trainer="jaxpipe.training.methods.flow_grpo:FlowGRPO",
        config="jaxpipe.training.methods.flow_grpo:config_from_flags",
        flags=(PolicyFlags, LoRAFlags),
    )
    registry.register_method(info)
    yield info
    registry.unregister_method("my-rl")


def test_every_built_in_method_is_one_registration():
    assert tuple(registry.methods()) == BUILT_IN
    assert [c.name for c in build_train_app().registered_commands] == list(BUILT_IN)


def test_a_registered_method_becomes_a_train_command_with_its_flags(my_rl):
    app = build_train_app()
    assert [c.name for c in app.registered_commands][-1] == "my-rl"
    done = CliRunner().invoke(app, ["my-rl", "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "MyRL: a new policy-gradient method" in done.output
    for flag in ("--steps", "--sde-window", "--kl", "--lora-rank", "--model"):  # run, policy, LoRA, --model
        assert flag in done.output, flag
    assert "--preset" not in done.output  # no presets registered for it
    assert "--adv-clip" not in done.output  # NFT's group: not named by this registration


def test_bad_registrations_fail_clearly(my_rl):
    with pytest.raises(ValueError, match="'my-rl' is already registered"):
        registry.register_method(registry.MethodInfo("my-rl", "other", trainer="a:B", config="a:c"))
    with pytest.raises(ValueError, match="lowercase, no spaces"):
        registry.MethodInfo("My RL", "x", trainer="a:B", config="a:c")
    with pytest.raises(ValueError, match="MethodInfo.trainer must be 'module:attribute'"):
        registry.MethodInfo("x", "x", trainer="a.B", config="a:c")
    with pytest.raises(ValueError, match=r"no training method 'nope' \(registered: flow-grpo, nft"):
        registry.method("nope")
