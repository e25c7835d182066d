"""A small decoder-only refiner LM with an explicit KV cache.

Pre-LN transformer with learned absolute positions: token + position embedding -> ``depth`` ×
(LayerNorm -> causal self-attention -> residual, LayerNorm -> MLP -> residual) -> LayerNorm ->
vocabulary head. Three entry points share the same weights and the same math:

- ``__call__(ids, mask)``: one uncached causal forward over a whole (right-padded) sequence,
  logits ``(B, L, V)`` — teacher forcing, what a trainer recomputes log-probs with;
- ``prefill(ids, lengths, cache)``: that same forward over a prompt, writing every position's
  keys/values into the cache, returning the next-token logits ``(B, V)`` of each prompt;
- ``decode_step(token, position, cache)``: one token per request at its own position, attending
  over the cache; logits ``(B, V)`` and the updated cache.

The cache is explicit state (``KVCache``, a NamedTuple of per-layer buffers made by
``init_cache``) passed in and returned; nothing per-request is stored on the module. Positions
are absolute buffer indices, so sequences are right-padded (token ids, not masks, carry the
prompt; ``<pad>`` is id 0).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn.layers import MLP, check_divisible, check_sizes, compute_dtype
from jaxpipe.nn.stacked import blocks, check_layout, scan

__all__ = ["LMConfig", "KVCache", "RefinerLM", "MaskedLM"]


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Sizes of the refiner LM.

    Attributes:
      vocab_size: the number of token ids; must match the card's tokenizer.
      dim: the model width.
      depth: the number of transformer blocks.
      heads: attention heads (``dim`` must be divisible by it).
      max_len: the longest sequence (prompt + generated tokens) and the KV-cache length.
      mlp_ratio: the FFN hidden width as a multiple of ``dim``.
      dtype: the compute dtype's name (params stay float32).
      scan_layers: store the blocks stacked (``blocks/stacked/...``) and run every entry point's blocks,
        cached ones included, as one ``lax.scan``; ``False`` (the default) keeps one parameter set per
        block (``blocks/3/...``), the layout the bundled cards are saved in. The ``KVCache`` is per layer
        either way.
      remat: what each block keeps for the backward pass (``stacked.REMAT_POLICIES``).

    Raises:
      ValueError: on a non-positive size, ``dim`` not divisible by ``heads``, a non-positive ``mlp_ratio``,
        an unknown dtype, a non-bool ``scan_layers`` or an unknown ``remat``.
    """

    vocab_size: int
    dim: int = 64
    depth: int = 2
    heads: int = 4
    max_len: int = 16
    mlp_ratio: float = 4.0
    dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"

    def __post_init__(self):
        check_sizes(self, ("vocab_size", "dim", "depth", "heads", "max_len"))
        check_divisible(self, "dim", "heads")
        validate.positive(self, "mlp_ratio")
        compute_dtype(self.dtype)
        check_layout(self)

    @classmethod
    def tiny(cls, vocab_size: int, **overrides) -> LMConfig:
        """The CPU-test-sized LM (the defaults) over ``vocab_size`` ids, with ``overrides`` of any field."""
        return cls(vocab_size=vocab_size, **overrides)

    @classmethod
    def large(cls, vocab_size: int, **overrides) -> LMConfig:
        """About 1.2B parameters (at a 32k vocabulary); for abstract construction and real accelerators."""
        return cls(**{"vocab_size": vocab_size, "dim": 2048, "depth": 24, "heads": 16, "max_len": 2048, **overrides})

    @property
    def head_dim(self) -> int:
        """The width of one attention head, ``dim // heads``."""
        return self.dim // self.heads


class KVCache(NamedTuple):
    """Per-layer key and value buffers, each ``(B, max_len, heads, head_dim)`` in the compute dtype.

    Slot ``t`` holds position ``t``'s key/value once that position has been prefilled or decoded;
    other slots are ignored by the attention mask (they may hold stale values).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def _causal_mask(key_mask: jax.Array) -> jax.Array:
    """``(B, 1, L, L)`` mask: query ``i`` sees key ``j <= i`` when ``j`` is valid; always itself
    (so a padding query never has an empty row and never produces NaNs)."""
    length = key_mask.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    allowed = causal[None] & key_mask[:, None, :].astype(bool)
    return (allowed | jnp.eye(length, dtype=bool)[None])[:, None]


class _SelfAttention(nnx.Module):
    def __init__(self, cfg: LMConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.qkv = nnx.Linear(cfg.dim, 3 * cfg.dim, use_bias=False, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(cfg.dim, cfg.dim, dtype=dtype, rngs=rngs)

    def project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries, keys, values ``(B, L, heads, head_dim)`` of ``x`` ``(B, L, dim)``."""
        b, length, _ = x.shape
        qkv = self.qkv(x).reshape(b, length, 3, self.heads, self.head_dim)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Attention output ``(B, Lq, dim)``; ``mask`` ``(B, 1, Lq, Lk)``."""
        b, lq = q.shape[:2]
        y = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask)
        return self.out(y.reshape(b, lq, self.heads * self.head_dim))


class _Block(nnx.Module):
    def __init__(self, cfg: LMConfig, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.norm1 = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.attn = _SelfAttention(cfg, rngs)
        self.norm2 = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.mlp = MLP(cfg.dim, int(cfg.dim * cfg.mlp_ratio), dtype=dtype, rngs=rngs)

    def __call__(self, h: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Full-sequence block: ``(h, k, v)`` with this layer's keys/values ``(B, L, heads, head_dim)``."""
        q, k, v = self.attn.project(self.norm1(h))
        h = h + self.attn.attend(q, k, v, mask)
        return h + self.mlp(self.norm2(h)), k, v

    def decode(
        self, h: jax.Array, position: jax.Array, k_cache: jax.Array, v_cache: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """One token per row ``h`` ``(B, 1, dim)`` at ``position`` ``(B,)``: writes its key/value into
        slot ``position`` of the caches, attends over slots ``<= position``."""
        q, k, v = self.attn.project(self.norm1(h))
        rows = jnp.arange(h.shape[0])
        k_cache = k_cache.at[rows, position].set(k[:, 0].astype(k_cache.dtype))
        v_cache = v_cache.at[rows, position].set(v[:, 0].astype(v_cache.dtype))
        visible = jnp.arange(k_cache.shape[1])[None, :] <= position[:, None]
        h = h + self.attn.attend(q, k_cache, v_cache, visible[:, None, None, :])
        return h + self.mlp(self.norm2(h)), k_cache, v_cache


class RefinerLM(nnx.Module):
    """Decoder-only causal LM over a word vocabulary: ids ``(B, L)`` -> next-token logits."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = compute_dtype(cfg.dtype)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.dim, dtype=dtype, rngs=rngs)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (cfg.max_len, cfg.dim)) * 0.02)
        self.blocks = blocks(lambda: _Block(cfg, rngs), cfg.depth, scan=cfg.scan_layers)
        self.norm = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(cfg.dim, cfg.vocab_size, use_bias=False, dtype=dtype, rngs=rngs)

    @property
    def max_len(self) -> int:
        """The longest sequence the LM (and its cache) holds."""
        return self.cfg.max_len

    @property
    def vocab_size(self) -> int:
        """The number of token ids."""
        return self.cfg.vocab_size

    def _logits(self, h: jax.Array) -> jax.Array:
        return self.head(self.norm(h)).astype(jnp.float32)

    def _forward(self, ids: jax.Array, mask: jax.Array | None) -> tuple[jax.Array, list, list]:
        chex.assert_rank(ids, 2)
        b, length = ids.shape
        if length > self.cfg.max_len:
            raise ValueError(f"ids has length {length}; the LM's max_len is {self.cfg.max_len}")
        key_mask = jnp.ones((b, length), bool) if mask is None else jnp.asarray(mask, bool)
        chex.assert_shape(key_mask, (b, length))
        attn_mask = _causal_mask(key_mask)
        h = self.embed(ids) + self.pos[:length].astype(compute_dtype(self.cfg.dtype))

        def step(block, h, _):
            h, k, v = block(h, attn_mask)
            return h, (k, v)

        h, kvs = scan(self.blocks, step, h, remat=self.cfg.remat)
        return h, [k for k, _ in kvs], [v for _, v in kvs]

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Next-token logits ``(B, L, V)`` float32 of right-padded ``ids`` ``(B, L)`` int32.

        Row ``t`` predicts token ``t + 1`` from tokens ``<= t``. ``mask`` ``(B, L)`` marks valid
        tokens (``None``: all valid); invalid keys are never attended to, so logits at valid
        positions do not depend on what the padding holds.
        """
        h, _, _ = self._forward(ids, mask)
        return self._logits(h)

    def init_cache(self, batch: int) -> KVCache:
        """An empty cache for ``batch`` requests: per layer ``(batch, max_len, heads, head_dim)`` zeros."""
        cfg = self.cfg
        shape = (batch, cfg.max_len, cfg.heads, cfg.head_dim)
        dtype = compute_dtype(cfg.dtype)
        zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.depth))
        return KVCache(k=zeros(), v=zeros())

    def _check_cache(self, cache: KVCache, batch: int) -> None:
        cfg = self.cfg
        if len(cache.k) != cfg.depth or len(cache.v) != cfg.depth:
            raise ValueError(f"cache has {len(cache.k)} layers; the LM has depth {cfg.depth}")
        chex.assert_shape(list(cache.k) + list(cache.v), (batch, cfg.max_len, cfg.heads, cfg.head_dim))

    def prefill(self, ids: jax.Array, lengths: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Run right-padded prompts ``ids`` ``(B, L)`` (true ``lengths`` ``(B,)``, each >= 1) through
        one causal forward, writing slots ``[0, L)`` of every layer's cache.

        Returns the logits ``(B, V)`` float32 of each prompt's next token (the row at
        ``lengths - 1``) and the cache. Slots ``>= lengths`` hold padding keys; decoding
        overwrites slot ``p`` before anything attends to it.
        """
        chex.assert_rank(ids, 2)
        b, length = ids.shape
        chex.assert_shape(lengths, (b,))
        self._check_cache(cache, b)
        mask = jnp.arange(length)[None, :] < lengths[:, None]
        h, ks, vs = self._forward(ids, mask)
        last = jnp.clip(lengths - 1, 0, length - 1)
        logits = self._logits(jnp.take_along_axis(h, last[:, None, None], axis=1))[:, 0]
        write = lambda buf, new: jax.lax.dynamic_update_slice_in_dim(buf, new.astype(buf.dtype), 0, axis=1)
        cache = KVCache(k=tuple(map(write, cache.k, ks)), v=tuple(map(write, cache.v, vs)))
        return logits, cache

    def decode_step(self, token: jax.Array, position: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """Feed one ``token`` ``(B,)`` per request at its own ``position`` ``(B,)`` (``< max_len``).

        Attends over cache slots ``<= position`` (which must hold positions ``< position``);
        returns the next-token logits ``(B, V)`` float32 and the cache with slot ``position`` written.
        """
        chex.assert_rank(token, 1)
        b = token.shape[0]
        chex.assert_shape(position, (b,))
        self._check_cache(cache, b)
        position = jnp.asarray(position, jnp.int32)
        h = self.embed(token[:, None]) + self.pos[position][:, None].astype(compute_dtype(self.cfg.dtype))

        def step(block, h, kv):
            h, k_cache, v_cache = block.decode(h, position, *kv)
            return h, (k_cache, v_cache)

        h, kvs = scan(self.blocks, step, h, list(zip(cache.k, cache.v)), remat=self.cfg.remat)
        return self._logits(h)[:, 0], KVCache(k=tuple(k for k, _ in kvs), v=tuple(v for _, v in kvs))


class MaskedLM:
    """A ``RefinerLM`` restricted to a token subset: ``allowed`` ``(V,)`` bool; every entry point's
    logits are ``-1e9`` elsewhere, so sampling, the captured log-probs and their teacher-forced
    recomputation all see the same restricted policy (a refiner that owns one prompt slot).

    A plain wrapper (not a module): build it inside the traced function that uses it.
    """

    def __init__(self, lm: RefinerLM, allowed: jax.Array):
        """Wraps ``lm``.

        Args:
          lm: the language model.
          allowed: ``(V,)`` bool, the tokens the policy may emit.
        """
        chex.assert_shape(allowed, (lm.cfg.vocab_size,))
        self.lm, self.allowed, self.cfg = lm, jnp.asarray(allowed, bool), lm.cfg
        self.max_len, self.vocab_size = lm.max_len, lm.vocab_size

    def _mask(self, logits: jax.Array) -> jax.Array:
        return jnp.where(self.allowed, logits, -1e9)

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        return self._mask(self.lm(ids, mask))

    def init_cache(self, batch: int) -> KVCache:
        """The wrapped LM's empty cache for ``batch`` requests (``RefinerLM.init_cache``)."""
        return self.lm.init_cache(batch)

    def prefill(self, ids: jax.Array, lengths: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """``RefinerLM.prefill`` with the next-token logits ``(B, V)`` masked to the allowed tokens."""
        logits, cache = self.lm.prefill(ids, lengths, cache)
        return self._mask(logits), cache

    def decode_step(self, token: jax.Array, position: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
        """``RefinerLM.decode_step`` with the next-token logits ``(B, V)`` masked to the allowed tokens."""
        logits, cache = self.lm.decode_step(token, position, cache)
        return self._mask(logits), cache
