"""``POST /v1/rewards`` and the reward that is a URL: the server's scores are the reward's own, bad bodies
name their field, and ``jaxpipe.rewards.load("http://.../v1/rewards?model=...")`` scores inside ``jax.jit``
as the local reward does. Also the server's media helpers (PNG / GIF bytes, request images)."""

from __future__ import annotations

import socket

import jax
import numpy as np
import pytest
from conftest import assert_api_error

import jaxpipe as jp
from jaxpipe import rewards
from jaxpipe.digits.evaluators import labels_from_prompts
from jaxpipe.digits.rewards import REWARD_TERMS, scorer_reward
from jaxpipe.io import save_gif

httpx = pytest.importorskip("httpx")

from jaxpipe.serve import media
from jaxpipe.serve.errors import APIError
from jaxpipe.serve.rewards import RewardModels

PROMPTS = ["seven thick left bright", "one", "three dim"]


def _images(n: int = 3, seed: int = 0) -> np.ndarray:
    """``(n, 16, 16, 1)`` images in multiples of 1/255, so a PNG carries them exactly."""
    return np.random.default_rng(seed).integers(0, 256, (n, 16, 16, 1)).astype(np.float32) / 255.0


def _local(texts: list[str], images: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The digit-scorer reward called directly, as a trainer calls it."""
    reward = scorer_reward(jp.cards.load("digit-scorer"), REWARD_TERMS)
    total, parts = rewards.score(reward, {"image": images}, rewards.text_prompts(texts, labels_from_prompts(texts)))
    return np.asarray(total), {k: np.asarray(v) for k, v in parts.items()}


def _post(server, body, **params) -> httpx.Response:
    return httpx.post(server.url + "/v1/rewards", json=body, params=params, timeout=120)


def test_scores_equal_the_reward_called_directly(server):
    images = _images()
    sent = [
        media.b64(media.encode_png(images[0])),
        *(f"data:image/png;base64,{media.b64(media.encode_png(im))}" for im in images[1:]),
    ]
    response = _post(server, {"model": "digit-scorer", "images": sent, "prompts": PROMPTS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "digit-scorer"
    assert [row["index"] for row in body["data"]] == [0, 1, 2]
    total, parts = _local(PROMPTS, images)
    np.testing.assert_allclose([row["score"] for row in body["data"]], total, atol=1e-6)
    assert list(body["data"][0]["parts"]) == list(REWARD_TERMS)
    for name in REWARD_TERMS:
        np.testing.assert_allclose([row["parts"][name] for row in body["data"]], parts[name], atol=1e-6)
    # the model may come in the URL's query instead
    again = _post(server, {"images": sent, "prompts": PROMPTS}, model="digit-scorer")
    assert again.status_code == 200 and again.json()["data"] == body["data"]


BAD = [
    ({"images": ["x"], "prompts": ["one"]}, 400, "model", "model is required"),
    ({"model": "nope", "images": ["x"], "prompts": ["one"]}, 404, "model", "this server's reward models: digit-scorer"),
    ({"model": "digit-scorer", "images": [], "prompts": []}, 400, "images", "non-empty list"),
    (
        {"model": "digit-scorer", "images": ["x", "y"], "prompts": ["one"]},
        400,
        "prompts",
        "prompts has 1 entries and images 2",
    ),
    ({"model": "digit-scorer", "images": ["x"], "prompts": [1]}, 400, "prompts", "list of strings"),
    (
        {"model": "digit-scorer", "images": ["x"], "prompts": ["one"], "extra": 1},
        400,
        "extra",
        "unknown field(s) ['extra']",
    ),
    ({"model": "digit-scorer", "images": ["%%%"], "prompts": ["one"]}, 400, "images[0]", "not valid base64"),
    ({"model": "digit-scorer", "images": ["AAAA"], "prompts": ["one"]}, 400, "images[0]", "cannot be read as an image"),
]


@pytest.mark.parametrize("body, status, param, message", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_bodies_name_their_field(server, body, status, param, message):
    assert_api_error(_post(server, body), status, param, message)


def test_prompts_the_scorer_cannot_read_are_refused(server):
    image = media.b64(media.encode_png(_images(1)[0]))
    response = _post(server, {"model": "digit-scorer", "images": [image], "prompts": ["a cat"]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompts" and "unknown word(s) 'a', 'cat'" in error["message"]
    response = httpx.post(server.url + "/v1/rewards", content=b"{not json", timeout=30)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert response.json()["error"]["param"] is None  # not the character offset pydantic puts in its loc


def test_a_reward_that_is_a_url_scores_inside_jit_as_the_local_reward(server):
    spec = f"{server.url}/v1/rewards?model=digit-scorer"
    reward = rewards.load(spec)
    assert rewards.spec_name(spec) == "digit-scorer"
    images = _images(4, seed=1)
    texts = ["seven thick left bright", "one", "three dim", "nine right"]
    prompts = rewards.text_prompts(texts)  # no metadata: the server reads the labels from the words

    @jax.jit
    def step(images, prompts):
        return rewards.score(reward, {"image": images}, prompts)[0]

    np.testing.assert_allclose(np.asarray(step(images, prompts)), _local(texts, images)[0], atol=1e-6)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_remote_reward_says_what_went_wrong(server):
    prompts = rewards.HostPrompts(["one"])
    artifacts = {"image": _images(1)}
    unknown = rewards.load(f"{server.url}/v1/rewards?model=nope")
    with pytest.raises(RuntimeError, match=r"answered 404: unknown reward model 'nope'; .*digit-scorer"):
        unknown.fn(artifacts, prompts)
    gone = rewards.load(f"http://127.0.0.1:{_closed_port()}/v1/rewards?model=digit-scorer")
    with pytest.raises(RuntimeError, match="cannot connect"):
        gone.fn(artifacts, prompts)
    with pytest.raises(jax.errors.JaxRuntimeError, match="cannot connect"):  # the same, from inside a jitted step
        jax.block_until_ready(
            jax.jit(lambda im, p: gone({"image": im}, p))(artifacts["image"], rewards.text_prompts(["one"]))
        )
    with pytest.raises(ValueError, match=r"name the server's reward model in the URL, e\.g\. .*\?model=digit-scorer"):
        rewards.load(f"{server.url}/v1/rewards")


def test_reward_models_from_specs_serve_a_function_next_to_the_scorer(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "import jax.numpy as jnp\n\n"
        "def brightness(artifacts, prompts):\n"
        "    return jnp.mean(artifacts['image'], axis=(1, 2, 3))\n"
    )
    models = RewardModels.from_specs([f"{tmp_path}/my_rewards.py:brightness"])
    assert models.ids() == ["digit-scorer", "brightness"]
    assert RewardModels.from_specs(["digit-scorer"]).ids() == ["digit-scorer"]  # the built-in, named
    images = _images(2)
    scored = models.score("brightness", list(images), ["a cat", "anything"])  # no labels needed
    np.testing.assert_allclose(scored["scores"], images.mean(axis=(1, 2, 3)), atol=1e-6)
    assert scored["parts"] == {}
    with pytest.raises(APIError) as err:
        models.score("nope", list(images), ["a", "b"])
    assert err.value.status == 404 and "digit-scorer, brightness" in err.value.message
    with pytest.raises(ValueError, match="built-in reward's id"):
        RewardModels.from_specs([f"{tmp_path}/my_rewards.py:brightness", f"{tmp_path}/digit-scorer.py:digit-scorer"])


def test_media_round_trips_and_refuses_garbage(tmp_path):
    grey, rgb = _images(1)[0], np.random.default_rng(2).integers(0, 256, (4, 6, 3)).astype(np.float32) / 255.0
    for image in (grey, rgb):
        png = media.encode_png(image)
        assert png.startswith(b"\x89PNG")
        np.testing.assert_array_equal(media.decode_image(media.b64(png)), image)
        np.testing.assert_array_equal(media.decode_image("data:image/png;base64," + media.b64(png)), image)
    # converted and box-resized to a card's shape, as `jaxpipe generate --image` reads a file
    big = np.repeat(np.repeat(grey, 2, axis=0), 2, axis=1)
    np.testing.assert_allclose(
        media.decode_image(media.b64(media.encode_png(np.repeat(big, 3, -1))), (16, 16, 1)), grey, atol=1 / 255
    )
    video = np.stack([grey, 1 - grey, grey * 0.5])
    save_gif(video, tmp_path / "v.gif", upscale=1)
    assert media.encode_gif(video) == (tmp_path / "v.gif").read_bytes()  # the bytes `jaxpipe generate` writes
    for bad, says in [
        ("", "must be a base64 PNG"),
        ("data:text/plain;base64,AAAA", "must hold an image"),
        ("data:image/png,raw", "data:image/png;base64"),
        ("QUJD", "cannot be read as an image"),
    ]:
        with pytest.raises(APIError, match=says) as err:
            media.decode_image(bad, field="images[3]")
        assert err.value.status == 400 and err.value.param == "images[3]"
