"""The reward network of the digits world: a small CNN scoring a digit and its attributes.

Images ``(B, S, S, C)`` in ``[-1, 1]`` -> logits per head: ``"digit"`` (10), ``"stroke"`` (thin,
thick), ``"position"`` (left, center, right), ``"brightness"`` (dim, bright).

Layout: two coordinate channels (x, y in ``[-1, 1]``) are appended to the image; a stem conv at
full resolution; then one stage per further width, each a stride-2 conv plus a residual 3×3 conv;
the final ``S/f × S/f`` feature map is **flattened**, not pooled, so where the ink sits (the
position head) and how bright it is (no normalisation layers anywhere) survive to the heads;
an MLP trunk; one linear head per label.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.digits.data import ATTRIBUTE_WORDS
from jaxpipe.digits.words import DIGIT_WORDS
from jaxpipe.nn.layers import compute_dtype

__all__ = ["HEADS", "DigitScorer", "ScorerConfig", "coordinate_channels"]

HEADS: dict[str, int] = {"digit": len(DIGIT_WORDS), **{name: len(words) for name, words in ATTRIBUTE_WORDS.items()}}
"""Output heads and their class counts: digit 10, stroke 2, position 3, brightness 2."""


@dataclasses.dataclass(frozen=True)
class ScorerConfig:
    """Sizes of the scorer; the feature map is downsampled by ``2 ** (len(widths) - 1)`` before flattening.

    Attributes:
        image_size: the side ``S`` of the square input images.
        image_channels: the input's channels ``C``.
        widths: the stem's channels, then one stride-2 stage per further width.
        hidden: the width of the MLP trunk.
        coords: append the two coordinate channels (``coordinate_channels``) to the image.
        dtype: the compute dtype's name (the logits are float32 whatever it is).

    Raises:
        ValueError: if ``widths`` is empty, ``image_size`` is not a positive multiple of ``downsample``, or
            ``dtype`` is not a known compute dtype.
    """

    image_size: int = 16
    image_channels: int = 1
    widths: tuple[int, ...] = (16, 32, 32)
    hidden: int = 64
    coords: bool = True
    dtype: str = "float32"

    def __post_init__(self):
        validate.rule(bool(self.widths), "ScorerConfig.widths must name at least one width")
        validate.rule(
            self.image_size > 0 and not self.image_size % self.downsample,
            f"ScorerConfig.image_size ({self.image_size}) must be a positive multiple of the downsampling "
            f"factor 2**(len(widths)-1) = {self.downsample}",
        )
        compute_dtype(self.dtype)

    @classmethod
    def tiny(cls, **overrides) -> ScorerConfig:
        """The bundled ``digit-scorer`` size (16×16 grey digits, ~60k parameters).

        Args:
            **overrides: fields to change.

        Returns:
            The config.
        """
        return cls(**overrides)

    @classmethod
    def large(cls, **overrides) -> ScorerConfig:
        """128×128 RGB, ~22M parameters; for abstract construction (``nnx.eval_shape``) and accelerators.

        Args:
            **overrides: fields to change.

        Returns:
            The config.
        """
        return cls(
            **{
                "image_size": 128,
                "image_channels": 3,
                "widths": (64, 128, 256, 512, 512, 512),
                "hidden": 1024,
                **overrides,
            }
        )

    @property
    def downsample(self) -> int:
        """The factor ``2 ** (len(widths) - 1)`` the stages shrink the image side by."""
        return 2 ** (len(self.widths) - 1)

    @property
    def feature_side(self) -> int:
        """Side of the feature map that is flattened into the trunk."""
        return self.image_size // self.downsample


def _conv(cin, cout, dtype, rngs, *, stride=1):
    return nnx.Conv(cin, cout, (3, 3), strides=(stride, stride), padding="SAME", dtype=dtype, rngs=rngs)


def coordinate_channels(batch: int, size: int, dtype=jnp.float32) -> jax.Array:
    """``(batch, size, size, 2)`` pixel-centre coordinates: channel 0 is x (left -1 … right 1), channel 1 is y.

    Args:
        batch: the number of rows ``B``.
        size: the image side ``S``.
        dtype: the result's dtype.

    Returns:
        The coordinates ``(batch, size, size, 2)``, in ``(-1, 1)`` (top row: y near -1).
    """
    axis = (jnp.arange(size, dtype=jnp.float32) + 0.5) / size * 2.0 - 1.0
    y, x = jnp.meshgrid(axis, axis, indexing="ij")
    return jnp.broadcast_to(jnp.stack([x, y], axis=-1), (batch, size, size, 2)).astype(dtype)


class DigitScorer(nnx.Module):
    """CNN ``images (B, S, S, C)`` in ``[-1, 1]`` -> ``{head: logits (B, K)}`` for the heads in ``HEADS``."""

    def __init__(self, cfg: ScorerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = compute_dtype(cfg.dtype)
        w = cfg.widths
        self.stem = _conv(cfg.image_channels + (2 if cfg.coords else 0), w[0], dt, rngs)
        self.down = nnx.List([_conv(w[i], w[i + 1], dt, rngs, stride=2) for i in range(len(w) - 1)])
        self.mix = nnx.List([_conv(w[i + 1], w[i + 1], dt, rngs) for i in range(len(w) - 1)])
        self.trunk = nnx.Linear(cfg.feature_side**2 * w[-1], cfg.hidden, dtype=dt, rngs=rngs)
        self.heads = nnx.Dict({name: nnx.Linear(cfg.hidden, k, dtype=dt, rngs=rngs) for name, k in HEADS.items()})

    def check_images(self, images) -> jax.Array:
        """``images`` as an array, or a ValueError naming the expected ``(B, S, S, C)`` shape.

        Args:
            images: ``(B, S, S, C)`` floating point in ``[-1, 1]`` (the range is not checked).

        Returns:
            ``images`` as a ``jax.Array``.

        Raises:
            ValueError: on a wrong shape or a non-floating dtype.
        """
        images = jnp.asarray(images)
        cfg = self.cfg
        expected = (cfg.image_size, cfg.image_size, cfg.image_channels)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must have shape (B, {', '.join(map(str, expected))}) with values in [-1, 1]; got {tuple(images.shape)}"
            )
        if not jnp.issubdtype(images.dtype, jnp.floating):
            raise ValueError(f"images must be floating point in [-1, 1]; got dtype {images.dtype}")
        return images

    def __call__(self, images: jax.Array) -> dict[str, jax.Array]:
        """Logits ``{"digit": (B, 10), "stroke": (B, 2), "position": (B, 3), "brightness": (B, 2)}`` (float32)."""
        images = self.check_images(images)
        b = images.shape[0]
        h = images
        if self.cfg.coords:
            h = jnp.concatenate([h, coordinate_channels(b, self.cfg.image_size, h.dtype)], axis=-1)
        h = jax.nn.silu(self.stem(h))
        for down, mix in zip(self.down, self.mix):
            h = jax.nn.silu(down(h))
            h = h + jax.nn.silu(mix(h))
        h = jax.nn.silu(self.trunk(h.reshape(b, -1)))
        return {name: self.heads[name](h).astype(jnp.float32) for name in HEADS}
