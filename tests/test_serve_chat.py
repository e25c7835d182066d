"""``POST /v1/chat/completions`` on a live server (the session's ``server`` fixture), through the official
``openai`` client and raw httpx: the text loops stream their tokens, the stream concatenates to the
non-streamed reply, the replies are what the engine's programs decode, and bad bodies name their field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_api_error

from jaxpipe import Request

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from jaxpipe.serve import media
from jaxpipe.serve.chat import reply_text

PROMPT = "seven"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _bar() -> np.ndarray:
    """A 16x16 grey image with a vertical bar (a "one"), in multiples of 1/255 so its PNG is exact."""
    image = np.zeros((16, 16, 1), np.float32)
    image[3:13, 7:9] = 200 / 255
    return image


def _data_url(image: np.ndarray) -> str:
    return "data:image/png;base64," + media.b64(media.encode_png(image))


def _say(text: str) -> list[dict]:
    return [{"role": "system", "content": "ignored"}, {"role": "user", "content": text}]


def test_the_stream_concatenates_to_the_reply_which_is_the_refined_prompt(server):
    client = _client(server)
    reply = client.chat.completions.create(model="unified", messages=_say(PROMPT), seed=3)
    chunks = list(
        client.chat.completions.create(
            model="unified", messages=_say(PROMPT), seed=3, stream=True, stream_options={"include_usage": True}
        )
    )
    text = reply.choices[0].message.content
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert deltas and "".join(deltas) == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [reply.choices[0].finish_reason] and finishes[0] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage == reply.usage
    assert reply.usage.prompt_tokens == 1 and 1 <= reply.usage.completion_tokens <= 3
    # the reply is what the unified program itself decodes for this request (its refined prompt)
    output = server.front.submit(Request("unified", prompt=PROMPT, seed=3)).result(timeout=120)
    assert text == output["refined_text"] and text.startswith(PROMPT)


def test_max_tokens_cuts_the_reply_to_a_prefix(server):
    client = _client(server)
    full = client.chat.completions.create(model="unified", messages=_say(PROMPT), seed=3)
    cut = client.chat.completions.create(model="unified", messages=_say(PROMPT), seed=3, max_tokens=1)
    assert cut.usage.completion_tokens == 1
    assert full.choices[0].message.content.startswith(cut.choices[0].message.content)
    assert cut.choices[0].finish_reason == ("length" if full.usage.completion_tokens > 1 else "stop")


def test_reply_text_drops_eos_and_padding(server):
    card = server.front.engine.card("unified")
    eos = card.spec.loop("refine").config.eos_id
    seven, left = card.spec.tokenizer.encode(["seven left"], 2)[0]
    assert reply_text(card.spec.tokenizer, np.array([seven, 0, left, eos, 0]), eos) == "seven left"


def test_the_sse_wire_format(server):
    body = {"model": "unified", "messages": _say(PROMPT), "seed": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    first = json.loads(lines[0][len("data: ") :])
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")


def test_bagel_mot_captions_an_image_part_as_its_understand_program_does(server):
    client = _client(server)
    content = [{"type": "image_url", "image_url": {"url": _data_url(_bar())}}]
    reply = client.chat.completions.create(model="bagel-mot", messages=[{"role": "user", "content": content}])
    streamed = client.chat.completions.create(
        model="bagel-mot:understand", stream=True, messages=[{"role": "user", "content": content}]
    )
    text = reply.choices[0].message.content
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    assert "bagel-mot:understand" in server.front.engine.models()
    output = server.front.submit(Request("bagel-mot:understand", image=_bar())).result(timeout=120)
    assert text == output["caption_text"] and text


def _post(server, body) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def _user(content) -> list[dict]:
    return [{"role": "user", "content": content}]


BAD = [
    ({"messages": _user("seven")}, 400, "model", "model is required"),
    ({"model": "nope", "messages": _user("seven")}, 404, "model", "unknown model 'nope'"),
    ({"model": "flux-t2i", "messages": _user("seven")}, 400, "model", "the models that can chat: bagel-mot"),
    ({"model": "image_video.t2i_i2v", "messages": _user("seven")}, 400, "model", "is a workflow"),
    ({"model": "unified", "messages": []}, 400, "messages", "non-empty list"),
    ({"model": "unified", "messages": [{"role": "assistant", "content": "seven"}]}, 400, "messages", "no user message"),
    ({"model": "unified", "messages": [{"content": "seven"}]}, 400, "messages[0]", "role"),
    ({"model": "unified", "messages": _user("a cat")}, 400, "messages", "unknown word(s) 'a', 'cat'"),
    ({"model": "unified", "messages": _user("seven"), "max_tokens": 9}, 400, "max_tokens", "at most 3"),
    ({"model": "unified", "messages": _user("seven"), "max_tokens": 0}, 400, "max_tokens", "positive integer"),
    ({"model": "unified", "messages": _user("seven"), "temperature": -1}, 400, "temperature", ">= 0"),
    ({"model": "unified", "messages": _user("seven"), "seed": -1}, 400, "seed", "seed must be an integer"),
    ({"model": "unified", "messages": _user("seven"), "n": 2}, 400, "n", "n must be 1"),
    ({"model": "unified", "messages": _user("seven"), "top_p": 0.5}, 400, "top_p", "unsupported field(s) ['top_p']"),
    ({"model": "unified", "messages": _user("seven"), "stream": "yes"}, 400, "stream", "true or false"),
    (
        {"model": "unified", "messages": _user([{"type": "image_url", "image_url": {"url": "data:,x"}}])},
        400,
        "model",
        "reads no image",
    ),
    ({"model": "bagel-mot:understand", "messages": _user("seven")}, 400, "messages", "put one in the user message"),
    (
        {
            "model": "bagel-mot",
            "messages": _user([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]),
        },
        400,
        "messages[0].content[0].image_url.url",
        "cannot be read as an image",
    ),
    (
        {"model": "bagel-mot", "messages": _user([{"type": "image_url", "image_url": {"url": "%%%"}}])},
        400,
        "messages[0].content[0].image_url.url",
        "not valid base64",
    ),
    ({"model": "bagel-mot", "messages": _user([{"type": "audio"}])}, 400, "messages[0].content[0]", "a text part"),
]


@pytest.mark.parametrize("body, status, param, message", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_bodies_name_their_field(server, body, status, param, message):
    assert_api_error(_post(server, body), status, param, message)


def test_two_images_are_refused_and_the_client_raises(server):
    image = {"type": "image_url", "image_url": {"url": _data_url(_bar())}}
    response = _post(server, {"model": "bagel-mot", "messages": _user([image, image])})
    assert response.status_code == 400 and "at most one" in response.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="the models that can chat"):
        _client(server).chat.completions.create(model="digit-scorer", messages=_user("seven"), stream=True)
