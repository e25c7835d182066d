"""A block-causal diffusion transformer over latent videos, with a windowed chunk KV cache.

``CausalDiT`` has exactly the parameters of ``DiT`` (it is one, so a card can start from a
bidirectional DiT's weights) but runs them differently:

* frames are grouped in chunks of ``F`` frames; self-attention is **block-causal** (a token of
  chunk ``c`` sees the tokens of its own chunk and of the ``window`` chunks before it,
  ``c - window <= c' <= c``; of every earlier chunk when ``window`` is ``None``);
* the noise level is **per chunk**: each token is modulated (adaLN) by its own chunk's σ, so one
  forward mixes clean past chunks (σ = 0) with a noisy current chunk (diffusion forcing);
* positions are **absolute frame indices** (``frame_offset`` + t), so a video can continue past
  the length the network was trained on.

Two ways to run it. ``__call__`` is the full-sequence forward (training, and the reference the
cache is checked against). Generation goes chunk by chunk through a ``ChunkCache``: per block a
fixed slab ``(B, window·tokens_per_chunk, heads, head_dim)`` of K and V, a per-slot validity
mask and the number of chunks written; ``velocity`` denoises the current chunk attending to the
cache, ``write`` stores a finished (clean, σ = 0) chunk's K/V in slot ``written % window`` (the
oldest chunk slides out once the slab is full). Attention does not depend on the order of its
keys, so the ring order of the slab is harmless: the cached path computes what the full forward
with the same window computes, up to float reordering.

With ``DiTConfig.scan_layers`` the blocks run as one ``lax.scan``, the cached path too: the cache keeps
its per-block slabs (one format for both layouts), which the scan stacks on a leading layer axis and
carries through alongside the blocks' stacked params, splitting the chunk's new K/V back per block.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx

from jaxpipe.nn.dit import DiT, DiTBlock, DiTConfig
from jaxpipe.nn.layers import compute_dtype, sincos_1d
from jaxpipe.nn.stacked import scan

__all__ = ["CausalDiT", "ChunkCache", "ChunkCond", "block_causal_mask", "frame_positions", "init_cache"]


class ChunkCache(NamedTuple):
    """The K/V of finished chunks (leading axis ``B`` on every leaf).

    ``k``/``v``: one slab per block, ``(B, window·tokens_per_chunk, heads, head_dim)``;
    ``valid`` ``(B, window)`` bool: the slots holding a chunk; ``written`` ``(B,)`` int32: chunks
    written so far (the absolute index of the next chunk; its slot is ``written % window``).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    valid: jax.Array
    written: jax.Array

    @property
    def window(self) -> int:
        """The number of chunk slots the cache keeps."""
        return self.valid.shape[1]

    @property
    def tokens_per_chunk(self) -> int | None:
        """Tokens per cached chunk (``None`` for a slab of no slots)."""
        return self.k[0].shape[1] // self.window if self.window else None


class ChunkCond(NamedTuple):
    """What ``CausalDiT.velocity`` conditions on: the text (``context`` ``(B, L, text_dim)``,
    ``context_mask`` ``(B, L)``) and the cache of the finished chunks, whose ``written`` count
    places the current chunk (its first frame is ``written · F``)."""

    context: jax.Array
    context_mask: jax.Array
    cache: ChunkCache


def init_cache(cfg: DiTConfig, batch: int, window: int, tokens_per_chunk: int) -> ChunkCache:
    """An empty cache for ``batch`` rows keeping ``window`` chunks of ``tokens_per_chunk`` tokens.

    Args:
      cfg: the DiT's config (depth, heads, width and dtype shape the slabs).
      batch: B.
      window: the chunk slots to keep (0: no slots, for a video of one chunk, which has no past to keep).
      tokens_per_chunk: the tokens of one chunk.

    Returns:
      A ``ChunkCache`` of zeros, no slot valid, ``written`` 0.

    Raises:
      ValueError: if ``window < 0``.
    """
    if window < 0:
        raise ValueError(f"the cache window must be >= 0 chunks (got {window})")
    head_dim = cfg.dim // cfg.heads
    slab = jnp.zeros((batch, window * tokens_per_chunk, cfg.heads, head_dim), compute_dtype(cfg.dtype))
    return ChunkCache(
        k=(slab,) * cfg.depth,
        v=(slab,) * cfg.depth,
        valid=jnp.zeros((batch, window), bool),
        written=jnp.zeros((batch,), jnp.int32),
    )


def frame_positions(frames: jax.Array, rows: int, cols: int, dim: int) -> jax.Array:
    """Position embedding of token grids whose frames have absolute indices ``frames``.

    Frame-major, in ``sincos_grid``'s layout, which it equals for ``frames = arange(T)``.

    Args:
      frames: ``(B, T)`` absolute frame indices.
      rows: the grid's token rows.
      cols: its token columns.
      dim: the embedding width.

    Returns:
      ``(B, T·rows·cols, dim)`` float32.
    """
    d_space = 2 * (dim // 6)
    d_time = dim - 2 * d_space
    r, c = jnp.meshgrid(jnp.arange(rows), jnp.arange(cols), indexing="ij")
    space = jnp.concatenate([sincos_1d(r.ravel(), d_space), sincos_1d(c.ravel(), d_space)], axis=-1)
    time = sincos_1d(frames, d_time)  # (B, T, d_time)
    b, t = frames.shape
    time = jnp.broadcast_to(time[:, :, None], (b, t, rows * cols, d_time))
    space = jnp.broadcast_to(space[None, None], (b, t, rows * cols, 2 * d_space))
    return jnp.concatenate([time, space], axis=-1).reshape(b, t * rows * cols, dim)


def block_causal_mask(chunks: int, tokens_per_chunk: int, window: int | None = None) -> jax.Array:
    """``(L, L)`` bool, ``L = chunks·tokens_per_chunk``: query chunk ``c`` sees key chunks ``c' <= c``
    (and ``c' >= c - window`` when ``window``, the earlier chunks it sees, is given).

    Args:
      chunks: the number of chunks.
      tokens_per_chunk: the tokens of one chunk.
      window: how many earlier chunks a chunk sees (``None``: all).

    Returns:
      ``(L, L)`` bool, true where query token ``i`` may attend to key token ``j``.
    """
    chunk = jnp.arange(chunks * tokens_per_chunk) // tokens_per_chunk
    seen = chunk[None, :] <= chunk[:, None]
    if window is not None:
        seen &= chunk[None, :] >= chunk[:, None] - window
    return seen


def _modulate(h: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    return h * (1.0 + scale) + shift


def _block(block: DiTBlock, h, mod, context, context_mask, mask, memory=None):
    """One ``DiTBlock`` with per-token modulation ``mod`` ``(B, L, 6·dim)`` and self-attention over
    ``memory`` K/V ``(B, S, H, hd)`` (if any) then the block's own tokens under ``mask`` ``(B, 1, L, S+L)``.
    Returns the new ``h`` and the block's own ``(k, v)`` ``(B, L, H, hd)``."""
    shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(mod, 6, axis=-1)
    attn = block.attn
    b, length, d = h.shape
    a = _modulate(block.norm1(h), shift1, scale1)
    q = attn.q(a).reshape(b, length, attn.heads, d // attn.heads)
    k, v = jnp.split(attn.kv(a).reshape(b, length, 2 * attn.heads, d // attn.heads), 2, axis=2)
    keys, values = (
        (k, v) if memory is None else (jnp.concatenate([memory[0], k], 1), jnp.concatenate([memory[1], v], 1))
    )
    y = jax.nn.dot_product_attention(q, keys, values, mask=mask)
    h = h + gate1 * attn.out(y.reshape(b, length, d))
    h = h + block.cross(block.norm_cross(h), context, context_mask)
    return h + gate2 * block.mlp(_modulate(block.norm2(h), shift2, scale2)), (k, v)


class CausalDiT(DiT):
    """Block-causal velocity network for latent videos ``(B, T, H, W, C)``; ``DiT``'s parameter tree."""

    def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
        if cfg.frame_cond:
            raise ValueError("a CausalDiT conditions on earlier chunks, not on a first-frame input (frame_cond=False)")
        super().__init__(cfg, rngs=rngs)

    def _check(self, x: jax.Array, context: jax.Array) -> None:
        chex.assert_rank(x, 5)
        p = self.cfg.patch_size
        if x.shape[-1] != self.cfg.latent_channels or x.shape[2] % p or x.shape[3] % p:
            raise ValueError(
                f"x must be (B, T, H, W, {self.cfg.latent_channels}) with H, W divisible by patch_size={p}; got {x.shape}"
            )
        chex.assert_shape(context, (x.shape[0], None, self.cfg.text_dim))

    def _embed(self, x: jax.Array, frames: jax.Array) -> jax.Array:
        """Tokens ``(B, T·h·w, dim)`` of ``x`` plus the position embedding of its absolute ``frames`` ``(B, T)``."""
        p, dtype = self.cfg.patch_size, compute_dtype(self.cfg.dtype)
        h = self.patch_embed(self._tokens(x.astype(dtype), None))
        return h + frame_positions(frames, x.shape[2] // p, x.shape[3] // p, self.cfg.dim).astype(h.dtype)

    def _conditioning(self, sigma: jax.Array, context: jax.Array, context_mask: jax.Array | None) -> jax.Array:
        """Per-chunk conditioning ``(B, n, dim)`` from per-chunk ``sigma`` ``(B, n)`` and the pooled text."""
        t_emb = self.time_out(jax.nn.silu(self.time_in(sincos_1d(sigma * 1000.0, self.cfg.time_embed_dim))))
        if context_mask is None:
            pooled = jnp.mean(context, axis=1)
        else:
            w = jnp.asarray(context_mask, jnp.float32)[..., None]
            pooled = jnp.sum(context * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)
        return t_emb + self.text_pool(pooled)[:, None]

    def _blocks(self, h, cond, tokens_per_chunk, context, context_mask, mask, memory=None):
        """Every block, then the final layer: ``(out (B, L, patch_features), per-block (k, v))``."""
        per_token = lambda m: jnp.repeat(m, tokens_per_chunk, axis=1)  # chunk -> its tokens
        context = context.astype(h.dtype)

        def step(block, h, mem):
            return _block(block, h, per_token(block.ada(jax.nn.silu(cond))), context, context_mask, mask, mem)

        h, kvs = scan(self.blocks, step, h, None if memory is None else list(zip(*memory)), remat=self.cfg.remat)
        shift, scale = jnp.split(per_token(self.ada_out(jax.nn.silu(cond))), 2, axis=-1)
        return self.proj_out(_modulate(self.norm_out(h), shift, scale)), kvs

    def _unpatch(self, out: jax.Array, shape) -> jax.Array:
        _, t, hh, ww, _ = shape
        p = self.cfg.patch_size
        v = rearrange(out, "b (t h w) (p q c) -> b t (h p) (w q) c", t=t, h=hh // p, w=ww // p, p=p, q=p)
        return v.astype(jnp.float32)

    def __call__(
        self,
        x: jax.Array,
        sigma: jax.Array,
        context: jax.Array,
        context_mask: jax.Array | None = None,
        *,
        chunk_frames: int,
        window: int | None = None,
        frame_offset: int | jax.Array = 0,
    ) -> jax.Array:
        """The full block-causal forward: velocity ``(B, T, H, W, C)`` float32 of latents ``x`` whose chunk
        ``c`` (frames ``[c·F, (c+1)·F)``, ``F = chunk_frames``) is at noise level ``sigma[:, c]``
        (``sigma`` ``(B, T/F)``, or ``(B,)`` / scalar for every chunk); frame ``t`` sits at absolute
        position ``frame_offset + t``; ``window``: how many earlier chunks a chunk sees (``None``: all),
        as a cache of ``window`` chunks gives it."""
        self._check(x, context)
        b, t, hh, ww, _ = x.shape
        if chunk_frames < 1 or t % chunk_frames:
            raise ValueError(f"chunk_frames={chunk_frames} must divide the {t} frames of x")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 chunk or None (got {window})")
        chunks = t // chunk_frames
        sigma = jnp.asarray(sigma, jnp.float32)
        sigma = jnp.broadcast_to(sigma[..., None] if sigma.ndim < 2 else sigma, (b, chunks))
        frames = jnp.broadcast_to(jnp.asarray(frame_offset, jnp.int32).reshape(-1, 1) + jnp.arange(t), (b, t))
        h = self._embed(x, frames)
        tpc = h.shape[1] // chunks
        mask = block_causal_mask(chunks, tpc, window)[None, None]
        out, _ = self._blocks(h, self._conditioning(sigma, context, context_mask), tpc, context, context_mask, mask)
        return self._unpatch(out, x.shape)

    def chunk_forward(self, x: jax.Array, sigma: jax.Array, cond: ChunkCond) -> tuple[jax.Array, list]:
        """One chunk ``x`` ``(B, F, H, W, C)`` at noise level ``sigma`` ``(B,)`` attending to the cache:
        ``(velocity (B, F, H, W, C), per-block (k, v) of the chunk's tokens)``."""
        self._check(x, cond.context)
        cache = cond.cache
        b, f = x.shape[:2]
        frames = cache.written[:, None] * f + jnp.arange(f)
        h = self._embed(x, frames)
        tpc = h.shape[1]
        if cache.window and cache.tokens_per_chunk != tpc:
            raise ValueError(f"the cache holds chunks of {cache.tokens_per_chunk} tokens; this chunk has {tpc}")
        memory_mask = jnp.repeat(cache.valid, tpc, axis=1)  # (B, window·tpc)
        mask = jnp.concatenate([memory_mask, jnp.ones((b, tpc), bool)], axis=1)
        mask = jnp.broadcast_to(mask[:, None, None, :], (b, 1, tpc, mask.shape[1]))
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (b,))[:, None]
        cond_emb = self._conditioning(sigma, cond.context, cond.context_mask)
        out, kvs = self._blocks(h, cond_emb, tpc, cond.context, cond.context_mask, mask, (cache.k, cache.v))
        return self._unpatch(out, x.shape), kvs

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: ChunkCond) -> jax.Array:
        """The denoiser protocol: the current chunk's velocity ``(B, F, H, W, C)`` given the cache in ``cond``."""
        return self.chunk_forward(x, sigma, cond)[0]

    def write(self, x: jax.Array, cond: ChunkCond, rows: jax.Array | None = None) -> ChunkCache:
        """The cache with the finished chunk ``x`` ``(B, F, H, W, C)`` (clean: its K/V at σ = 0) written
        into slot ``written % window`` of the rows ``rows`` ``(B,)`` bool (every row when ``None``)."""
        cache = cond.cache
        b = x.shape[0]
        rows = jnp.ones((b,), bool) if rows is None else rows
        if not cache.window:  # nothing is kept: only the count (the next chunk's position) moves
            return cache._replace(written=cache.written + rows.astype(jnp.int32))
        _, kvs = self.chunk_forward(x, jnp.zeros((b,), jnp.float32), cond)
        slot = cache.written % cache.window
        start = slot * cache.tokens_per_chunk
        put = jax.vmap(lambda slab, new, at: jax.lax.dynamic_update_slice_in_dim(slab, new.astype(slab.dtype), at, 0))
        keep = rows[:, None, None, None]
        k = tuple(jnp.where(keep, put(old, new, start), old) for old, (new, _) in zip(cache.k, kvs))
        v = tuple(jnp.where(keep, put(old, new, start), old) for old, (_, new) in zip(cache.v, kvs))
        valid = cache.valid | (rows[:, None] & (jnp.arange(cache.window)[None, :] == slot[:, None]))
        return ChunkCache(k, v, valid, cache.written + rows.astype(jnp.int32))
