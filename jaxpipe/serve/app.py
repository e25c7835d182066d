"""The HTTP app: OpenAI-compatible endpoints over a ``Front`` (FastAPI).

``create_app(front)`` serves:

* ``GET /health``: ``{"status": "ok" | "draining", ...}`` (503 while draining, so a balancer stops routing).
* ``GET /v1/models``: the OpenAI model list; each entry also says its ``kind`` (``card``, ``workflow``,
  ``reward``), its ``loops`` and what it ``makes`` (``image``, ``video``, ``text``, ``scores``).
* ``GET /metrics``: Prometheus metrics (``jaxpipe.serve.metrics``).
* ``POST /v1/images/generations``: ``model``, ``prompt``, ``n`` (rows: seeds ``seed .. seed + n - 1``),
  ``size`` (``"WxH"``: must be the card's), ``response_format`` (``b64_json`` or ``url``: then served at
  ``GET /v1/files/{id}/content`` from a bounded in-memory store), and jaxpipe's ``seed``, ``num_steps``,
  ``guidance`` as extra body fields. Returns ``{"created", "data": [{"b64_json" | "url", "revised_prompt"?}]}``.
* ``POST /v1/videos`` (JSON, or multipart/form-data as the official client sends it): a job object at once
  (``{"id", "object": "video", "status", "progress", ...}``); ``GET /v1/videos/{id}``;
  ``GET /v1/videos/{id}/content`` (the GIF; ``?variant=thumbnail``: the first frame as PNG);
  ``DELETE /v1/videos/{id}`` cancels the job and answers it as deleted (``"object": "video.deleted"``).
  Workflows that make videos (``image_video.t2i_i2v``) are video jobs too; the conditioning image of an
  image-to-video card comes as ``input_reference`` (an uploaded file or ``{"image_url": data URL}``) or an
  ``image`` field (base64 or a data URL).
* ``POST /v1/chat/completions`` and ``POST /v1/rewards`` (``jaxpipe.serve.chat``, ``jaxpipe.serve.rewards``).

Routes find what they serve on ``request.app.state``: ``front`` (the ``Front``), ``engine``,
``rewards`` (the ``RewardModels`` or ``None``), ``metrics`` (``Metrics``), ``files`` and ``jobs``.

Errors are OpenAI-style envelopes (``jaxpipe.serve.errors``): a bad body is 400 naming the field and
what is allowed (``num_steps`` is bounded here by ``MAX_STEPS``; words, guidance and images are the
engine's own checks), an unknown model or job 404 (listing what is served), over capacity 429 with
``Retry-After``, draining 503, anything unexpected 500. A bad request fails alone.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

import fastapi
import pydantic
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

import jaxpipe
from jaxpipe import io
from jaxpipe.engine import Engine, Handle
from jaxpipe.request import MAX_SEED, Output
from jaxpipe.request import Request as JPRequest
from jaxpipe.serve import chat, media
from jaxpipe.serve import rewards as reward_routes
from jaxpipe.serve.bodies import VIDEO_FPS, ImageBody, VideoBody, bad_body
from jaxpipe.serve.errors import APIError, envelope
from jaxpipe.serve.front import Front, api_error
from jaxpipe.serve.metrics import CONTENT_TYPE, Metrics
from jaxpipe.serve.models import check_served, check_size, final_card, served_models
from jaxpipe.serve.stores import STATUS, FileStore, Job, JobStore, job_json

__all__ = ["create_app"]

_POLL_AFTER_MS = "100"  # the official client's create_and_poll / poll read it between retrievals


def create_app(front: Front, *, rewards: Any = None, title: str = "jaxpipe") -> fastapi.FastAPI:
    """The OpenAI-compatible app over ``front`` (see the module docstring).

    Args:
      front: the front admitting requests to the engine (``front.engine``).
      rewards: the reward models ``POST /v1/rewards`` serves (``jaxpipe.serve.rewards.RewardModels``), or ``None``.
      title: the app's title (its OpenAPI page).

    Returns:
      The FastAPI app (run it with uvicorn: ``jaxpipe.serve.server``).
    """
    app = fastapi.FastAPI(title=title, version=jaxpipe.__version__)
    app.state.front = front
    app.state.engine = front.engine
    if rewards is None:
        rewards = reward_routes.RewardModels.from_specs((), engine=front.engine)
    app.state.rewards = rewards
    app.state.metrics = Metrics(front)
    app.state.files = FileStore()
    app.state.jobs = JobStore()
    app.state.created = int(time.time())
    _handlers(app)
    app.include_router(_router)
    app.include_router(chat.router)
    app.include_router(reward_routes.router)
    return app


def _refused(request: HTTPRequest, err: APIError) -> JSONResponse:
    """The error's response, counted as a refused request unless the front already counted it."""
    if not err.counted:
        request.app.state.front.count_refusal("unknown_model" if err.code == "model_not_found" else "invalid")
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _handlers(app: fastapi.FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(request: HTTPRequest, exc: APIError) -> JSONResponse:
        return _refused(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _body(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        return _refused(request, bad_body(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: HTTPRequest, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return JSONResponse(
            envelope(message, "invalid_request_error" if exc.status_code < 500 else "server_error"),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def _invalid(request: HTTPRequest, exc: Exception) -> JSONResponse:
        return _refused(request, api_error(exc))

    app.add_exception_handler(ValueError, _invalid)  # the engine's validation: words, steps, guidance, images
    app.add_exception_handler(TypeError, _invalid)

    @app.exception_handler(Exception)
    async def _unexpected(request: HTTPRequest, exc: Exception) -> JSONResponse:
        return JSONResponse(envelope(f"internal error: {type(exc).__name__}: {exc}", "server_error"), status_code=500)


_router = fastapi.APIRouter()


@_router.get("/health")
async def health(request: HTTPRequest) -> JSONResponse:
    """``{"status": "ok" | "draining", "models", "queued", "running"}``; 503 while draining."""
    front: Front = request.app.state.front
    load = front.load()
    status = "draining" if front.draining else "ok"
    return JSONResponse(
        {"status": status, "models": len(front.engine.models()), "queued": load.queued, "running": load.running},
        status_code=503 if front.draining else 200,
    )


@_router.get("/v1/models")
async def list_models(request: HTTPRequest) -> dict[str, Any]:
    """The OpenAI model list, with each model's ``kind``, ``loops`` and ``makes``."""
    state = request.app.state
    return {"object": "list", "data": served_models(state.engine, state.rewards, state.created)}


@_router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: HTTPRequest) -> dict[str, Any]:
    """One model's entry; 404 listing the served ids."""
    state = request.app.state
    entries = served_models(state.engine, state.rewards, state.created)
    for entry in entries:
        if entry["id"] == model_id:
            return entry
    raise APIError(
        404,
        f"unknown model {model_id!r}; this server serves {[e['id'] for e in entries]}",
        param="model",
        code="model_not_found",
    )


@_router.get("/metrics")
async def metrics(request: HTTPRequest) -> Response:
    """Prometheus metrics in the text format."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@_router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, request: HTTPRequest) -> Response:
    """A stored image (``response_format="url"``)."""
    data, media_type = request.app.state.files.get(file_id)
    return Response(data, media_type=media_type)


async def _outputs(handles: list[Handle], model: str) -> list[Output]:
    """Await every handle; one failing (or cancelled by a drain) cancels the rest and raises its error."""

    async def one(h: Handle) -> Output:
        return await h

    try:
        outputs = await asyncio.gather(*(one(h) for h in handles))
    except BaseException as err:
        for h in handles:
            h.cancel()
        if isinstance(err, Exception) and not isinstance(err, APIError):
            raise APIError(
                500, f"the {model!r} request failed: {type(err).__name__}: {err}", code="generation_failed"
            ) from err
        raise
    if any(out.cancelled for out in outputs):
        raise APIError(503, "the request was cancelled: the server is draining", code="draining")
    return outputs


@_router.post("/v1/images/generations")
async def generate_images(body: ImageBody, request: HTTPRequest) -> dict[str, Any]:
    """Generate ``n`` images (seeds ``seed .. seed + n - 1``): the OpenAI ``ImagesResponse``."""
    arrived = time.monotonic()
    state = request.app.state
    engine: Engine = state.engine
    model = check_served(engine, body.model, "image", "/v1/images/generations")
    check_size(engine, model, body.size)
    if body.seed + body.n - 1 > MAX_SEED:
        raise APIError(
            400,
            f"seed + n - 1 must be <= {MAX_SEED} (got seed={body.seed}, n={body.n})",
            param="seed",
            code="invalid_value",
        )
    requests = [
        JPRequest(model, body.prompt, seed=body.seed + i, num_steps=body.num_steps, guidance=body.guidance)
        for i in range(body.n)
    ]
    handles = await run_in_threadpool(state.front.submit_many, requests)
    outputs = await _outputs(handles, model)

    def encode() -> list[dict[str, Any]]:
        data = []
        for out in outputs:
            if body.output_format == "npy":
                payload, kind = media.encode_npy(out["image"]), "application/octet-stream"
            else:
                payload, kind = media.encode_png(out["image"]), "image/png"
            entry: dict[str, Any] = {}
            if body.response_format == "url":
                entry["url"] = f"{str(request.base_url).rstrip('/')}/v1/files/{state.files.put(payload, kind)}/content"
            else:
                entry["b64_json"] = base64.b64encode(payload).decode("ascii")
            revised = out.get("refined_text", out.get("text"))
            if isinstance(revised, str):
                entry["revised_prompt"] = revised
            data.append(entry)
        return data

    data = await run_in_threadpool(encode)
    state.metrics.observe("images", model, time.monotonic() - arrived)
    return {
        "created": int(time.time()),
        "data": data,
        "output_format": body.output_format,
        "size": check_size(engine, model, None),
    }


async def _video_fields(request: HTTPRequest) -> tuple[dict[str, Any], bytes | None]:
    """The body of ``POST /v1/videos`` (JSON or multipart form) and an uploaded ``input_reference`` file's bytes."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form()
        fields: dict[str, Any] = {}
        upload = None
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key == "input_reference":
                    upload = await value.read()
                continue
            fields[key] = value
        if "input_reference[image_url]" in fields:
            fields.setdefault("image", fields.pop("input_reference[image_url]"))
        return fields, upload
    try:
        fields = await request.json()
    except ValueError as err:
        raise APIError(
            400, f"the body is not valid JSON ({err}); send JSON or multipart/form-data", code="invalid_body"
        ) from None
    if not isinstance(fields, dict):
        raise APIError(400, f"the body must be a JSON object (got {type(fields).__name__})", code="invalid_body")
    reference = fields.pop("input_reference", None)
    if isinstance(reference, dict) and reference.get("image_url"):
        fields.setdefault("image", reference["image_url"])
    elif isinstance(reference, str):
        fields.setdefault("image", reference)
    return fields, None


@_router.post("/v1/videos")
async def create_video(request: HTTPRequest) -> JSONResponse:
    """Start a video job: the job object at once (status ``queued``)."""
    arrived = time.monotonic()
    state = request.app.state
    engine: Engine = state.engine
    fields, upload = await _video_fields(request)
    try:
        body = VideoBody.model_validate(fields)
    except pydantic.ValidationError as err:
        raise bad_body(err) from None
    model = check_served(engine, body.model, "video", "/v1/videos")
    size = check_size(engine, model, body.size)
    seconds = _seconds(engine, model)
    if body.seconds is not None and body.seconds != seconds:
        raise APIError(
            400,
            f"seconds {body.seconds!r} is not served by {model!r}: its clips last {seconds!r} s (or omit seconds)",
            param="seconds",
            code="invalid_seconds",
        )
    image = None
    if upload is not None or body.image is not None:
        card = final_card(engine, model) if model not in engine.workflows() else engine.workflow(model).stages[0].model
        shape = io.image_shape(engine.card(card)) if card in engine.cards() else None
        data = base64.b64encode(upload).decode("ascii") if upload is not None else body.image
        field = "input_reference" if upload is not None or "image" not in fields else "image"
        image = await run_in_threadpool(media.decode_image, data, shape, field=field)
    jp_request = JPRequest(
        model, body.prompt, seed=body.seed, num_steps=body.num_steps, guidance=body.guidance, image=image
    )
    handle = await run_in_threadpool(state.front.submit, jp_request)
    job = Job(f"video_{uuid.uuid4().hex}", handle, model, body.prompt, size, seconds, int(time.time()), arrived)
    state.jobs.add(job)
    handle.add_done_callback(lambda h: state.metrics.observe("videos", model, time.monotonic() - arrived))
    return JSONResponse(job_json(engine, job), headers={"openai-poll-after-ms": _POLL_AFTER_MS})


def _seconds(engine: Engine, model_id: str) -> str:
    """A video model's clip length in whole seconds at ``VIDEO_FPS`` (at least 1), as OpenAI's ``seconds`` string."""
    card = final_card(engine, model_id)
    frames = getattr(engine.card(card).spec.config, "frames", None) if card is not None else None
    return str(max(1, round(frames / VIDEO_FPS))) if frames else "1"


@_router.get("/v1/videos/{video_id}")
async def retrieve_video(video_id: str, request: HTTPRequest) -> JSONResponse:
    """The job object: status, progress, error."""
    state = request.app.state
    job = state.jobs.get(video_id)
    body = job_json(state.engine, job)
    headers = {"openai-poll-after-ms": _POLL_AFTER_MS} if body["status"] in ("queued", "in_progress") else {}
    return JSONResponse(body, headers=headers)


@_router.get("/v1/videos/{video_id}/content")
async def video_content(video_id: str, request: HTTPRequest, variant: str = "video") -> Response:
    """The finished job's video as a GIF (``variant=thumbnail``: its first frame as a PNG)."""
    state = request.app.state
    job = state.jobs.get(video_id)
    if variant not in ("video", "thumbnail"):
        raise APIError(
            400, f"variant must be 'video' or 'thumbnail' (got {variant!r})", param="variant", code="invalid_value"
        )
    status = STATUS[job.handle.status]
    if status != "completed":
        raise APIError(
            409,
            f"video job {video_id!r} is {status}: its content is there once its status is completed",
            param="video_id",
            code="video_not_ready",
        )
    video = job.handle.result(0)["video"]
    if variant == "thumbnail":
        return Response(await run_in_threadpool(media.encode_png, video[0]), media_type="image/png")
    if job.gif is None:
        job.gif = await run_in_threadpool(media.encode_gif, video, fps=VIDEO_FPS)
    return Response(job.gif, media_type="image/gif")


@_router.delete("/v1/videos/{video_id}")
async def delete_video(video_id: str, request: HTTPRequest) -> JSONResponse:
    """Cancel the job (its batch slot is freed at the engine's next tick): the job, marked deleted."""
    state = request.app.state
    job = state.jobs.get(video_id)
    job.handle.cancel()
    try:
        await run_in_threadpool(job.handle.exception, 10.0)  # the cancel takes effect at the next tick
    except TimeoutError:
        pass
    return JSONResponse({**job_json(state.engine, job), "object": "video.deleted", "deleted": True})
