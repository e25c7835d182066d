"""Building blocks shared by the jaxpipe networks: attention, MLP, sinusoidal embeddings."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate

__all__ = [
    "Attention",
    "MLP",
    "sincos_1d",
    "sincos_grid",
    "attention_mask",
    "check_divisible",
    "check_sizes",
    "compute_dtype",
]


def sincos_1d(positions: jax.Array, dim: int, max_period: float = 10_000.0) -> jax.Array:
    """Sinusoidal embedding of float positions: ``dim // 2`` sines, then as many cosines.

    Frequencies go geometrically from 1 to ``1 / max_period``; an odd ``dim`` is zero-padded.

    Args:
      positions: float positions (or timesteps), any shape ``(...)``.
      dim: the embedding width.
      max_period: the longest period.

    Returns:
      ``(..., dim)`` float32.
    """
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
    angles = jnp.asarray(positions, jnp.float32)[..., None] * freqs
    emb = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return jnp.pad(emb, [(0, 0)] * (emb.ndim - 1) + [(0, dim - 2 * half)])


def sincos_grid(frames: int, rows: int, cols: int, dim: int) -> jax.Array:
    """Fixed ``(frames·rows·cols, dim)`` position embedding of a token grid, frame-major.

    Built from the shapes at call time, so one network serves any resolution or clip length. The
    features are ``sincos_1d`` of the frame, row and column indices (``2·(dim // 6)`` each for rows
    and columns, the rest for frames).

    Args:
      frames: the grid's frame count.
      rows: its row count.
      cols: its column count.
      dim: the embedding width.

    Returns:
      ``(frames·rows·cols, dim)`` float32.
    """
    d_space = 2 * (dim // 6)
    d_time = dim - 2 * d_space
    t, r, c = jnp.meshgrid(jnp.arange(frames), jnp.arange(rows), jnp.arange(cols), indexing="ij")
    emb = jnp.concatenate(
        [sincos_1d(t.ravel(), d_time), sincos_1d(r.ravel(), d_space), sincos_1d(c.ravel(), d_space)], axis=-1
    )
    return emb


def attention_mask(key_mask: jax.Array | None, num_queries: int) -> jax.Array | None:
    """``(B, 1, Lq, Lk)`` boolean mask from a ``(B, Lk)`` key mask.

    A row with no valid key (an empty prompt) attends to every key instead of producing NaNs.

    Args:
      key_mask: ``(B, Lk)``, true on valid keys, or ``None``.
      num_queries: ``Lq``.

    Returns:
      ``(B, 1, Lq, Lk)`` bool, or ``None`` when ``key_mask`` is ``None`` (attend everywhere).
    """
    if key_mask is None:
        return None
    key_mask = jnp.asarray(key_mask, bool)
    key_mask = key_mask | ~jnp.any(key_mask, axis=-1, keepdims=True)
    return jnp.broadcast_to(key_mask[:, None, None, :], (key_mask.shape[0], 1, num_queries, key_mask.shape[1]))


class Attention(nnx.Module):
    """Multi-head attention of queries ``(B, Lq, dim)`` over a context ``(B, Lk, context_dim)``."""

    def __init__(self, dim: int, heads: int, *, context_dim: int | None = None, dtype=jnp.float32, rngs: nnx.Rngs):
        """Builds the projections.

        Args:
          dim: the query (and output) width.
          heads: attention heads (``dim`` must be divisible by it).
          context_dim: the context width (default ``dim``: self-attention).
          dtype: the compute dtype.
          rngs: the initialisation RNGs.

        Raises:
          ValueError: if ``dim`` is not divisible by ``heads``.
        """
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        context_dim = dim if context_dim is None else context_dim
        self.heads = heads
        self.q = nnx.Linear(dim, dim, use_bias=False, dtype=dtype, rngs=rngs)
        self.kv = nnx.Linear(context_dim, 2 * dim, use_bias=False, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(dim, dim, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array, context: jax.Array | None = None, key_mask: jax.Array | None = None) -> jax.Array:
        """Attends ``x`` over ``context``.

        Args:
          x: queries ``(B, Lq, dim)``.
          context: ``(B, Lk, context_dim)`` (default ``x``: self-attention).
          key_mask: ``(B, Lk)`` valid keys, or ``None`` (see ``attention_mask``).

        Returns:
          ``(B, Lq, dim)``.
        """
        context = x if context is None else context
        b, lq, d = x.shape
        q = self.q(x).reshape(b, lq, self.heads, d // self.heads)
        k, v = jnp.split(self.kv(context).reshape(b, context.shape[1], 2 * self.heads, d // self.heads), 2, axis=2)
        y = jax.nn.dot_product_attention(q, k, v, mask=attention_mask(key_mask, lq))
        return self.out(y.reshape(b, lq, d))


class MLP(nnx.Module):
    """Two-layer GELU feed-forward ``dim -> hidden -> dim``."""

    def __init__(self, dim: int, hidden: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(dim, hidden, dtype=dtype, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, dim, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``fc2(gelu(fc1(x)))`` over the last axis: ``(..., dim) -> (..., dim)``."""
        return self.fc2(jax.nn.gelu(self.fc1(x)))


def check_sizes(config, names, *, minimum: int = 1, optional: bool = False) -> None:
    """Checks that each of ``config``'s fields ``names`` is an int ``>= minimum`` (bools refused).

    Args:
      config: a config dataclass instance.
      names: the fields to check.
      minimum: the smallest allowed value.
      optional: also allow ``None``.

    Raises:
      ValueError: naming ``Config.field`` and the value, for the first field that fails.
    """
    validate.counts(config, *names, minimum=minimum, optional=optional, prefix=f"{type(config).__name__}.")


def check_divisible(config, name: str, by: str) -> None:
    """Checks that ``config``'s field ``name`` is divisible by its field ``by`` (a width by its heads).

    Args:
      config: a config dataclass instance (its sizes already checked).
      name: the field divided.
      by: the field dividing it.

    Raises:
      ValueError: naming both fields and their values.
    """
    value, divisor = getattr(config, name), getattr(config, by)
    validate.rule(value % divisor == 0, f"{name} ({value}) must be divisible by {by} ({divisor})")


def compute_dtype(name: str):
    """The jnp dtype for a config's ``dtype`` string.

    Args:
      name: ``"float32"`` or ``"bfloat16"``.

    Returns:
      ``jnp.float32`` or ``jnp.bfloat16``.

    Raises:
      ValueError: on any other name.
    """
    allowed = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    validate.rule(name in allowed, f"dtype must be one of {sorted(allowed)} (got {name!r})")
    return allowed[name]
