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
import collections
import dataclasses
import threading
import time
import uuid
from typing import Any, Literal

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
from jaxpipe.serve.errors import APIError, envelope
from jaxpipe.serve.front import Front, api_error
from jaxpipe.serve.metrics import CONTENT_TYPE, Metrics

__all__ = [
    "create_app",
    "FileStore",
    "ImageBody",
    "JobStore",
    "MAX_STEPS",
    "VIDEO_FPS",
    "VideoBody",
    "makes",
    "served_models",
]

MAX_STEPS = 1000
"""The most denoising steps one HTTP request may ask for (the engine has no bound; a server needs one)."""
VIDEO_FPS = 8
"""Frames per second of served GIFs (and a video job's ``seconds``)."""
_POLL_AFTER_MS = "100"  # the official client's create_and_poll / poll read it between retrievals
_FILES_MAX = 256
_FILES_MAX_BYTES = 64 * 2**20
_JOBS_MAX = 1024
_STATUS = {
    "queued": "queued",
    "running": "in_progress",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


# ---- what each served id is -------------------------------------------------------------------


def _final_card(engine: Engine, model_id: str, seen: tuple[str, ...] = ()) -> str | None:
    """The card whose artifacts a model's output ends with: itself, or a workflow's last stage's (recursively)."""
    if model_id not in engine.workflows():
        return model_id
    stages = engine.workflow(model_id).stages
    if not stages or model_id in seen:
        return None
    return _final_card(engine, stages[-1].model, (*seen, model_id))


def makes(engine: Engine, model_id: str) -> str:
    """What a served card or workflow makes: ``"video"``, ``"image"``, ``"scores"`` or ``"text"``.

    Read from the program's outputs (a workflow: its last stage's card): a ``video`` artifact makes a
    video, else an ``image`` an image, else ``scores`` / ``probabilities`` scores, else text.

    Args:
      engine: the engine serving it.
      model_id: a served id.

    Returns:
      The kind of artifact.
    """
    card = _final_card(engine, model_id)
    if card is None:
        return "text"
    outputs = dict(engine.program(card).outputs)
    for artifact, kind in (("video", "video"), ("image", "image"), ("scores", "scores"), ("probabilities", "scores")):
        if artifact in outputs:
            return kind
    return "text"


def _loops(engine: Engine, model_id: str) -> list[str]:
    if model_id in engine.workflows():
        return [f"{s.label}/{loop}" for s in engine.workflow(model_id).stages for loop in _loops(engine, s.model)]
    return [loop.id for loop in engine.card(model_id).spec.loops]


def _reward_ids(rewards: Any) -> list[str]:
    return [] if rewards is None else sorted(rewards.ids())


def served_models(engine: Engine, rewards: Any = None, created: int = 0) -> list[dict[str, Any]]:
    """The ``/v1/models`` entries: every served card and workflow, and the reward models.

    Args:
      engine: the engine.
      rewards: the reward models (``RewardModels``) or ``None``.
      created: the ``created`` timestamp to report.

    Returns:
      OpenAI model objects with ``kind``, ``loops`` and ``makes``.
    """
    reward_ids = _reward_ids(rewards)
    out = []
    for model_id in engine.models():
        workflow = model_id in engine.workflows()
        kind = "workflow" if workflow else "reward" if model_id in reward_ids else "card"
        out.append(
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "jaxpipe",
                "kind": kind,
                "loops": _loops(engine, model_id),
                "makes": makes(engine, model_id),
            }
        )
    for model_id in reward_ids:
        if not engine.serves(model_id):
            out.append(
                {
                    "id": model_id,
                    "object": "model",
                    "created": created,
                    "owned_by": "jaxpipe",
                    "kind": "reward",
                    "loops": [],
                    "makes": "scores",
                }
            )
    return out


def _served(engine: Engine, model_id: str, kind: str, endpoint: str) -> str:
    """``model_id`` if the engine serves it and it makes ``kind``; else a 404 / 400 naming the ids that do."""
    if not engine.serves(model_id):
        raise APIError(
            404,
            f"unknown model {model_id!r}; this server serves {engine.models()}",
            param="model",
            code="model_not_found",
        )
    made = makes(engine, model_id)
    if made != kind:
        fitting = [m for m in engine.models() if makes(engine, m) == kind]
        where = {
            "image": "POST /v1/images/generations",
            "video": "POST /v1/videos",
            "text": "POST /v1/chat/completions",
            "scores": "POST /v1/rewards",
        }[made]
        raise APIError(
            400,
            f"{model_id!r} makes {made}s (send it to {where}); the models {endpoint} serves are {fitting}",
            param="model",
            code="wrong_endpoint",
        )
    return model_id


def _size(engine: Engine, model_id: str, size: str | None) -> str | None:
    """The card's ``"WxH"``; a 400 naming it when ``size`` asks for another."""
    card = _final_card(engine, model_id)
    shape = io.image_shape(engine.card(card)) if card is not None else None
    allowed = f"{shape[1]}x{shape[0]}" if shape else None
    if size is not None and size not in ("auto", allowed):
        raise APIError(
            400,
            f"size {size!r} is not served by {model_id!r}: its size is {allowed!r} (or omit size)"
            if allowed
            else f"{model_id!r} has no size to choose; omit size",
            param="size",
            code="invalid_size",
        )
    return allowed


# ---- bodies -----------------------------------------------------------------------------------


class _Knobs(pydantic.BaseModel):
    """jaxpipe's own settings, as extra body fields."""

    model_config = pydantic.ConfigDict(extra="ignore")

    seed: int = pydantic.Field(0, ge=0, le=MAX_SEED)
    num_steps: int | None = pydantic.Field(None, ge=1, le=MAX_STEPS)
    guidance: float | None = None


class ImageBody(_Knobs):
    """``POST /v1/images/generations`` (OpenAI's fields it does not use, e.g. ``quality``, are ignored)."""

    model: str
    prompt: str = pydantic.Field(pattern=r"\S")  # at least one word: an empty prompt renders the unconditional blob
    n: int = pydantic.Field(1, ge=1)
    size: str | None = None
    response_format: Literal["b64_json", "url"] | None = None
    # jaxpipe's own: "npy" is the float32 artifact itself (a .npy file), for clients that compare bits
    output_format: Literal["png", "npy"] = "png"


class VideoBody(_Knobs):
    """``POST /v1/videos``; ``image`` (base64 or a data URL) conditions an image-to-video card; ``size`` and
    ``seconds``, where given, must be the card's own (a card renders one size and clip length)."""

    model: str
    prompt: str = pydantic.Field(pattern=r"\S")
    size: str | None = None
    seconds: str | None = None
    image: str | None = None


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """Pydantic errors as one message naming each field, what is allowed and what came; and the first field."""
    parts, first = [], None
    for e in errors:
        if e.get("type") == "json_invalid":  # its loc is ("body", character offset): no field to name
            parts.append(f"the body is not valid JSON ({e.get('msg')}, at character {e.get('loc', ('', '?'))[-1]})")
            continue
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "query", "path")]
        field = ".".join(loc)
        first = first or (field or None)
        got = e.get("input")
        seen = "" if e.get("type") == "missing" or isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{field or 'body'}: {e.get('msg')}{seen}")
    return "invalid request body: " + "; ".join(parts), first


def _bad_body(err: pydantic.ValidationError | RequestValidationError) -> APIError:
    message, field = _validation_message(list(err.errors()))
    return APIError(400, message, param=field, code="invalid_body")


# ---- stores -----------------------------------------------------------------------------------


class FileStore:
    """Bounded in-memory files (``response_format="url"``): the oldest go first past ``max_files`` or ``max_bytes``."""

    def __init__(self, max_files: int = _FILES_MAX, max_bytes: int = _FILES_MAX_BYTES):
        self.max_files, self.max_bytes = max_files, max_bytes
        self._files: collections.OrderedDict[str, tuple[bytes, str]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, data: bytes, media_type: str) -> str:
        """Store ``data``; returns its id."""
        file_id = f"file-{uuid.uuid4().hex}"
        with self._lock:
            self._files[file_id] = (data, media_type)
            while len(self._files) > self.max_files or (
                len(self._files) > 1 and sum(len(d) for d, _ in self._files.values()) > self.max_bytes
            ):
                self._files.popitem(last=False)
        return file_id

    def get(self, file_id: str) -> tuple[bytes, str]:
        """The file's bytes and media type; a 404 if it is unknown or expired."""
        with self._lock:
            found = self._files.get(file_id)
        if found is None:
            raise APIError(
                404,
                f"no file {file_id!r} (files are kept in memory, the latest {self.max_files}); "
                "ask again with response_format=b64_json to get the bytes in the answer",
                param="file_id",
                code="file_not_found",
            )
        return found


@dataclasses.dataclass(eq=False)
class _Job:
    id: str
    handle: Handle
    model: str
    prompt: str
    size: str | None
    seconds: str
    created_at: int
    arrived: float
    progress: int = 0
    completed_at: int | None = None
    gif: bytes | None = None


class JobStore:
    """Video jobs by id; past ``max_jobs``, the oldest finished jobs are forgotten."""

    def __init__(self, max_jobs: int = _JOBS_MAX):
        self.max_jobs = max_jobs
        self._jobs: collections.OrderedDict[str, _Job] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, job: _Job) -> None:
        """Keep ``job``."""
        with self._lock:
            self._jobs[job.id] = job
            if len(self._jobs) > self.max_jobs:
                for old in [j for j in self._jobs.values() if j.handle.done()][: len(self._jobs) - self.max_jobs]:
                    del self._jobs[old.id]

    def get(self, job_id: str) -> _Job:
        """The job ``job_id``; a 404 if unknown."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None:
            raise APIError(
                404,
                f"no video job {job_id!r} (jobs are kept in memory, the latest {self.max_jobs})",
                param="video_id",
                code="video_not_found",
            )
        return job


def _fraction(engine: Engine, model_id: str, stage: str, loop: str | None, step: int, num_steps: int) -> float:
    """How far a request is through its model, in [0, 1], from its progress (stage path, loop, step)."""
    if model_id in engine.workflows():
        stages = engine.workflow(model_id).stages
        head, _, rest = stage.partition("/")
        labels = [s.label for s in stages]
        if head not in labels:
            return 0.0
        i = labels.index(head)
        return (i + _fraction(engine, stages[i].model, rest, loop, step, num_steps)) / len(labels)
    loops = [node.loop for node in engine.program(model_id).loops]
    if not loops:
        return 0.0
    j = loops.index(loop) if loop in loops else 0
    return (j + (step / num_steps if num_steps else 0.0)) / len(loops)


def _job_json(engine: Engine, job: _Job) -> dict[str, Any]:
    h = job.handle
    status = _STATUS[h.status]
    if status == "completed":
        job.progress = 100
        job.completed_at = job.completed_at or int(time.time())
    elif status in ("queued", "in_progress"):
        p = h.progress
        job.progress = max(
            job.progress, min(99, int(100 * _fraction(engine, job.model, p.stage, p.loop, p.step, p.num_steps)))
        )
    error = None
    if status == "failed":
        err = h.exception(0)
        error = {"code": "generation_failed", "message": f"{type(err).__name__}: {err}"}
    elif status == "cancelled":
        error = {"code": "cancelled", "message": "the job was cancelled"}
    return {
        "id": job.id,
        "object": "video",
        "model": job.model,
        "status": status,
        "progress": job.progress,
        "created_at": job.created_at,
        "completed_at": job.completed_at,
        "expires_at": None,
        "prompt": job.prompt,
        "size": job.size,
        "seconds": job.seconds,
        "remixed_from_video_id": None,
        "error": error,
    }


# ---- the app ----------------------------------------------------------------------------------


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
        return _refused(request, _bad_body(exc))

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
    model = _served(engine, body.model, "image", "/v1/images/generations")
    _size(engine, model, body.size)
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
        "size": _size(engine, model, None),
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
        raise _bad_body(err) from None
    model = _served(engine, body.model, "video", "/v1/videos")
    size = _size(engine, model, body.size)
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
        card = _final_card(engine, model) if model not in engine.workflows() else engine.workflow(model).stages[0].model
        shape = io.image_shape(engine.card(card)) if card in engine.cards() else None
        data = base64.b64encode(upload).decode("ascii") if upload is not None else body.image
        field = "input_reference" if upload is not None or "image" not in fields else "image"
        image = await run_in_threadpool(media.decode_image, data, shape, field=field)
    jp_request = JPRequest(
        model, body.prompt, seed=body.seed, num_steps=body.num_steps, guidance=body.guidance, image=image
    )
    handle = await run_in_threadpool(state.front.submit, jp_request)
    job = _Job(f"video_{uuid.uuid4().hex}", handle, model, body.prompt, size, seconds, int(time.time()), arrived)
    state.jobs.add(job)
    handle.add_done_callback(lambda h: state.metrics.observe("videos", model, time.monotonic() - arrived))
    return JSONResponse(_job_json(engine, job), headers={"openai-poll-after-ms": _POLL_AFTER_MS})


def _seconds(engine: Engine, model_id: str) -> str:
    """A video model's clip length in whole seconds at ``VIDEO_FPS`` (at least 1), as OpenAI's ``seconds`` string."""
    card = _final_card(engine, model_id)
    frames = getattr(engine.card(card).spec.config, "frames", None) if card is not None else None
    return str(max(1, round(frames / VIDEO_FPS))) if frames else "1"


@_router.get("/v1/videos/{video_id}")
async def retrieve_video(video_id: str, request: HTTPRequest) -> JSONResponse:
    """The job object: status, progress, error."""
    state = request.app.state
    job = state.jobs.get(video_id)
    body = _job_json(state.engine, job)
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
    status = _STATUS[job.handle.status]
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
    return JSONResponse({**_job_json(state.engine, job), "object": "video.deleted", "deleted": True})
