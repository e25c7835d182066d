"""One layer of the MoT (``jaxpipe.nn.mot``) and who attends to whom: the per-modality attention and FFN
groups of a layer (one expert when shared, two when routed), the per-token metadata (type, position, valid)
and the attention mask built from it."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn.layers import MLP, compute_dtype

if TYPE_CHECKING:
    from jaxpipe.nn.mot import MoTConfig

__all__ = ["IMAGE", "LAYOUTS", "TEXT", "MoTLayer", "Tokens", "attention_mask", "cat_tokens", "token_meta"]

TEXT, IMAGE = 0, 1
"""Token types; under ``"modality"`` routing also the expert index (understanding, generation)."""

LAYOUTS = ("generate", "understand")
"""Who attends to whom: text -> image generation, or image -> text understanding."""


class _Attention(nnx.Module):
    def __init__(self, cfg: MoTConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.norm = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.qkv = nnx.Linear(cfg.dim, 3 * cfg.dim, use_bias=False, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(cfg.dim, cfg.dim, dtype=dtype, rngs=rngs)


class _FFN(nnx.Module):
    def __init__(self, cfg: MoTConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.norm = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.mlp = MLP(cfg.dim, int(cfg.dim * cfg.mlp_ratio), dtype=dtype, rngs=rngs)


def _by_modality(groups, segments, fn) -> list[jax.Array]:
    """``fn(group, x)`` on each ``(token type, x (B, L, ·))`` segment with its expert's group; a shared
    group runs once on the segments concatenated (exactly a plain transformer's computation)."""
    if len(groups) == 1:
        lengths = [x.shape[1] for _, x in segments]
        y = fn(groups[0], jnp.concatenate([x for _, x in segments], axis=1))
        return jnp.split(y, np.cumsum(lengths)[:-1], axis=1)
    return [fn(groups[kind], x) for kind, x in segments]


class MoTLayer(nnx.Module):
    """One MoT layer: a routed or shared attention group and FFN group (one or two experts each)."""

    def __init__(self, cfg: MoTConfig, routed: tuple[bool, bool], rngs: nnx.Rngs):
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.attn = nnx.List([_Attention(cfg, rngs) for _ in range(2 if routed[0] else 1)])
        self.ffn = nnx.List([_FFN(cfg, rngs) for _ in range(2 if routed[1] else 1)])

    def __call__(self, segments, mask, past_k=None, past_v=None):
        """``segments``: ``[(token type, h (B, L_s, dim))]`` in sequence order; keys are
        ``[past (B, P, ·), these tokens]`` and ``mask`` ``(B, 1, ΣL_s, P + ΣL_s)``. Returns the new
        hidden states (same segments) and these tokens' ``(k, v)`` ``(B, ΣL_s, heads, head_dim)``."""
        kinds = [kind for kind, _ in segments]
        qkv = jnp.concatenate(_by_modality(self.attn, segments, lambda g, x: g.qkv(g.norm(x))), axis=1)
        b, length = qkv.shape[:2]
        qkv = qkv.reshape(b, length, 3, self.heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        keys = k if past_k is None else jnp.concatenate([past_k.astype(k.dtype), k], axis=1)
        values = v if past_v is None else jnp.concatenate([past_v.astype(v.dtype), v], axis=1)
        y = jax.nn.dot_product_attention(q, keys, values, mask=mask).reshape(b, length, self.heads * self.head_dim)
        lengths = [h.shape[1] for _, h in segments]
        ys = jnp.split(y, np.cumsum(lengths)[:-1], axis=1)
        outs = _by_modality(self.attn, list(zip(kinds, ys)), lambda g, x: g.out(x))
        hs = [(kind, h + o) for (kind, h), o in zip(segments, outs)]
        ffs = _by_modality(self.ffn, hs, lambda g, x: g.mlp(g.norm(x)))
        return [(kind, h + f) for (kind, h), f in zip(hs, ffs)], k, v


class Tokens(NamedTuple):
    """Per-position metadata of queries or keys, each ``(B, L)``: type, position, valid."""

    kind: jax.Array
    pos: jax.Array
    valid: jax.Array


def cat_tokens(*parts: Tokens) -> Tokens:
    """The parts' metadata concatenated along the sequence.

    Args:
      *parts: ``Tokens`` of ``(B, L_i)`` each.

    Returns:
      ``Tokens`` of ``(B, ΣL_i)``.
    """
    return Tokens(*(jnp.concatenate(xs, axis=1) for xs in zip(*parts)))


def token_meta(kind: int, pos: jax.Array, valid: jax.Array) -> Tokens:
    """Metadata of tokens of one ``kind``.

    Args:
      kind: ``TEXT`` or ``IMAGE``.
      pos: the positions ``(B, L)``.
      valid: which tokens are real ``(B, L)`` (broadcastable).

    Returns:
      ``Tokens`` of ``(B, L)``.
    """
    return Tokens(jnp.full(pos.shape, kind, jnp.int32), pos.astype(jnp.int32), jnp.asarray(valid, bool))


def attention_mask(queries: Tokens, keys: Tokens, layout: str) -> jax.Array:
    """``(B, 1, Lq, Lk)``: text -> text causal; image -> image; image -> text under ``"generate"``;
    text -> image under ``"understand"``; only valid keys, and a token always sees itself (no empty row).

    Args:
      queries: the queries' metadata ``(B, Lq)``.
      keys: the keys' metadata ``(B, Lk)``.
      layout: ``"generate"`` or ``"understand"``.

    Returns:
      The boolean mask ``(B, 1, Lq, Lk)``.
    """
    validate.rule(layout in LAYOUTS, f"layout must be one of {LAYOUTS} (got {layout!r})")
    qk, kk = queries.kind[:, :, None], keys.kind[:, None, :]
    qp, kp = queries.pos[:, :, None], keys.pos[:, None, :]
    text_text = (qk == TEXT) & (kk == TEXT) & (kp <= qp)
    image_image = (qk == IMAGE) & (kk == IMAGE)
    across = (qk == IMAGE) & (kk == TEXT) if layout == "generate" else (qk == TEXT) & (kk == IMAGE)
    allowed = (text_text | image_image | across) & keys.valid[:, None, :]
    itself = (qk == kk) & (qp == kp)
    return (allowed | itself)[:, None]
