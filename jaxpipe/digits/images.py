"""What every digits judge accepts: images ``(N, 16, 16, 1)``, floating point, in [0, 1] with background 0.

The generators' output convention (``jp.generate(...)["image"]``); renders from ``digits.load_images``
/ ``augment`` are in ``[-1, 1]``: map them with ``(x + 1) / 2``. The scorer-free judges (the
``digit-classifier`` card and the ``readers``) both check their input here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.digits.data import SIZE

__all__ = ["IMAGE_SHAPE", "check"]

IMAGE_SHAPE = (SIZE, SIZE, 1)
"""One image: ``(16, 16, 1)``."""

_RANGE_SLACK = 1e-5  # float rounding allowed outside [0, 1]


def check(images, image_shape: tuple[int, int, int] = IMAGE_SHAPE):
    """``images`` (as a NumPy array, or the tracer itself under ``jax.jit``) or a ValueError naming the problem.

    Shape ``(N, *image_shape)`` with N >= 1 and a floating dtype are always checked; finiteness and the
    range ``[0, 1]`` (give or take float rounding) when the values are concrete.

    Args:
        images: ``(N, *image_shape)`` floating point in ``[0, 1]``: NumPy, JAX, or a tracer under ``jax.jit``.
        image_shape: one image's shape (default ``IMAGE_SHAPE``, ``(16, 16, 1)``).

    Returns:
        ``images`` as a NumPy array (a tracer is returned as it is), its dtype unchanged.

    Raises:
        ValueError: on a wrong shape, a non-floating dtype, NaN or infinite values, or values outside ``[0, 1]``.
    """
    traced = isinstance(images, jax.core.Tracer)
    x = images if traced else np.asarray(images)
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(image_shape) or x.shape[0] == 0:
        raise ValueError(
            f"images must have shape (N, {', '.join(map(str, image_shape))}) with N >= 1, in [0, 1]; got {tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"images must be floating point in [0, 1]; got dtype {x.dtype}")
    if traced:
        return x
    if not np.isfinite(x).all():
        raise ValueError("images contain NaN or infinite values")
    low, high = float(x.min()), float(x.max())
    if low < -_RANGE_SLACK or high > 1.0 + _RANGE_SLACK:
        raise ValueError(
            f"images must be in [0, 1] (background 0; got values in [{low:.3g}, {high:.3g}]); "
            "map [-1, 1] images with (x + 1) / 2"
        )
    return x
