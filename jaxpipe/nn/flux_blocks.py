"""The pieces of the FLUX.1 transformer (diffusers ``transformer_flux.py``), named like diffusers'.

Every attribute mirrors its PyTorch counterpart (``attn.to_q``, ``ff.net.0.proj``, ``norm1.linear``,
``time_text_embed.timestep_embedder.linear_1``), so ``hf.torch_key`` maps parameters without
renames; parameter-free PyTorch slots (dropouts) are ``None`` entries of an ``nnx.List`` to keep
the indices. Norms, RoPE and softmax run in float32 whatever the parameter dtype.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn.attention import attention

__all__ = [
    "AdaLayerNorm",
    "FeedForward",
    "FluxAttention",
    "FluxSingleTransformerBlock",
    "FluxTransformerBlock",
    "KeyStream",
    "Linear",
    "RMSNorm",
    "SiluMLP",
    "TimeTextEmbed",
    "apply_rope",
    "layer_norm",
    "modulate",
    "rope",
    "timestep_embedding",
]

EPS = 1e-6  # every FLUX norm (LayerNorms, q/k RMSNorms) uses it
ROPE_THETA = 10_000.0
TIME_CHANNELS = 256  # diffusers' Timesteps(num_channels=256): fixed, not part of the config


class KeyStream:
    """Fresh PRNG keys ``fold_in(key, 1), fold_in(key, 2), ...`` for parameter init.

    Not ``nnx.Rngs``: under ``nnx.eval_shape`` every ``Rngs`` draw writes a traced counter, and each
    write costs time linear in the trace so far: an abstract FLUX.1-dev took 27 s that way, 2 s this way.
    """

    def __init__(self, key: jax.Array):
        self.key, self.count = key, 0

    def __call__(self) -> jax.Array:
        self.count += 1
        return jax.random.fold_in(self.key, self.count)


class Linear(nnx.Module):
    """``x @ kernel + bias`` with ``kernel`` ``(din, dout)``, computed in ``dtype``; parameters stored in it (a
    bfloat16 FLUX.1-dev is 24 GB, not 48), and float32 master copies a trainer merges in cast down to it."""

    def __init__(self, din: int, dout: int, dtype, keys: KeyStream):
        self.dtype = dtype
        self.kernel = nnx.Param(jax.random.normal(keys(), (din, dout), dtype) * (din**-0.5))
        self.bias = nnx.Param(jnp.zeros((dout,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.matmul(x.astype(self.dtype), self.kernel[...].astype(self.dtype)) + self.bias[...].astype(self.dtype)


def layer_norm(x: jax.Array, eps: float = EPS) -> jax.Array:
    """LayerNorm without affine parameters over the last axis, computed in float32, returned in ``x.dtype``.

    Args:
      x: ``(..., D)``.
      eps: added to the variance.

    Returns:
      The normalised ``x``, same shape and dtype.
    """
    h = x.astype(jnp.float32)
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(h - mean), axis=-1, keepdims=True)
    return ((h - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)


class RMSNorm(nnx.Module):
    """``torch.nn.RMSNorm(dim, eps=1e-6)``: ``x / rms(x) * weight`` over the last axis, in float32."""

    def __init__(self, dim: int, dtype):
        self.scale = nnx.Param(jnp.ones((dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(jnp.square(h), axis=-1, keepdims=True) + EPS)
        return (h * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def timestep_embedding(t: jax.Array, dim: int = TIME_CHANNELS, max_period: float = 10_000.0) -> jax.Array:
    """diffusers ``Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0)``: ``[cos(t·f), sin(t·f)]``.

    With ``f_i = max_period^(-i/(dim/2))``; an odd ``dim`` is zero-padded.

    Args:
      t: ``(B,)`` timesteps (or guidance scales, scaled as the caller does).
      dim: the embedding width.
      max_period: the longest period.

    Returns:
      ``(B, dim)`` float32.
    """
    half = dim // 2
    # float32 exactly as torch builds it (-log(P)·i / half in float32, then exp), so large
    # arguments (guidance 3.5 -> 3500) give the same angles as the reference
    exponent = np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32) / np.float32(half)
    freqs = jnp.exp(jnp.asarray(exponent, jnp.float32))
    angles = jnp.asarray(t, jnp.float32)[:, None] * freqs[None, :]
    emb = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
    return jnp.pad(emb, ((0, 0), (0, dim - 2 * half)))


def rope(ids, axes_dims: tuple[int, ...], theta: float = ROPE_THETA) -> tuple[jax.Array, jax.Array]:
    """FLUX's multi-axis RoPE tables ``(cos, sin)``, each ``(S, sum(axes_dims))`` float32, for position
    ``ids`` ``(S, len(axes_dims))``: per axis, ``pos·θ^(-2i/d)`` with each angle repeated twice
    (interleaved pairs). Concrete NumPy ids are computed in float64 like diffusers on CPU.

    Args:
      ids: ``(S, len(axes_dims))`` positions, a NumPy array (float64 math) or a JAX array (float32 math).
      axes_dims: the rotary width of each position axis (even).
      theta: the RoPE base.

    Returns:
      ``(cos, sin)``, each ``(S, sum(axes_dims))`` float32.
    """
    on_host = isinstance(ids, np.ndarray)
    xp, ftype = (np, np.float64) if on_host else (jnp, jnp.float32)
    pos = xp.asarray(ids).astype(ftype)
    angles = []
    for axis, dim in enumerate(axes_dims):
        freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        angles.append(pos[:, axis : axis + 1] * xp.asarray(freqs, ftype)[None, :])
    angles = xp.repeat(xp.concatenate(angles, axis=-1), 2, axis=-1)
    return jnp.asarray(xp.cos(angles), jnp.float32), jnp.asarray(xp.sin(angles), jnp.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of ``x`` by the RoPE tables; float32 math.

    Args:
      x: ``(B, S, H, D)`` queries or keys.
      cos: ``(S, D)`` from ``rope``.
      sin: ``(S, D)`` from ``rope``.

    Returns:
      The rotated ``x``, same shape and dtype.
    """
    h = x.astype(jnp.float32)
    pairs = h.reshape(*h.shape[:-1], -1, 2)
    rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(h.shape)
    return (h * cos[None, :, None, :] + rotated * sin[None, :, None, :]).astype(x.dtype)


class SiluMLP(nnx.Module):
    """``linear_2(silu(linear_1(x)))``: diffusers' ``TimestepEmbedding`` and ``PixArtAlphaTextProjection(act_fn="silu")``."""

    def __init__(self, din: int, dim: int, dtype, keys: KeyStream):
        self.linear_1 = Linear(din, dim, dtype, keys)
        self.linear_2 = Linear(dim, dim, dtype, keys)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear_2(jax.nn.silu(self.linear_1(x)))


class TimeTextEmbed(nnx.Module):
    """``CombinedTimestep[Guidance]TextProjEmbeddings``: ``temb = mlp(emb(t)) [+ mlp(emb(g))] + mlp(pooled)``."""

    def __init__(self, dim: int, pooled_dim: int, guidance: bool, dtype, keys: KeyStream):
        self.dtype = dtype
        self.timestep_embedder = SiluMLP(TIME_CHANNELS, dim, dtype, keys)
        self.guidance_embedder = SiluMLP(TIME_CHANNELS, dim, dtype, keys) if guidance else None
        self.text_embedder = SiluMLP(pooled_dim, dim, dtype, keys)

    def __call__(self, timestep: jax.Array, guidance: jax.Array | None, pooled: jax.Array) -> jax.Array:
        """``(B, dim)`` from ``timestep`` and ``guidance`` ``(B,)`` (already ×1000) and ``pooled`` ``(B, pooled_dim)``."""
        temb = self.timestep_embedder(timestep_embedding(timestep).astype(self.dtype))
        if self.guidance_embedder is not None:
            temb = temb + self.guidance_embedder(timestep_embedding(guidance).astype(self.dtype))
        return temb + self.text_embedder(pooled.astype(self.dtype))


class AdaLayerNorm(nnx.Module):
    """The adaLN modulation ``linear(silu(temb))`` split into ``chunks`` vectors ``(B, dim)``: diffusers'
    ``AdaLayerNormZero`` (6), ``AdaLayerNormZeroSingle`` (3), ``AdaLayerNormContinuous`` (2: scale, shift)."""

    def __init__(self, dim: int, chunks: int, dtype, keys: KeyStream):
        self.chunks = chunks
        self.linear = Linear(dim, chunks * dim, dtype, keys)

    def __call__(self, temb: jax.Array) -> list[jax.Array]:
        return jnp.split(self.linear(jax.nn.silu(temb)), self.chunks, axis=-1)


def modulate(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    """``layer_norm(x)·(1 + scale) + shift`` with per-sample modulations.

    Args:
      x: ``(B, S, dim)`` tokens.
      shift: ``(B, dim)``.
      scale: ``(B, dim)``.

    Returns:
      ``(B, S, dim)``.
    """
    return layer_norm(x) * (1 + scale[:, None]) + shift[:, None]


class _GeluProj(nnx.Module):
    """diffusers ``GELU(approximate="tanh")``: a projection then tanh-GELU."""

    def __init__(self, din: int, dout: int, dtype, keys: KeyStream):
        self.proj = Linear(din, dout, dtype, keys)

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.gelu(self.proj(x), approximate=True)


class FeedForward(nnx.Module):
    """diffusers ``FeedForward(dim, activation_fn="gelu-approximate")``: ``dim -> 4·dim -> dim``."""

    def __init__(self, dim: int, dtype, keys: KeyStream, mult: int = 4):
        self.net = nnx.List([_GeluProj(dim, mult * dim, dtype, keys), None, Linear(mult * dim, dim, dtype, keys)])

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.net[2](self.net[0](x))


class FluxAttention(nnx.Module):
    """``FluxAttention`` + ``FluxAttnProcessor``: q/k RMS-normed per head, RoPE, softmax attention.

    ``joint``: a second (text) stream with its own projections attends jointly, text tokens first;
    ``pre_only`` (single blocks): no output projection.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        *,
        joint: bool,
        pre_only: bool,
        dtype,
        keys: KeyStream,
        implementation: str = "xla",
    ):
        inner = heads * head_dim
        self.head_dim = head_dim
        self.implementation = implementation
        self.norm_q = RMSNorm(head_dim, dtype)
        self.norm_k = RMSNorm(head_dim, dtype)
        self.to_q = Linear(dim, inner, dtype, keys)
        self.to_k = Linear(dim, inner, dtype, keys)
        self.to_v = Linear(dim, inner, dtype, keys)
        self.to_out = None if pre_only else nnx.List([Linear(inner, dim, dtype, keys), None])
        if joint:
            self.norm_added_q = RMSNorm(head_dim, dtype)
            self.norm_added_k = RMSNorm(head_dim, dtype)
            self.add_q_proj = Linear(dim, inner, dtype, keys)
            self.add_k_proj = Linear(dim, inner, dtype, keys)
            self.add_v_proj = Linear(dim, inner, dtype, keys)
            self.to_add_out = Linear(inner, dim, dtype, keys)
        self.joint = joint

    def _heads(self, x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:-1], -1, self.head_dim)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, context: jax.Array | None = None):
        """``x`` ``(B, L, dim)`` [and ``context`` ``(B, T, dim)``] with RoPE tables for the ``T + L`` (or ``L``)
        tokens -> the attended ``x`` [and ``context``]."""
        q = self.norm_q(self._heads(self.to_q(x)))
        k = self.norm_k(self._heads(self.to_k(x)))
        v = self._heads(self.to_v(x))
        if context is not None:
            q = jnp.concatenate([self.norm_added_q(self._heads(self.add_q_proj(context))), q], axis=1)
            k = jnp.concatenate([self.norm_added_k(self._heads(self.add_k_proj(context))), k], axis=1)
            v = jnp.concatenate([self._heads(self.add_v_proj(context)), v], axis=1)
        out = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, implementation=self.implementation)
        out = out.reshape(*out.shape[:2], -1)
        if context is None:
            return out if self.to_out is None else self.to_out[0](out)
        t = context.shape[1]
        return self.to_out[0](out[:, t:]), self.to_add_out(out[:, :t])


class FluxTransformerBlock(nnx.Module):
    """Double-stream (MMDiT) block: image and text streams, each with its own adaLN-zero modulation,
    attention projections and FFN, attending jointly."""

    def __init__(self, dim: int, heads: int, head_dim: int, dtype, keys: KeyStream, implementation: str = "xla"):
        self.norm1 = AdaLayerNorm(dim, 6, dtype, keys)
        self.norm1_context = AdaLayerNorm(dim, 6, dtype, keys)
        self.attn = FluxAttention(
            dim, heads, head_dim, joint=True, pre_only=False, dtype=dtype, keys=keys, implementation=implementation
        )
        self.ff = FeedForward(dim, dtype, keys)
        self.ff_context = FeedForward(dim, dtype, keys)

    def __call__(self, x: jax.Array, context: jax.Array, temb: jax.Array, cos: jax.Array, sin: jax.Array):
        """``(context, x)`` updated, like diffusers' block (which returns the text stream first)."""
        shift, scale, gate, shift_ff, scale_ff, gate_ff = self.norm1(temb)
        c_shift, c_scale, c_gate, c_shift_ff, c_scale_ff, c_gate_ff = self.norm1_context(temb)
        attn_x, attn_c = self.attn(modulate(x, shift, scale), cos, sin, modulate(context, c_shift, c_scale))
        x = x + gate[:, None] * attn_x
        x = x + gate_ff[:, None] * self.ff(modulate(x, shift_ff, scale_ff))
        context = context + c_gate[:, None] * attn_c
        context = context + c_gate_ff[:, None] * self.ff_context(modulate(context, c_shift_ff, c_scale_ff))
        return context, x


class FluxSingleTransformerBlock(nnx.Module):
    """Single-stream block over the joined ``[text, image]`` tokens: attention and a tanh-GELU MLP in
    parallel, concatenated into one output projection, gated residual."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        dtype,
        keys: KeyStream,
        implementation: str = "xla",
        mlp_ratio: float = 4.0,
    ):
        hidden = int(dim * mlp_ratio)
        self.norm = AdaLayerNorm(dim, 3, dtype, keys)
        self.proj_mlp = Linear(dim, hidden, dtype, keys)
        self.proj_out = Linear(dim + hidden, dim, dtype, keys)
        self.attn = FluxAttention(
            dim, heads, head_dim, joint=False, pre_only=True, dtype=dtype, keys=keys, implementation=implementation
        )

    def __call__(self, h: jax.Array, temb: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        """The joined stream ``(B, T + L, dim)`` updated."""
        shift, scale, gate = self.norm(temb)
        normed = modulate(h, shift, scale)
        mlp = jax.nn.gelu(self.proj_mlp(normed), approximate=True)
        out = self.proj_out(jnp.concatenate([self.attn(normed, cos, sin), mlp], axis=-1))
        return h + gate[:, None] * out
