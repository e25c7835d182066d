"""A reward served over HTTP: ``remote("http://HOST:PORT/v1/rewards?model=M")``, a host reward that asks a server.

The server is any that speaks ``POST /v1/rewards`` (``jaxpipe serve``, see ``jaxpipe.serve.rewards``):
the batch's images go as base64 PNGs (8-bit: values are rounded to multiples of 1/255 on the way),
with the prompt texts and their numeric metadata; the answer's scores come back as the reward.
It runs through ``jax.pure_callback`` like every ``@jaxpipe.rewards.host`` reward, so a trainer's
step stays one jitted function::

    jaxpipe train flow-grpo --prompts prompts.txt --reward "http://127.0.0.1:8000/v1/rewards?model=digit-scorer"

Nothing is sent when the reward is made; a server that cannot be reached, or answers with an
error, fails the first call with a message naming the URL (and the server's own message).
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxpipe.rewards.hosted import HostPrompts, HostReward, host

__all__ = ["is_url", "remote", "url_model"]

TIMEOUT_S = 120.0
"""How long a call waits for the server by default (seconds)."""


def is_url(spec: Any) -> bool:
    """Whether a ``--reward`` spec is a reward server's URL (``http://`` or ``https://``).

    Args:
      spec: the spec (anything; only a ``str`` can be a URL).

    Returns:
      ``True`` for a URL.
    """
    return isinstance(spec, str) and spec.lower().startswith(("http://", "https://"))


def _split(url: str) -> tuple[str, str]:
    """``(the URL to POST to, the model)``: the ``model`` query moved out of the URL (ValueError without one)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--reward {url!r}: a reward server's URL is http://HOST:PORT/v1/rewards?model=M")
    try:
        _ = parts.port  # urllib checks the port only when it is read
    except ValueError as err:
        raise ValueError(f"--reward {url!r}: {err}") from None
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    models = query.pop("model", [])
    if len(models) != 1 or not models[0]:
        raise ValueError(
            f"--reward {url!r}: name the server's reward model in the URL, e.g. "
            f"{urllib.parse.urlunsplit(parts._replace(query='model=digit-scorer'))}"
        )
    path = parts.path or "/v1/rewards"
    rest = urllib.parse.urlencode(query, doseq=True)
    return urllib.parse.urlunsplit(parts._replace(path=path, query=rest)), models[0]


def url_model(url: str) -> str:
    """The reward model a reward server's URL names (its ``model`` query), e.g. ``"digit-scorer"``.

    Args:
      url: the server's rewards URL.

    Returns:
      The model id.

    Raises:
      ValueError: if ``url`` is not an http(s) URL with one ``model`` query.
    """
    return _split(url)[1]


def _png(image: np.ndarray) -> str:
    from jaxpipe.io import encode_png

    return base64.b64encode(encode_png(image, upscale=1)).decode("ascii")


def _message(response) -> str:
    """The server's error message (an OpenAI-style envelope's ``error.message``), else its body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        return str(body["error"].get("message"))
    if isinstance(body, Mapping) and "detail" in body:
        return str(body["detail"])
    return str(body)[:500]


def remote(url: str, *, timeout: float = TIMEOUT_S) -> HostReward:
    """The reward a server serves at ``url`` (``http://HOST:PORT/v1/rewards?model=M``), as a host reward.

    Each call POSTs ``{"model": M, "images": [B base64 PNGs], "prompts": [B texts], "metadata": {...}}``
    (the prompts' metadata as lists) and returns the B ``score`` s of the answer. Videos are not sent:
    the artifacts must hold ``"image"`` ``(B, H, W, C)`` in [0, 1].

    Args:
      url: the server's rewards URL, naming the reward model in its ``model`` query.
      timeout: seconds to wait for each answer.

    Returns:
      A ``HostReward`` (``jax.pure_callback``: callable inside ``jax.jit``), named ``remote(M)``.

    Raises:
      ValueError: at once, for a URL that is not http(s) or names no model, or without httpx installed. When called: ``ValueError``
        for artifacts without ``"image"``, ``RuntimeError`` naming the URL when the server cannot be
        reached, answers with an error status (its message included) or with another number of scores
        (under ``jax.jit`` these come back as a ``JaxRuntimeError`` carrying the message).
    """
    target, model = _split(url)
    try:
        import httpx  # noqa: F401  (the serve extra's HTTP client: refused now rather than at the first step)
    except ImportError:
        raise ValueError(
            f'--reward {url!r}: a reward server\'s URL needs httpx (pip install "jaxpipe[serve]")'
        ) from None

    def ask(artifacts: Mapping[str, np.ndarray], prompts: HostPrompts) -> np.ndarray:
        import httpx

        if "image" not in artifacts:
            raise ValueError(f"reward server {url}: it scores images; the artifacts hold {sorted(artifacts)}")
        images = np.asarray(artifacts["image"], np.float32)
        body = {"model": model, "images": [_png(im) for im in images], "prompts": list(prompts)}
        if prompts.metadata:
            body["metadata"] = {k: np.asarray(v).tolist() for k, v in prompts.metadata.items()}
        try:
            response = httpx.post(target, json=body, timeout=timeout)
        except httpx.TimeoutException:
            raise RuntimeError(f"reward server {url}: no answer within {timeout:g} s") from None
        except httpx.HTTPError as err:
            raise RuntimeError(
                f"reward server {url}: cannot connect ({err}); is the server running (jaxpipe serve)?"
            ) from None
        if response.status_code != 200:
            raise RuntimeError(f"reward server {url} answered {response.status_code}: {_message(response)}")
        try:
            data = response.json()["data"]
            scores = [float(row["score"]) for row in sorted(data, key=lambda row: row["index"])]
        except (ValueError, KeyError, TypeError) as err:
            raise RuntimeError(f"reward server {url}: the answer is not a /v1/rewards list ({err!r})") from None
        if len(scores) != len(images):
            raise RuntimeError(f"reward server {url} returned {len(scores)} scores for {len(images)} images")
        return np.asarray(scores, np.float32)

    ask.__name__ = ask.__qualname__ = f"remote({model})"
    return host(ask)
