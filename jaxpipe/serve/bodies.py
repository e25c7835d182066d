"""The request bodies of the image and video routes (pydantic), and a bad body as one error naming each field."""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from fastapi.exceptions import RequestValidationError

from jaxpipe.request import MAX_SEED
from jaxpipe.serve.errors import APIError

__all__ = ["ImageBody", "MAX_STEPS", "VIDEO_FPS", "VideoBody", "bad_body"]

MAX_STEPS = 1000
"""The most denoising steps one HTTP request may ask for (the engine has no bound; a server needs one)."""
VIDEO_FPS = 8
"""Frames per second of served GIFs (and a video job's ``seconds``)."""


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


def bad_body(err: pydantic.ValidationError | RequestValidationError) -> APIError:
    """A body that failed validation as one 400 naming each bad field, what is allowed and what came.

    Args:
      err: pydantic's (or FastAPI's) validation error.

    Returns:
      The ``APIError`` (``code="invalid_body"``, ``param`` the first bad field).
    """
    message, field = _validation_message(list(err.errors()))
    return APIError(400, message, param=field, code="invalid_body")
