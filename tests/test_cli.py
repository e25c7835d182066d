"""The `jaxpipe` command line, on the bundled pretrained cards."""

import json
import subprocess
from pathlib import Path
import sys

import pytest
from PIL import Image
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe.cli import app
from jaxpipe.digits import workflows

runner = CliRunner()
pytestmark = pytest.mark.skipif(
    not {"flux-t2i", "wan-i2v"} <= set(jp.cards.available()), reason="bundled cards missing"
)


def test_generate_writes_a_gif_and_its_first_frame(tmp_path):
    out = tmp_path / "seven.gif"
    result = runner.invoke(app, ["generate", "seven thick moving right", "-o", str(out), "--steps", "4"])
    assert result.exit_code == 0, result.output
    assert "[2/2] wan-i2v: 'seven moving right'" in result.output
    gif = Image.open(out)
    assert gif.format == "GIF" and gif.n_frames > 1 and gif.size == (128, 128)
    assert Image.open(out.with_suffix(".png")).size == (128, 128)


def test_generate_is_the_workflow_served_by_an_engine(tmp_path):
    """One route: the CLI's GIF is byte for byte the engine's ``image_video.t2i_i2v`` output."""
    from jaxpipe.io import save_gif, save_png

    out = tmp_path / "cli.gif"
    result = runner.invoke(app, ["generate", "two bright moving up", "-o", str(out), "--steps", "2", "--seed", "3"])
    assert result.exit_code == 0, result.output
    engine = jp.Engine()
    engine.register(jp.cards.load("flux-t2i"))
    engine.register(jp.cards.load("wan-i2v"))
    engine.register_workflow(workflows.t2i_i2v())
    served = engine.run(jp.Request("image_video.t2i_i2v", prompt="two bright moving up", seed=3, num_steps=2))
    assert Path(save_gif(served["video"], tmp_path / "engine.gif")).read_bytes() == out.read_bytes()
    assert Path(save_png(served["image"], tmp_path / "engine.png")).read_bytes() == out.with_suffix(".png").read_bytes()


def test_generate_png_only(tmp_path):
    out = tmp_path / "one.png"
    result = runner.invoke(app, ["generate", "one thin left", "-o", str(out), "--steps", "3", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert Image.open(out).format == "PNG"


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "seven purple"], "vocabulary is"),
        (["generate", "thick left"], "no digit word"),
        (["generate", "seven", "-o", "x.mp4"], "must end in .gif or .png"),
        (["generate", "seven", "--steps", "0"], "--steps must be a positive integer"),
        (["generate", "seven", "--model", "no-such-card"], "not a bundled card"),
    ],
)
def test_bad_input_fails_clearly(args, message, tmp_path):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


def test_console_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "jaxpipe.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "generate" in result.stdout


@pytest.mark.slow  # ~8 s; the suite checks the independent numbers of train reports (test_train_cli)
def test_evaluate_reports_the_scorer_and_the_independent_judges(tmp_path):
    out = tmp_path / "quality.json"
    result = CliRunner().invoke(app, ["evaluate", "--samples", "4", "-o", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    t2i, i2v = report["t2i"], report["i2v"]
    assert 0.0 <= t2i["all_attributes_correct"] <= 1.0 and 0.0 <= t2i["independent"]["all_attributes_correct"] <= 1.0
    assert set(t2i["independent"]["attribute_accuracy"]) == {"stroke", "position", "brightness"}
    assert "last_frame_digit_accuracy" in i2v["independent"]
