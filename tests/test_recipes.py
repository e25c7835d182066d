"""Worlds register their training runs (``jaxpipe.training.runs.recipes``) and ``jaxpipe train --world W`` trains them:
the registry, its errors, the shapes world's GenEval runs (their prompt pool, the default presets, a CLI run) and a
command line that imports no world."""

import json
import pathlib
import re

import pytest
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe import evaluations
from jaxpipe.cli import app
from jaxpipe.cli.train import train_app
from jaxpipe.training.runs import recipes

runner = CliRunner()
CLI = pathlib.Path(__file__).resolve().parents[1] / "jaxpipe" / "cli"


def test_every_train_command_has_a_digits_recipe_and_shapes_trains_its_winning_presets():
    commands = {c.name for c in train_app.registered_commands}
    registered = recipes.recipes()
    assert commands == {m for w, m in registered if w == "digits"}
    for method, preset in (("nft", "geneval"), ("flow-grpo", "fast-nocfg")):
        found = recipes.recipe("shapes", method)
        assert (found.model, found.preset) == ("shapes-t2i", preset)
    assert recipes.worlds_of("dmd2") == ("digits",)
    assert recipes.recipe("digits", "nft").preset == "geneval" and recipes.recipe("digits", "flow-grpo").preset is None


def test_a_recipe_registry_that_refuses_clashes_and_names_what_exists():
    build = lambda card, config, settings: None  # noqa: E731
    mine = recipes.Recipe("moon", "nft", build=build, model="shapes-t2i", options={"craters": "how many"})
    recipes.register_recipe(mine)
    try:
        assert recipes.recipe("moon", "nft") is mine
        assert recipes.register_recipe(mine) is mine  # the same one again is fine
        with pytest.raises(ValueError, match="the moon world already has a nft recipe"):
            recipes.register_recipe(recipes.Recipe("moon", "nft", build=build, model="other"))
        with pytest.raises(
            ValueError, match=r"'depth' is not an option of the moon world's nft run \(its options: 'craters'\)"
        ):
            mine.check(recipes.RunSettings(options={"depth": 3}))
        mine.check(recipes.RunSettings(options={"craters": 3}))
    finally:
        recipes.unregister_recipe("moon", "nft")
    with pytest.raises(
        ValueError, match=r"no 'moon' world trains nft \(worlds with a nft run: digits, moon|digits, shapes\)"
    ):
        recipes.recipe("moon", "nft")
    with pytest.raises(TypeError, match="register_recipe takes a Recipe"):
        recipes.register_recipe("nft")
    with pytest.raises(ValueError, match="diversity needs >= 2 seeds"):
        recipes.RunSettings(diversity_seeds=1)


def test_the_command_line_imports_no_world():
    for module in sorted(CLI.glob("*.py")):
        source = module.read_text()
        assert not re.search(r"^\s*(from|import) jaxpipe\.(digits|shapes)\b", source, re.M), module.name
        assert not re.search(r"^\s*from jaxpipe import .*\b(digits|shapes)\b", source, re.M), module.name
    assert set(evaluations.evaluations()) >= {"digits", "shapes"}
    assert evaluations.evaluation("shapes").image == ("shapes-t2i", "t2i")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["nft", "--world", "moon"],
            "--world moon: no 'moon' world trains nft (worlds with a nft run: digits, shapes)",
        ),
        (["dmd2", "--world", "shapes"], "no 'shapes' world trains dmd2"),
        (["nft", "--world", "shapes", "--terms", "digit"], "--terms is not an option of the shapes world's nft run"),
        (["nft", "--world", "shapes", "--world-reward", "clip"], "reward must be one of geneval, judge (got 'clip')"),
        (["self-forcing", "--mention", "0.5"], "--mention is not an option of the digits world's self-forcing run"),
        (
            ["nft", "--world", "shapes", "--lr", "1e-4"],
            "drop --lr (or pass --preset none and set them all); the shapes world trains nft with --preset geneval",
        ),
        (
            ["flow-grpo", "--world", "shapes", "--preset", "fast"],
            "flow-grpo has no preset 'fast'; its presets: geneval",
        ),
        (["flow-grpo", "--scorer", "no-such-scorer"], "unknown card 'no-such-scorer': not a bundled card"),
    ],
)
def test_world_flags_fail_in_one_line_and_leave_no_out_folder(tmp_path, args, message):
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", *args, "--steps", "1", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_the_shapes_rl_prompt_pool_names_no_held_out_pair_and_no_test_prompt():
    """What RL trains on in the shapes world: train-split prompts of every category, none naming a held-out
    colour-shape pair (the held-out split measures transfer) and none of the multi-object test prompts."""
    from jaxpipe.shapes import grammar
    from jaxpipe.shapes.runs import training_prompts

    pool = list(training_prompts(24).texts)
    assert len(pool) > 400
    assert not any(grammar.parse(t).pairs & grammar.HELDOUT_PAIRS for t in pool)
    tests = {p.text for c in ("two_object", "counting", "position", "color_attr") for p in grammar.prompt_set(c, 24)}
    assert not tests & set(pool)
    assert {grammar.parse(t).category for t in pool} >= {"counting", "position", "color_attr", "colors"}


@pytest.mark.slow
@pytest.mark.skipif("shapes-t2i" not in jp.cards.available(), reason="bundled shapes card missing")
def test_train_nft_on_the_shapes_world_runs_its_preset_and_judges_by_geneval(tmp_path):
    out = tmp_path / "nft"
    args = ["train", "nft", "--world", "shapes", "--steps", "1", "-P", "1", "--eval-samples", "1"]
    result = runner.invoke(app, [*args, "--snr-rollouts", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "on the shapes world, preset geneval" in result.output and "wall clock: " in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["wall_seconds"] > report["train_seconds"]  # loading, evaluating and compiling included
    assert report["settings"]["config"]["group"]["size"] == 24 and report["settings"]["reward"] == "geneval"
    for split in ("train", "heldout"):
        assert set(report["after"][split]["accuracy"]) == {
            "single_object",
            "two_object",
            "counting",
            "colors",
            "position",
            "color_attr",
        }
    assert {"overall (test prompts)", "overall (held-out pairs)", "position (test prompts)"} <= set(report["summary"])
    assert jp.cards.load(out).model_id == "nft"
