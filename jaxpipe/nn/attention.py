"""Softmax attention by a chosen implementation: what lets a 4,096- or 32,760-token sequence fit.

``"xla"`` (the default) is ``jax.nn.dot_product_attention``'s XLA path: it materialises the
``(B, H, Lq, Lk)`` scores. ``"cudnn"`` is the same call's cuDNN flash-attention kernel (NVIDIA GPUs
only, bfloat16 / float16). ``"chunked"`` is exact attention in pure JAX over query blocks of
``chunk`` rows (``lax.map``), each block's softmax rematerialised in the backward pass, so neither
pass holds more than ``(B, H, chunk, Lk)`` scores: the memory profile of a flash kernel on any
backend (CPU and TPU included), at the price of recomputing each block's scores once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["IMPLEMENTATIONS", "attention", "check_implementation"]

IMPLEMENTATIONS = ("xla", "cudnn", "chunked")
CHUNK = 1024  # query rows per block of the chunked implementation


def check_implementation(implementation: str, *, backend: str | None = None) -> str:
    """``implementation`` if it is one of ``IMPLEMENTATIONS`` and can run on ``backend``, else a ``ValueError``.

    Args:
      implementation: ``"xla"``, ``"cudnn"`` or ``"chunked"``.
      backend: the platform to check against (default ``jax.default_backend()``).

    Returns:
      ``implementation``.

    Raises:
      ValueError: on an unknown name, or ``"cudnn"`` off an NVIDIA GPU.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS} (got {implementation!r})")
    backend = backend or jax.default_backend()
    if implementation == "cudnn" and backend != "gpu":
        raise ValueError(
            f"attention='cudnn' is cuDNN's flash attention, which needs an NVIDIA GPU (this backend: {backend}); "
            "use 'chunked' for its memory profile on any backend, or 'xla'"
        )
    return implementation


def _chunked(q: jax.Array, k: jax.Array, v: jax.Array, chunk: int) -> jax.Array:
    b, lq, h, d = q.shape
    pad = -lq % chunk
    blocks = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, (lq + pad) // chunk, chunk, h, d)

    # checkpointed: the backward recomputes a block's scores instead of keeping every block's
    @jax.checkpoint
    def block(qb: jax.Array) -> jax.Array:
        return jax.nn.dot_product_attention(qb, k, v)

    out = jax.lax.map(block, jnp.moveaxis(blocks, 1, 0))
    return jnp.moveaxis(out, 0, 1).reshape(b, lq + pad, h, d)[:, :lq]


def attention(
    q: jax.Array, k: jax.Array, v: jax.Array, *, implementation: str = "xla", chunk: int | None = None
) -> jax.Array:
    """``softmax(q·kᵀ/√d)·v`` per head, without a mask.

    Args:
      q: ``(B, Lq, H, D)`` queries.
      k: ``(B, Lk, H, D)`` keys.
      v: ``(B, Lk, H, D)`` values.
      implementation: one of ``IMPLEMENTATIONS`` (module docstring).
      chunk: query rows per block for ``"chunked"`` (default ``CHUNK``; a sequence no longer than it runs in one
        block).

    Returns:
      ``(B, Lq, H, D)`` in ``q``'s dtype.
    """
    chunk = CHUNK if chunk is None else chunk
    if implementation == "chunked" and q.shape[1] > chunk:
        return _chunked(q, k, v, chunk)
    if implementation == "cudnn":
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn")
    return jax.nn.dot_product_attention(q, k, v)
