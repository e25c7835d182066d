"""Reading and writing artifacts: images and videos in [0, 1] to PNG and GIF files (or their bytes), images read
back at a card's shape; training curves to PNG."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

__all__ = [
    "to_uint8",
    "encode_png",
    "encode_gif",
    "save_png",
    "save_grid",
    "save_gif",
    "image_shape",
    "read_image",
    "plot_curves",
]


def to_uint8(image, *, upscale: int = 1) -> np.ndarray:
    """An image in [0, 1] as uint8 pixels, nearest-upscaled.

    Values are clipped to [0, 1] (NaN as 0) and rounded to ``0..255``.

    Args:
      image: ``(H, W, C)`` floats in [0, 1], ``C`` 1 or 3.
      upscale: the integer upscale factor ``s`` (>= 1).

    Returns:
      ``(H·s, W·s)`` uint8 for one channel, ``(H·s, W·s, 3)`` for three.

    Raises:
      ValueError: on another shape or ``upscale < 1``.
    """
    array = np.asarray(image, np.float32)
    if array.ndim != 3 or array.shape[-1] not in (1, 3):
        raise ValueError(f"image must be (H, W, 1) or (H, W, 3); got {array.shape}")
    if upscale < 1:
        raise ValueError(f"upscale must be >= 1 (got {upscale})")
    array = np.clip(np.nan_to_num(array), 0.0, 1.0)
    array = np.repeat(np.repeat(array, upscale, axis=0), upscale, axis=1)
    pixels = np.round(array * 255.0).astype(np.uint8)
    return pixels[..., 0] if pixels.shape[-1] == 1 else pixels


def _prepare(path: str | os.PathLike) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return path


def encode_png(image, *, upscale: int = 1) -> bytes:
    """One image in [0, 1] as PNG bytes (8-bit; grey for one channel, RGB for three).

    Args:
      image: ``(H, W, C)`` in [0, 1], ``C`` 1 or 3.
      upscale: the integer upscale factor.

    Returns:
      The PNG file's bytes.

    Raises:
      ValueError: as ``to_uint8``.
    """
    buffer = io.BytesIO()
    Image.fromarray(to_uint8(image, upscale=upscale)).save(buffer, format="PNG")
    return buffer.getvalue()


def encode_gif(video, *, upscale: int = 1, fps: int = 8) -> bytes:
    """A video in [0, 1] as the bytes of a looping GIF (what ``save_gif`` writes).

    Args:
      video: ``(T, H, W, C)`` in [0, 1], ``C`` 1 or 3.
      upscale: the integer upscale factor.
      fps: frames per second.

    Returns:
      The GIF file's bytes.

    Raises:
      ValueError: if ``video`` is not 4-D, or as ``to_uint8``.
    """
    video = np.asarray(video)
    if video.ndim != 4:
        raise ValueError(f"video must be (T, H, W, C); got {video.shape}")
    frames = [Image.fromarray(to_uint8(frame, upscale=upscale)) for frame in video]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    return buffer.getvalue()


def save_png(image, path: str | os.PathLike, *, upscale: int = 8) -> str:
    """Write one image in [0, 1] as a PNG (nearest-upscaled so tiny digits are visible).

    Args:
      image: ``(H, W, C)`` in [0, 1], ``C`` 1 or 3.
      path: the file to write (its folder is created).
      upscale: the integer upscale factor.

    Returns:
      The path written, as a string.

    Raises:
      ValueError: as ``to_uint8``.
    """
    data = encode_png(image, upscale=upscale)
    path = _prepare(path)
    with open(path, "wb") as file:
        file.write(data)
    return path


def save_grid(images: Sequence, path: str | os.PathLike, *, upscale: int = 8, pad: int = 1) -> str:
    """Write images side by side in one PNG, ``pad`` (upscaled) black columns between them.

    Args:
      images: N images ``(H, W, C)`` in [0, 1] of one shape (or an ``(N, H, W, C)`` array).
      path: the file to write (its folder is created).
      upscale: the integer upscale factor.
      pad: the gap between images, in source pixels.

    Returns:
      The path written, as a string.

    Raises:
      ValueError: if ``images`` is empty, or as ``to_uint8``.
    """
    tiles = [to_uint8(im, upscale=upscale) for im in images]
    if not tiles:
        raise ValueError("images must hold at least one image")
    h = tiles[0].shape[0]
    spacer = np.zeros((h, pad * upscale) + tiles[0].shape[2:], np.uint8)
    row = np.concatenate([t for tile in tiles for t in (tile, spacer)][:-1], axis=1)
    path = _prepare(path)
    Image.fromarray(row).save(path, format="PNG")
    return path


def save_gif(video, path: str | os.PathLike, *, upscale: int = 8, fps: int = 8) -> str:
    """Write a video in [0, 1] as a looping GIF.

    Args:
      video: ``(T, H, W, C)`` in [0, 1], ``C`` 1 or 3.
      path: the file to write (its folder is created).
      upscale: the integer upscale factor.
      fps: frames per second.

    Returns:
      The path written, as a string.

    Raises:
      ValueError: if ``video`` is not 4-D, or as ``to_uint8``.
    """
    data = encode_gif(video, upscale=upscale, fps=fps)
    path = _prepare(path)
    with open(path, "wb") as file:
        file.write(data)
    return path


def image_shape(card) -> tuple[int, int, int] | None:
    """The ``(H, W, C)`` of the images ``card`` reads, where its config says (``image_shape``, or
    ``image_size`` with its VAE's ``image_channels``); ``None`` where it does not.

    Args:
      card: a ``Card``.

    Returns:
      The shape, or ``None``.
    """
    config = card.spec.config
    shape = getattr(config, "image_shape", None)
    if shape is None and hasattr(config, "image_size") and hasattr(getattr(config, "vae", None), "image_channels"):
        shape = (config.image_size, config.image_size, config.vae.image_channels)
    return tuple(shape) if shape is not None else None


def read_image(source, shape: tuple[int, int, int] | None = None) -> np.ndarray:
    """An image file as ``(H, W, C)`` float32 in [0, 1], at ``shape`` where given (box-averaged: a PNG
    ``save_png`` wrote, nearest-upscaled 8x, reads back as the image it saved).

    Args:
      source: a path, the file's bytes, or a binary file object.
      shape: the ``(H, W, C)`` to convert to (``C`` 1: grey, 3: RGB), or ``None`` to keep the file's
        size and read it grey or RGB by its mode.

    Returns:
      ``(H, W, C)`` float32 in [0, 1].

    Raises:
      ValueError: if ``source`` cannot be read as an image (the reason named).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    try:
        with Image.open(source) as picture:
            channels = shape[2] if shape else (1 if picture.mode in ("1", "L", "LA", "I", "F") else 3)
            picture = picture.convert("L" if channels == 1 else "RGB")
            if shape and picture.size != (shape[1], shape[0]):
                picture = picture.resize((shape[1], shape[0]), Image.Resampling.BOX)
            pixels = np.asarray(picture, np.float32) / 255.0
    except (OSError, Image.DecompressionBombError) as err:  # PIL's UnidentifiedImageError is an OSError
        raise ValueError(f"cannot be read as an image ({err})") from None
    return pixels.reshape(pixels.shape[:2] + (channels,))


def plot_curves(
    rows: Sequence[Mapping[str, float]],
    keys: Sequence[str],
    path: str | os.PathLike,
    *,
    title: str | None = None,
    x: str = "step",
    ylabel: str | None = None,
) -> str:
    """Plot metrics ``keys`` of per-step ``rows`` (e.g. ``fit``'s history) against ``x`` into one PNG.

    Each curve is drawn raw (faint) and as a moving mean over ~1/10 of the run (solid). Keys a row
    lacks, and non-finite values, are left out (they show as gaps). Uses matplotlib's Agg canvas
    directly: no display, no global backend change.

    Args:
      rows: one mapping of metric values per step.
      keys: the metrics to plot.
      path: the PNG to write (its folder is created).
      title: the plot's title, if any.
      x: the row key of the x axis (a row without it uses its index).
      ylabel: the y axis label, if any.

    Returns:
      The path written, as a string.

    Raises:
      ValueError: if ``keys`` is empty or no row has any of them.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not keys:
        raise ValueError("keys must name at least one metric")
    present = [k for k in keys if any(k in row for row in rows)]
    if not present:
        raise ValueError(f"no row has any of the metrics {list(keys)}")
    fig = Figure(figsize=(6.4, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, key in enumerate(present):
        points = [(row.get(x, n), row[key]) for n, row in enumerate(rows) if key in row and math.isfinite(row[key])]
        if not points:
            continue
        steps, values = (np.asarray(v, np.float64) for v in zip(*points))
        color = f"C{i}"
        window = max(1, len(values) // 10)
        if window > 1:
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1 :], smooth, color=color, label=f"{key} (moving mean of {window})")
        else:
            ax.plot(steps, values, color=color, marker="o", markersize=3, label=key)
    ax.set_xlabel(x)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = _prepare(path)
    fig.savefig(path, dpi=120)
    return path
