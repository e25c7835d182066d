"""Prompt text as fixed-width UTF-8 byte rows: the exact strings cross ``jit`` as ``(P, W)`` uint8 arrays."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["WIDTH_MULTIPLE", "decode_text", "encode_text", "text_width"]

WIDTH_MULTIPLE = 64
"""Text widths are rounded up to a multiple of this many bytes (few distinct shapes, few compiles)."""


def utf8(texts: Sequence[str]) -> list[bytes]:
    """Each prompt's UTF-8 bytes, after checking it is a str without NUL (``texts`` a sequence, not one str)."""
    if isinstance(texts, str):
        raise TypeError(f"expected a sequence of prompt strings, got one string {texts!r}; wrap it in a list")
    out = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"prompt {i} must be a str (got {type(text).__name__})")
        if "\x00" in text:
            raise ValueError(f"prompt {i} ({text!r}) contains a NUL character; prompts are stored zero-padded")
        out.append(text.encode("utf-8"))
    return out


def text_width(texts: Sequence[str]) -> int:
    """The text width for ``texts``: the longest prompt's UTF-8 length rounded up to ``WIDTH_MULTIPLE``.

    Args:
      texts: prompt strings (no NUL characters).

    Returns:
      The width in bytes, a positive multiple of ``WIDTH_MULTIPLE``.

    Raises:
      TypeError: ``texts`` is one string, or holds a non-string.
      ValueError: a prompt contains a NUL.
    """
    longest = max((len(b) for b in utf8(texts)), default=0)
    return max(1, math.ceil(longest / WIDTH_MULTIPLE)) * WIDTH_MULTIPLE


def encode_text(texts: Sequence[str], width: int) -> np.ndarray:
    """Prompts as their UTF-8 bytes, zero-padded to ``width``.

    Args:
      texts: P prompt strings (no NUL characters).
      width: the row width W in bytes.

    Returns:
      ``(P, width)`` uint8.

    Raises:
      ValueError: a prompt is longer than ``width`` bytes (never truncated) or contains a NUL.
    """
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width <= 0:
        raise ValueError(f"width must be a positive int (got {width!r})")
    encoded = utf8(texts)
    out = np.zeros((len(encoded), int(width)), np.uint8)
    for i, raw in enumerate(encoded):
        if len(raw) > width:
            raise ValueError(
                f"prompt {i} is {len(raw)} UTF-8 bytes, longer than the text width {width} "
                f"({texts[i][:40]!r}...); prompts are never truncated: use a wider width"
            )
        out[i, : len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_text(array: Any) -> list[str]:
    """The strings of ``(P, W)`` uint8 zero-padded UTF-8 rows (``encode_text``'s inverse).

    Args:
      array: ``(P, W)`` uint8, a host or (concrete) device array.

    Returns:
      P strings, trailing zero bytes dropped.

    Raises:
      TypeError: ``array`` is a tracer (decode on the host).
      ValueError: not a 2-D uint8 array, or a row is not valid UTF-8.
    """
    rows = host_array(array, "decode_text")
    if rows.ndim != 2 or rows.dtype != np.uint8:
        raise ValueError(f"decode_text takes (P, W) uint8 rows (got {rows.dtype}{rows.shape})")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(row.tobytes().rstrip(b"\x00").decode("utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"text row {i} is not valid UTF-8: {err}") from None
    return out


def host_array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"{what} reads prompt values and runs on the host, not inside jax.jit / vmap / grad; "
            "call it outside the traced function (or use a host reward: jaxpipe.rewards.host)"
        )
    return np.asarray(value)
