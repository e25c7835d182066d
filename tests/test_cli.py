"""The `jaxpipe` command line, on the bundled pretrained cards."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

import jaxpipe as jp
import jaxpipe.shapes as jp_shapes
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
    """A .png is the text-to-image card alone, on the prompt as typed: no digits grammar splits it."""
    out = tmp_path / "one.png"
    result = runner.invoke(app, ["generate", "one thin left moving up", "-o", str(out), "--steps", "3", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert "[1/1] flux-t2i: 'one thin left moving up'" in result.output
    assert Image.open(out).format == "PNG" and list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "seven purple"], "vocabulary is"),
        (["generate", "thick left"], "no digit word"),
        (["generate", "seven", "-o", "x.mp4"], "must end in .gif or .png"),
        (["generate", "seven", "--steps", "0"], "--steps must be a positive int"),
        (["generate", "seven", "--model", "no-such-card"], "not a bundled card"),
    ],
)
def test_bad_input_fails_clearly(args, message, tmp_path):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


def test_generate_renders_a_text_to_video_card(tmp_path):
    out = tmp_path / "seven.gif"
    result = runner.invoke(
        app, ["generate", "seven moving right", "--model", "wan-t2v", "-o", str(out), "--steps", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "[1/1] wan-t2v: 'seven moving right'" in result.output
    gif = Image.open(out)
    assert gif.format == "GIF" and gif.n_frames == 8 and gif.size == (128, 128)
    assert list(tmp_path.iterdir()) == [out]  # a video card writes its video alone


def test_generate_animates_a_given_image(tmp_path):
    picture = np.zeros((128, 128), np.uint8)
    picture[32:96, 56:72] = 255  # a bar, 8× upscaled as the command writes its images
    Image.fromarray(picture).save(tmp_path / "bar.png")
    out = tmp_path / "bar.gif"
    result = runner.invoke(
        app,
        [
            "generate",
            "one moving left",
            "--model",
            "wan-i2v",
            "--image",
            str(tmp_path / "bar.png"),
            "-o",
            str(out),
            "--steps",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"[1/1] wan-i2v: {tmp_path / 'bar.png'} 'one moving left'" in result.output
    first = np.asarray(Image.open(out).convert("L"), np.float32) / 255.0
    assert np.abs(first - picture / 255.0).mean() < 0.1  # frame 0 is the given image


GENERATORS = [m for m in jp.cards.available() if m not in ("digit-scorer", "digit-classifier")]


@pytest.mark.slow  # one compile per card (~3-20 s each from a cold cache); the default tier renders wan-t2v and flux-t2i
@pytest.mark.parametrize("model", GENERATORS)
def test_every_bundled_card_renders_from_the_command_line(model, tmp_path):
    card = jp.cards.load(model)
    video = any(c in card.spec.capabilities for c in ("t2v", "i2v"))
    out = tmp_path / ("out.gif" if video else "out.png")
    digits = "seven" in card.spec.tokenizer.words  # a card of another world speaks its own words
    prompt = (
        ("seven moving right" if video else "seven")
        if digits
        else ("a red circle moving right" if video else "a red circle")
    )
    args = ["generate", prompt, "--model", model, "-o", str(out), "--steps", "1"]
    if "i2v" in card.spec.capabilities:
        assert (
            runner.invoke(app, ["generate", "seven", "-o", str(tmp_path / "first.png"), "--steps", "1"]).exit_code == 0
        )
        args += ["--image", str(tmp_path / "first.png")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    if video:
        assert Image.open(out).n_frames == 8
    else:
        assert Image.open(out).format == "PNG"


@pytest.mark.slow  # compiles the MoT's understanding loop (~10 s cold)
def test_bagel_mot_reads_an_image_and_answers_in_text(tmp_path):
    drawn = tmp_path / "seven.png"
    result = runner.invoke(app, ["generate", "seven thick", "--model", "bagel-mot", "-o", str(drawn), "--steps", "8"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["generate", "--model", "bagel-mot", "--image", str(drawn)])
    assert result.exit_code == 0, result.output
    caption = next(line for line in result.output.splitlines() if line.startswith("caption: "))
    assert caption.split()[1].strip("'") == "seven"  # it reads the digit it drew
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seven.png"]  # and writes nothing


@pytest.mark.slow  # three workflows, five cards compiled (~40 s cold)
@pytest.mark.parametrize(
    "flow, frames", [("image_video.t2i_i2v", 8), ("image_video.t2i_i2v_extended", 15), ("video.t2v_continue", 16)]
)
def test_every_bundled_workflow_renders_from_the_command_line(flow, frames, tmp_path):
    out = tmp_path / "out.gif"
    result = runner.invoke(app, ["generate", "six moving down", "--workflow", flow, "-o", str(out), "--steps", "1"])
    assert result.exit_code == 0, result.output
    assert Image.open(out).n_frames == frames
    assert out.with_suffix(".png").is_file() == flow.startswith("image_video")  # the first image, where there is one


SIGINT_AT_IMPORT = """
import os, runpy, signal, sys
module, argv = sys.argv[1], sys.argv[2:]
class SignalAt:  # delivers a SIGINT to this process at the first import of `module`, before it loads
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, SignalAt())
sys.argv = ["jaxpipe", *argv]  # the console script's name: the command installs its stop handler as it starts
runpy.run_module("jaxpipe.cli", run_name="__main__")
"""
"""Runs ``jaxpipe ARGV...`` as its console script does, with a SIGINT landing exactly as ``MODULE`` starts to load:
``python -c SIGINT_AT_IMPORT MODULE ARGV...``. Deterministic: the signal's moment is an import, not a wall-clock
delay, so a loaded machine cannot move it."""


@pytest.mark.parametrize("module", ["typer", "jax"])
def test_ctrl_c_in_the_first_moments_of_generate_exits_130_and_writes_nothing(module, tmp_path):
    """The stop handler is in place before typer and JAX load: a SIGINT while they do is a clean stop, not a
    traceback."""
    out = tmp_path / "x.gif"
    command = [sys.executable, "-c", SIGINT_AT_IMPORT, module, "generate", "seven thick moving right", "-o", str(out)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    output = done.stdout
    assert done.returncode == 130, output
    assert "stopped (SIGINT)" in output and "nothing written" in output and "Traceback" not in output
    assert len(output.strip().splitlines()) <= 2  # the handler's notice and the command's one line
    assert not list(tmp_path.iterdir())


def test_console_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "jaxpipe.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "generate" in result.stdout


@pytest.mark.slow  # ~8 s; the suite checks the independent numbers of train reports (test_train_cli)
def test_evaluate_reports_the_scorer_and_the_independent_judges(tmp_path):
    out = tmp_path / "quality.json"
    result = CliRunner().invoke(app, ["evaluate", "--samples", "4", "-o", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert "independent judges" in result.output and "all_attributes_correct" in result.output  # a table
    t2i, i2v = report["t2i"], report["i2v"]
    assert 0.0 <= t2i["all_attributes_correct"] <= 1.0 and 0.0 <= t2i["independent"]["all_attributes_correct"] <= 1.0
    assert set(t2i["independent"]["attribute_accuracy"]) == {"stroke", "position", "brightness"}
    assert "last_frame_digit_accuracy" in i2v["independent"]


@pytest.mark.slow  # ~12 s: GenEval's table through the CLI; by default the digits world's evaluate runs through it
def test_evaluate_the_shapes_world_prints_geneval_s_table(tmp_path):
    out = tmp_path / "geneval.json"
    result = CliRunner().invoke(
        app, ["evaluate", "--world", "shapes", "--samples", "1", "--steps", "2", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for split in ("train", "heldout"):
        table = report["t2i"][split]
        assert set(table["accuracy"]) == set(jp_shapes.CATEGORIES) and sum(table["images"].values()) == 12
        assert table["overall"] == pytest.approx(np.mean(list(table["accuracy"].values())))
        assert table["strict"]["overall"] <= table["overall"]  # GenEval's rule asks less than the strict one
        assert set(report["t2v"][split]) == {"split", "prompts", "motion", "identity", "all_right"}
    printed = CliRunner().invoke(app, ["evaluate", "--world", "shapes", "--samples", "1", "--steps", "2", "--json"])
    assert json.loads(printed.stdout)["t2i"]["train"]["accuracy"] == report["t2i"]["train"]["accuracy"]
    result = CliRunner().invoke(app, ["evaluate", "--world", "moon"])
    assert result.exit_code != 0 and "--world must be one of digits, shapes (got 'moon')" in result.output


def test_a_report_prints_as_tables_splits_and_independent_judges_as_columns():
    from rich.console import Console

    from jaxpipe.cli.tables import numbers, tables

    report = {
        "t2i": {"samples": 4, "accuracy": {"digit": 0.5}, "independent": {"accuracy": {"digit": 0.25}}, "ok": True},
        "geneval": {"train": {"overall": 0.5, "split": "train"}, "heldout": {"overall": 0.25, "split": "heldout"}},
    }
    assert numbers(report["t2i"]) == {"samples": 4, "accuracy.digit": 0.5, "independent.accuracy.digit": 0.25}
    console = Console(record=True, width=80)
    for table in tables(report):
        console.print(table)
    text = console.export_text()
    assert re.search(r"accuracy\.digit\s+│\s+0\.500\s+│\s+0\.250", text)
    assert re.search(r"measure\s+┃\s+train\s+┃\s+heldout", text) and re.search(
        r"overall\s+│\s+0\.500\s+│\s+0\.250", text
    )


@pytest.mark.parametrize("command", [[], ["generate"], ["evaluate"], ["serve"], ["train"], ["train", "nft"]])
def test_help_is_plain_text_as_wide_as_the_terminal(command):
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=120)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "``" not in result.output and "╭" not in result.output  # no raw markup, no boxes that cut the text
    assert max(map(len, lines)) <= 120 and (command == [] or max(map(len, lines)) > 80)
