"""Media for the server: artifacts as PNG / GIF bytes and base64, and request images decoded.

The encoders are ``jaxpipe.io``'s (what ``jaxpipe generate`` writes, here at the artifact's own
size: no upscale), and ``decode_image`` reads an image the way ``jaxpipe generate --image`` does
(``jaxpipe.io.read_image``: converted to the card's channels, box-resized to its size).
"""

from __future__ import annotations

import base64
import binascii
import re
from io import BytesIO
from typing import Any

import numpy as np

from jaxpipe import io
from jaxpipe.serve.errors import APIError

__all__ = ["b64", "decode_image", "encode_gif", "encode_png"]

_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,(?P<data>.*)$", re.DOTALL
)


def encode_png(image) -> bytes:
    """An image ``(H, W, C)`` in [0, 1] as 8-bit PNG bytes (grey when ``C == 1``, RGB when 3).

    Args:
      image: ``(H, W, C)`` in [0, 1] (NumPy or JAX).

    Returns:
      The PNG bytes.

    Raises:
      ValueError: on another shape (``jaxpipe.io.to_uint8``).
    """
    return io.encode_png(np.asarray(image), upscale=1)


def encode_gif(video, *, fps: int = 8) -> bytes:
    """A video ``(T, H, W, C)`` in [0, 1] as the bytes of a looping GIF (as ``jaxpipe generate`` writes).

    Args:
      video: ``(T, H, W, C)`` in [0, 1].
      fps: frames per second.

    Returns:
      The GIF bytes.

    Raises:
      ValueError: on another shape.
    """
    return io.encode_gif(np.asarray(video), upscale=1, fps=fps)


def b64(data: bytes) -> str:
    """``data`` as standard base64 text (what ``b64_json`` fields and data URLs carry).

    Args:
      data: the bytes.

    Returns:
      The base64 text (ASCII).
    """
    return base64.b64encode(data).decode("ascii")


def encode_npy(array: Any) -> bytes:
    """``array`` as the bytes of a ``.npy`` file, exactly (float32 bits kept): what ``output_format="npy"`` sends.

    Args:
      array: any array (a JAX or NumPy array).

    Returns:
      The ``.npy`` file's bytes (``numpy.load`` reads them back).
    """
    buffer = BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def decode_image(data: str, shape: tuple[int, int, int] | None = None, *, field: str = "image") -> np.ndarray:
    """An image sent in a request body: raw base64, or a ``data:image/...;base64,...`` URL.

    Args:
      data: the base64 text or data URL.
      shape: the card's ``(H, W, C)`` to convert and box-resize to (``jaxpipe.io.image_shape``), or
        ``None`` to keep the file's size and mode (grey or RGB).
      field: the body field it came from, named in errors (``"images[2]"``).

    Returns:
      ``(H, W, C)`` float32 in [0, 1].

    Raises:
      APIError: 400 naming ``field`` when ``data`` is not a string, not base64, a data URL that is not
        base64, or bytes that are not an image.
    """
    if not isinstance(data, str) or not data:
        raise APIError(
            400,
            f"{field} must be a base64 PNG string or a data:image/png;base64,... URL (got {type(data).__name__})",
            param=field,
            code="invalid_image",
        )
    text = data.strip()
    if text.startswith("data:"):
        match = _DATA_URL.match(text)
        if match is None or not match["b64"]:
            raise APIError(
                400,
                f"{field}: a data URL must be data:image/png;base64,<base64 bytes> (got {text[:40]!r}...)",
                param=field,
                code="invalid_image",
            )
        if match["mime"] and not match["mime"].startswith("image/"):
            raise APIError(
                400, f"{field}: a data URL must hold an image (got {match['mime']})", param=field, code="invalid_image"
            )
        text = match["data"]
    try:
        raw = base64.b64decode(re.sub(r"\s+", "", text), validate=True)
    except (binascii.Error, ValueError):
        raise APIError(
            400,
            f"{field} is not valid base64 (send a base64 PNG or a data:image/png;base64,... URL)",
            param=field,
            code="invalid_image",
        ) from None
    try:
        return io.read_image(raw, shape)
    except ValueError as err:
        raise APIError(400, f"{field} {err}", param=field, code="invalid_image") from None
