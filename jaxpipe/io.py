"""Writing artifacts: images and videos in [0, 1] to PNG and GIF files; training curves to PNG."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

__all__ = ["to_uint8", "save_png", "save_grid", "save_gif", "plot_curves"]


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
    path = _prepare(path)
    Image.fromarray(to_uint8(image, upscale=upscale)).save(path, format="PNG")
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
    video = np.asarray(video)
    if video.ndim != 4:
        raise ValueError(f"video must be (T, H, W, C); got {video.shape}")
    frames = [Image.fromarray(to_uint8(frame, upscale=upscale)) for frame in video]
    path = _prepare(path)
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
    return path


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
