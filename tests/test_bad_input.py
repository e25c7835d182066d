"""Bad input gets a clear error, the same from the CLI and the Python API, and never yields garbage;
the engine keeps serving after every one of them."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from typer.testing import CliRunner

import jaxpipe as jp
from jaxpipe import compilation
from jaxpipe.cli import app
from jaxpipe.engine import Engine
from jaxpipe.loops.denoise import DenoiseConfig

runner = CliRunner()
needs_cards = pytest.mark.skipif(
    not {"flux-t2i", "wan-i2v"} <= set(jp.cards.available()), reason="bundled cards missing"
)


@pytest.fixture(scope="module")
def engine(t2i_card, i2v_card):
    engine = Engine(max_batch=4)
    engine.register(t2i_card)
    engine.register(i2v_card)
    return engine


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(guidance=float("inf")), "guidance must be a finite number"),
        (dict(guidance=float("nan")), "guidance must be a finite number"),
        (dict(guidance=-1.0), "guidance must be a finite number >= 0"),
        (dict(seed=-1), r"seed must be an int in \[0, 4294967295\]"),
        (dict(seed=2**32), r"seed must be an int in \[0, 4294967295\]"),
        (dict(num_steps=0), "num_steps must be a positive int"),
    ],
)
def test_requests_refuse_what_would_render_garbage(fields, message):
    with pytest.raises(ValueError, match=message):
        jp.Request("flux-t2i", prompt="seven", **fields)


def test_the_python_api_names_what_is_wrong_with_its_arguments(t2i_card, tmp_path):
    with pytest.raises(TypeError, match="prompts must be a str or a list of str"):
        jp.generate(t2i_card, 42)
    with pytest.raises(TypeError, match=r"seed must be an int or one int per prompt \(got 'zero'\)"):
        jp.generate(t2i_card, "seven", seed="zero")
    with pytest.raises(FileNotFoundError, match="no such card folder"):
        jp.cards.load(tmp_path / "missing")
    with pytest.raises(KeyError, match="not a bundled card"):
        jp.cards.load("no-such-card-id")


def test_sampling_settings_refuse_non_finite_and_out_of_range_values():
    for bad, message in [
        (dict(guidance=float("inf")), "guidance must be a finite"),
        (dict(noise_level=float("nan")), "noise_level"),
        (dict(noise_level=1.5), r"noise_level \(the SDE's η\) must be in \[0, 1.0\]"),
        (dict(shift=float("inf")), "shift must be a finite"),
    ]:
        with pytest.raises(ValueError, match=message):
            DenoiseConfig(**bad)


def test_run_many_names_the_bad_request_and_runs_nothing(engine):
    before = engine.cache.stats()
    requests = [
        jp.Request("flux-t2i", prompt="seven", num_steps=2),
        jp.Request("flux-t2i", prompt="sevn thik", num_steps=2),
    ]
    with pytest.raises(
        ValueError,
        match=r"request 1 of 2 \('flux-t2i'\): unknown word\(s\) 'sevn' \(did you mean 'seven'\?\), "
        r"'thik' \(did you mean 'thick' or 'thin'\?\)",
    ):
        engine.run_many(requests)
    with pytest.raises(ValueError, match=r"request 0 of 2 \('wan-i2v'\): 'wan-i2v' animates a first frame"):
        engine.run_many([jp.Request("wan-i2v", prompt="seven still"), requests[0]])
    assert engine.cache.stats() == before  # nothing ran
    out = engine.run(requests[0])  # and the engine still serves
    assert out["image"].shape == (16, 16, 1) and bool(jnp.all(jnp.isfinite(out["image"])))


def test_a_card_serves_under_another_id_next_to_its_base(engine, t2i_card):
    engine.register(t2i_card, model_id="flux-t2i-copy")
    assert {"flux-t2i", "flux-t2i-copy"} <= set(engine.cards())
    a = engine.run(jp.Request("flux-t2i", prompt="one", seed=1, num_steps=2))
    b = engine.run(jp.Request("flux-t2i-copy", prompt="one", seed=1, num_steps=2))
    np.testing.assert_array_equal(a["image"], b["image"])
    engine.unregister("flux-t2i-copy")


def test_damaged_checkpoints_name_the_file(tmp_path, t2i_card):
    path = jp.cards.save_card(t2i_card, tmp_path / "card")
    weights = path / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(jp.cards.CardIntegrityError, match=r"weights.safetensors is damaged"):
        jp.cards.load(path)
    jp.cards.checkpoint.write_digests(path)  # the digest now matches: safetensors itself must refuse the file
    with pytest.raises(ValueError, match=r"weights.safetensors cannot be read .*damaged or truncated"):
        jp.cards.load(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        jp.cards.load(path)
    (path / "config.json").write_text(
        json.dumps(
            {"format": "jaxpipe.card/1", "family": "toy_t2i", "model_id": "x", "config": {"dit": {"depth": "four"}}}
        )
    )
    with pytest.raises(ValueError, match=r"config.json: its toy_t2i config does not load"):
        jp.cards.load(path)


@needs_cards
@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "seven moving rigth"], "'rigth' (did you mean 'right' or 'bright'?)"),
        (["generate", "seven", "--guidance", "nan"], "--guidance must be a finite number >= 0 (got nan)"),
        (["generate", "seven", "--seed", "-1"], "--seed must be an int in [0, 4294967295] (got -1)"),
        (["generate", "seven", "--seed", str(2**32)], "--seed must be an int in [0, 4294967295] (got 4294967296)"),
        (["evaluate", "--guidance", "-1"], "--guidance must be a finite number >= 0 (got -1.0)"),
        (["generate", "seven moving up", "--video-model", "flux-t2i"], "this stage needs a card that does i2v"),
        (
            ["generate", "seven", "--model", "wan-i2v", "-o", "{tmp}/a.png"],
            "'wan-i2v' (i2v) starts from an image: pass --image",
        ),
        (
            ["generate", "seven moving right", "--model", "wan-t2v", "-o", "{tmp}/a.png"],
            "'wan-t2v' makes a video: --out must end in .gif (got 'a.png')",
        ),
        (
            ["generate", "seven", "--model", "wan-t2v", "--image", "{tmp}/none.png"],
            "--image: 'wan-t2v' (t2v) reads no image",
        ),
        (
            ["generate", "seven", "--model", "wan-i2v", "--image", "{tmp}/none.png"],
            "--image {tmp}/none.png: no such file",
        ),
        (
            ["generate", "seven", "--model", "digit-scorer"],
            "'digit-scorer' is a judge, not a generator: it scores images",
        ),
        (["generate", "seven", "--model", "digit-classifier"], "'digit-classifier' is a judge, not a generator"),
        (
            ["generate", "seven moving up", "--model", "wan-t2v", "--video-model", "wan-i2v"],
            "--video-model animates a text-to-image card's image into a .gif; 'wan-t2v' makes video itself",
        ),
        (
            ["generate", "seven", "--model", "video.t2v_continue"],
            "is a workflow, not a card: pass --workflow video.t2v_continue",
        ),
        (
            ["generate", "seven", "--workflow", "video.nope"],
            "--workflow 'video.nope' is not a registered workflow; registered: ",
        ),
        (
            ["generate", "seven", "--workflow", "video.t2v_continue", "-o", "{tmp}/a.png"],
            "--workflow video.t2v_continue makes a video: --out must end in .gif (got 'a.png')",
        ),
        (
            ["generate", "seven", "--workflow", "video.t2v_continue", "--model", "wan-t2v"],
            "--workflow names its own cards",
        ),
        (["generate", "--model", "flux-t2i"], "PROMPT is missing"),
        (["generate", "  ", "--model", "flux-t2i", "-o", "{tmp}/a.png"], "PROMPT must have at least one word"),
        (["generate", ""], "PROMPT must have at least one word (got '')"),
        (["generate", "seven", "--model", "flux-t2i", "-o", "/proc/jaxpipe.png"], "cannot write to /proc"),
    ],
)
def test_the_cli_checks_before_any_compute_and_prints_one_line(args, message, tmp_path):
    args, message = [a.replace("{tmp}", str(tmp_path)) for a in args], message.replace("{tmp}", str(tmp_path))
    if "-o" not in args and args[0] == "generate":
        args += ["-o", str(tmp_path / "x.gif")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "Request." not in result.output  # the flags the user typed, not the engine's field names
    assert not list(tmp_path.iterdir())  # nothing written


@needs_cards
def test_the_cli_never_overwrites_silently(tmp_path):
    (tmp_path / "x.png").write_bytes(b"mine")
    result = runner.invoke(app, ["generate", "seven", "-o", str(tmp_path / "x.gif"), "--steps", "2"])
    assert result.exit_code == 2 and "x.png exists: pass --overwrite" in result.output
    assert (tmp_path / "x.png").read_bytes() == b"mine"
    result = runner.invoke(app, ["generate", "seven", "-o", str(tmp_path / "x.gif"), "--steps", "2", "--overwrite"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x.png").read_bytes() != b"mine" and (tmp_path / "x.gif").is_file()


@needs_cards
def test_cards_prints_a_table():
    result = runner.invoke(app, ["cards"])
    assert result.exit_code == 0
    header, *rows = result.output.strip().splitlines()
    assert header.split()[:4] == ["id", "family", "parameters", "loops"]
    flux = next(row for row in rows if row.startswith("flux-t2i "))
    assert "toy_t2i" in flux and "t2i_denoise (denoise)" in flux and "text-to-image" in flux
    assert {row.split()[0] for row in rows} == set(jp.cards.available())  # every bundled card, the judges included
    assert "digit_classifier" in next(row for row in rows if row.startswith("digit-classifier "))
    does = {row.split()[0]: row for row in rows}
    for model_id in jp.cards.available():  # each card's own line, whole
        assert does[model_id].endswith("  " + jp.cards.card_entry(model_id).description), does[model_id]
    assert jp.cards.card_entry("flux-t2i").description != jp.cards.card_entry("flux-t2i-turbo").description
    turbo = jp.cards.load("flux-t2i-turbo")  # stores its DiT only: the base's text encoder and autoencoder count too
    stored = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(turbo.components)))
    assert f"  {stored:,}  " in does["flux-t2i-turbo"] and stored > 1_000_000
    kept = list((compilation.cache_dir() / "jaxpipe-cards").glob("*.json"))  # each card's loops, built once
    assert len(kept) >= len(jp.cards.available())
    again = runner.invoke(app, ["cards"])  # read back from there
    assert again.exit_code == 0 and again.output == result.output
