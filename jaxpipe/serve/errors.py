"""The server's errors, as OpenAI-style JSON envelopes: ``{"error": {"message", "type", "param", "code"}}``.

Every route raises ``APIError`` (or lets the engine's own ``ValueError`` / ``TypeError`` through, which
the app answers as 400): the status says what kind of problem it is (400 / 422 a bad body, 404 an
unknown model or job, 429 over capacity with ``Retry-After``, 503 while draining) and the message
names the field and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["APIError", "envelope"]

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An HTTP error with an OpenAI-style body.

    Args:
      status: the HTTP status.
      message: what went wrong and what is allowed (one or two sentences).
      type: the error type (default: by status, e.g. ``"invalid_request_error"`` for 400).
      param: the body field at fault, if any.
      code: a short machine-readable code (``"model_not_found"``, ``"busy"``, ``"draining"`` ...).
      headers: extra response headers (``{"Retry-After": "1"}`` on 429).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.type = type or _TYPES.get(self.status, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.counted = False
        """Whether the front already counted this refusal (by its reason) for ``/metrics``."""

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {...}}``."""
        return envelope(self.message, self.type, self.param, self.code)


def envelope(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """An OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}``.

    Args:
      message: what went wrong.
      type: the error type.
      param: the field at fault, if any.
      code: a short code, if any.

    Returns:
      The body, a JSON-ready dict.
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
