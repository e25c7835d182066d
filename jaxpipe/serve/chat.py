"""``POST /v1/chat/completions``: OpenAI-compatible chat over the cards' text loops, streamed token by token.

A card can chat when the program it is served with decodes text in an ``ar_decode`` loop and returns
it as text (``Program.texts``). The reply is that text, read off the loop's token buffer step by step
(the engine's ``previews=True`` events: ``<eos>`` and ``<pad>`` dropped, decoded with the card's
tokenizer, which is what the program's own text artifact holds; the bundled cards' buffers always fit
that artifact). With the bundled cards:

* ``unified`` (the refiner LM): the user message is the prompt it completes; the reply is the refined
  prompt (``refined_text``: the prompt's words and those the LM adds).
* ``bagel-mot`` with an image in the message (an ``image_url`` part holding a data URL): its
  ``understand`` program captions the image (``caption_text``); text in the message is the start of the
  caption. An engine serves one program per id, so this program is served under a second id,
  ``bagel-mot:understand`` (``f"{card id}:{family program name}"``), on the resident card's weights
  (``register_text_programs(engine)``, which whoever builds the server's engine calls: ``jaxpipe serve`` does;
  the app never changes the engine it is given); requests may name either id. ``bagel-mot`` without an image answers with
  its thought (``think_t2i``'s ``thought_text``: the prompt's words and the thought's).

Once the reply is complete (the loop emitted ``<eos>``, ran its ``max_new_tokens`` steps, or reached the
request's ``max_tokens``) the chat cancels its request, freeing its batch slot at the next tick: a
program that goes on to draw an image (``unified``, ``bagel-mot``'s ``think_t2i``) does not spend the
steps on an image nobody receives. Streaming and non-streaming replies are computed the same way, so the
stream's deltas concatenate to the non-streamed reply for the same seed.

The models that can chat and the reply text live in ``chat_models.py``.

Body fields: ``model``; ``messages`` (the last ``user`` message is the input: its text parts joined by
spaces, at most one image part; earlier messages are ignored, the loops keep no conversation);
``stream`` (SSE ``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``); ``stream_options``
(``include_usage``); ``max_tokens`` / ``max_completion_tokens`` (at most the loop's ``max_new_tokens``);
``temperature`` (0: greedy; default the card's); ``seed`` (default 0); ``n`` (1 only); ``user``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import fastapi
import numpy as np
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from jaxpipe.request import MAX_SEED, Request
from jaxpipe.serve import media
from jaxpipe.serve.chat_models import ChatModel, chat_models, register_text_programs, reply_text, resolve
from jaxpipe.serve.errors import APIError, envelope

# ChatModel, chat_models, register_text_programs, reply_text and resolve are chat_models' (re-exported here)
__all__ = ["ChatModel", "chat_models", "register_text_programs", "reply_text", "resolve", "router"]

router = fastapi.APIRouter()

_FIELDS = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "seed",
    "n",
    "user",
)
_ROLES = ("system", "developer", "user", "assistant", "tool")


# ---- the body ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Body:
    model: str
    text: str | None
    image: tuple[str, str] | None  # (data URL, the field it came from)
    stream: bool
    usage_in_stream: bool
    max_tokens: int | None
    max_tokens_field: str
    temperature: float | None
    seed: int


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _user_message(messages: Any) -> tuple[str | None, tuple[str, str] | None]:
    """The last user message's text (parts joined by spaces; ``None`` if empty) and its image part, if any."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content}", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise APIError(
                400,
                f"messages[{i}] must be an object with a role ({', '.join(_ROLES)}) and content",
                param=f"messages[{i}]",
            )
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise APIError(400, "messages holds no user message: the last one is what the model answers", param="messages")
    i = users[-1]
    content = messages[i].get("content")
    if isinstance(content, str):
        return content.strip() or None, None
    if not isinstance(content, list):
        raise APIError(
            400,
            f"messages[{i}].content must be a string or a list of text / image_url parts",
            param=f"messages[{i}].content",
        )
    texts, images = [], []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"].strip())
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise APIError(
                    400,
                    f"{where}.image_url.url must be a data:image/png;base64,... URL",
                    param=f"{where}.image_url.url",
                )
            images.append((url, f"{where}.image_url.url"))
        else:
            raise APIError(
                400,
                f"{where} must be a text part {{type: text, text}} or an image part "
                f"{{type: image_url, image_url: {{url}}}} (got type {kind!r})",
                param=where,
            )
    if len(images) > 1:
        raise APIError(
            400, f"messages[{i}] holds {len(images)} images; a chat reads at most one", param=f"messages[{i}].content"
        )
    text = " ".join(t for t in texts if t)
    return text or None, images[0] if images else None


def _body(raw: Any) -> _Body:
    """The checked body (APIError 400 naming the field)."""
    if not isinstance(raw, dict):
        raise APIError(400, f"the body must be a JSON object (got {type(raw).__name__})")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise APIError(400, f"unsupported field(s) {unknown}; the fields are {', '.join(_FIELDS)}", param=unknown[0])
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "model is required: the id of a model that can chat (GET /v1/models)", param="model")
    text, image = _user_message(raw.get("messages"))
    stream = raw.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false (got {stream!r})", param="stream")
    options = raw.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise APIError(400, "stream_options must be {include_usage: bool}", param="stream_options")
    n = raw.get("n", 1)
    if n is not None and n != 1:
        raise APIError(400, f"n must be 1 (got {n!r}): one reply per request", param="n")
    field = "max_completion_tokens" if raw.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = raw.get(field)
    if max_tokens is not None and (not _int(max_tokens) or max_tokens <= 0):
        raise APIError(400, f"{field} must be a positive integer (got {max_tokens!r})", param=field)
    temperature = raw.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise APIError(
            400, f"temperature must be a finite number >= 0 (0: greedy) (got {temperature!r})", param="temperature"
        )
    seed = raw.get("seed")
    seed = 0 if seed is None else seed
    if not _int(seed) or not 0 <= seed <= MAX_SEED:
        raise APIError(400, f"seed must be an integer in [0, {MAX_SEED}] (got {seed!r})", param="seed")
    return _Body(
        model,
        text,
        image,
        bool(stream),
        bool(options.get("include_usage")),
        max_tokens,
        field,
        None if temperature is None else float(temperature),
        seed,
    )


# ---- running a chat ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Chat:
    """A submitted chat: its handle and what reading its buffer needs."""

    handle: Any
    model: ChatModel
    tokenizer: Any
    steps: int  # the steps the reply takes at most: min(max_tokens, the loop's max_new_tokens)
    prompt_tokens: int
    prompt_eos: int
    completion_tokens: int = 0
    finish_reason: str | None = None


def _start(front, body: _Body) -> _Chat:
    """Resolve, build and submit the request (on a worker thread: binding waits for the engine's lock)."""
    engine = front.engine
    chat = resolve(engine, body.model, body.image is not None)
    if body.max_tokens is not None and body.max_tokens > chat.max_new_tokens:
        raise APIError(
            400,
            f"{body.max_tokens_field} must be at most {chat.max_new_tokens} for {body.model!r} (its loop "
            f"{chat.loop!r} decodes {chat.max_new_tokens} tokens; got {body.max_tokens})",
            param=body.max_tokens_field,
        )
    pixels = None
    if body.image is not None:
        url, field = body.image
        pixels = media.decode_image(url, chat.image_shape, field=field)
    inputs = {} if body.temperature is None else {"temperature": body.temperature}
    if body.text is None and not chat.reads_image:
        raise APIError(
            400, f"the user message holds no text: {body.model!r} completes the prompt it is given", param="messages"
        )
    try:
        request = Request(chat.served, prompt=body.text, seed=body.seed, image=pixels, inputs=inputs)
        bound = engine.check(request)
    except (ValueError, TypeError) as err:
        raise APIError(400, str(err), param="messages") from None
    ids = np.asarray(bound.slots.get("ids", np.zeros((0,), np.int32))) if bound is not None else np.zeros((0,))
    tokenizer = engine.card(chat.served).spec.tokenizer
    handle = front.submit(request, previews=True)
    return _Chat(
        handle,
        chat,
        tokenizer,
        min(body.max_tokens or chat.max_new_tokens, chat.max_new_tokens),
        int(np.count_nonzero(ids)),
        int(np.count_nonzero(ids == chat.eos_id)),
    )


async def _deltas(chat: _Chat) -> AsyncIterator[str]:
    """The reply's text deltas, one per loop step that adds text; sets ``finish_reason`` and the token count.

    The request is cancelled once the reply is complete (and if the reader stops early).
    """
    sent = ""
    try:
        async for event in chat.handle.events():
            if event.kind == "failed":
                error = chat.handle.exception(0)
                raise APIError(
                    500, f"{chat.model.served!r} failed: {error}", type="server_error", code="request_failed"
                )
            if event.kind == "cancelled":
                raise APIError(
                    503, f"the {chat.model.served!r} request was cancelled (the server is stopping?)", code="cancelled"
                )
            if event.kind == "completed" and chat.finish_reason is None:
                raise APIError(
                    500,
                    f"{chat.model.served!r} finished without previews of loop {chat.model.loop!r}",
                    type="server_error",
                )
            if event.kind != "step" or event.loop != chat.model.loop or event.stage or event.latents is None:
                continue
            buffer = np.asarray(event.latents).reshape(-1)
            text = reply_text(chat.tokenizer, buffer, chat.model.eos_id)
            stopped = int(np.count_nonzero(buffer == chat.model.eos_id)) > chat.prompt_eos
            chat.completion_tokens = event.step
            if text.startswith(sent) and len(text) > len(sent):
                yield text[len(sent) :]
                sent = text
            if stopped or event.step >= chat.steps:
                chat.finish_reason = "stop" if stopped else "length"
                return
    finally:
        chat.handle.cancel()


def _usage(chat: _Chat) -> dict[str, int]:
    return {
        "prompt_tokens": chat.prompt_tokens,
        "completion_tokens": chat.completion_tokens,
        "total_tokens": chat.prompt_tokens + chat.completion_tokens,
    }


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _stream(chat: _Chat, model: str, include_usage: bool) -> AsyncIterator[str]:
    """The SSE lines of a streamed chat: a role chunk, content deltas, a finish chunk, [usage], ``[DONE]``."""
    head = {
        "id": f"chatcmpl-{chat.handle.id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    try:
        yield chunk({"role": "assistant", "content": ""})
        async for delta in _deltas(chat):
            yield chunk({"content": delta})
        yield chunk({}, chat.finish_reason)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(chat)})
    except APIError as err:  # the response has started: the error travels in the stream, as OpenAI's does
        yield _sse(err.body())
    except Exception as err:  # noqa: BLE001 - whatever broke, the client gets an error, not a cut stream
        yield _sse(envelope(f"the chat failed: {err}", "server_error"))
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions")
async def create_chat_completion(request: fastapi.Request):
    """Answer the last user message with a model's text loop: a ChatCompletion, or with ``stream`` SSE chunks.

    Returns:
      A ``chat.completion`` object (with ``usage``), or a ``text/event-stream`` of ``chat.completion.chunk``
      objects ending with ``data: [DONE]``.

    Raises:
      APIError: 400 naming the field for a bad body (or a model that cannot chat, listing those that can),
        404 for an unknown model, and the front's 429 / 503 when it is busy or stopping.
    """
    try:
        raw = await request.json()
    except ValueError:
        raise APIError(400, "the body is not valid JSON") from None
    body = _body(raw)
    front = request.app.state.front
    chat = await run_in_threadpool(_start, front, body)
    if body.stream:
        return StreamingResponse(
            _stream(chat, body.model, body.usage_in_stream),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    text = "".join([delta async for delta in _deltas(chat)])
    return {
        "id": f"chatcmpl-{chat.handle.id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": chat.finish_reason,
            }
        ],
        "usage": _usage(chat),
    }
