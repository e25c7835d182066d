"""The pieces of the Wan 2.x video transformer (diffusers ``models/transformers/transformer_wan.py``).

Attribute names mirror diffusers (``attn1.to_q``, ``ffn.net.0.proj``, ``norm_added_k`` ...) so a
parameter's PyTorch key follows from its NNX path (``jaxpipe.nn.hf.torch_key``). Linear weights
hold the network's dtype; norm weights, the time embedder and the modulation tables stay float32
(diffusers' ``_keep_in_fp32_modules``), and norms, modulation and RoPE compute in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.nn.attention import attention

F32 = jnp.float32

__all__ = [
    "FeedForward",
    "WanAttention",
    "WanImageEmbedding",
    "WanRotaryPosEmbed",
    "WanTimeTextImageEmbedding",
    "WanTransformerBlock",
    "apply_rotary_emb",
    "timestep_sinusoid",
]


def linear(din: int, dout: int, dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """A biased linear whose weights and matmul are in the network's ``dtype``."""
    return nnx.Linear(din, dout, dtype=dtype, param_dtype=dtype, rngs=rngs)


def fp32_layer_norm(dim: int, eps: float, affine: bool, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """diffusers' ``FP32LayerNorm``: float32 statistics and (optional) float32 affine weights."""
    return nnx.LayerNorm(
        dim,
        epsilon=eps,
        dtype=F32,
        param_dtype=F32,
        use_bias=affine,
        use_scale=affine,
        use_fast_variance=False,
        rngs=rngs,
    )


def fp32_rms_norm(dim: int, eps: float, rngs: nnx.Rngs) -> nnx.RMSNorm:
    """``torch.nn.RMSNorm`` over ``dim`` (all heads together), in float32."""
    return nnx.RMSNorm(dim, epsilon=eps, dtype=F32, param_dtype=F32, use_fast_variance=False, rngs=rngs)


# ----------------------------------------------------------------------------------- RoPE, timesteps


class WanRotaryPosEmbed(nnx.Module):
    """3-D rotary embedding of a (frames, rows, cols) token grid; no parameters.

    The head dim splits into ``t_dim = head_dim - 2·h_dim`` (frames) and ``h_dim = w_dim = 2·(head_dim // 6)``.
    """

    def __init__(
        self, attention_head_dim: int, patch_size: tuple[int, int, int], max_seq_len: int, theta: float = 10000.0
    ):
        self.attention_head_dim = attention_head_dim
        self.patch_size = tuple(patch_size)
        self.max_seq_len = max_seq_len
        self.theta = theta
        self.h_dim = self.w_dim = 2 * (attention_head_dim // 6)
        self.t_dim = attention_head_dim - self.h_dim - self.w_dim

    def __call__(self, grid: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """``(cos, sin)``, each ``(F'·H'·W', head_dim // 2)`` float32, one angle per rotated pair, frame-major."""
        if max(grid) > self.max_seq_len:
            raise ValueError(f"the token grid {grid} exceeds rope_max_seq_len={self.max_seq_len} along an axis")
        # Static shapes: the table is a float64 NumPy constant, as diffusers builds it (then rounded to float32).
        angles = []
        for axis, (n, dim) in enumerate(zip(grid, (self.t_dim, self.h_dim, self.w_dim))):
            freqs = 1.0 / self.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
            a = np.arange(n, dtype=np.float64)[:, None] * freqs
            shape = [1, 1, 1, dim // 2]
            shape[axis] = n
            angles.append(np.broadcast_to(a.reshape(shape), (*grid, dim // 2)))
        angles = np.concatenate(angles, axis=-1).reshape(-1, self.attention_head_dim // 2)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rotary_emb(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of ``x`` by per-position angles; float32 math.

    Args:
      x: ``(B, L, N, H)`` queries or keys (``N`` heads of width ``H``).
      cos: ``(L, H // 2)`` cosines of the angles.
      sin: ``(L, H // 2)`` sines of the angles.

    Returns:
      The rotated ``x``, same shape and dtype.
    """
    b, length, n, h = x.shape
    pairs = x.astype(F32).reshape(b, length, n, h // 2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1).reshape(x.shape).astype(x.dtype)


def timestep_sinusoid(timestep: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
    """The ``[cos, sin]`` embedding of diffusers-unit timesteps (``Timesteps(flip_sin_to_cos=True,
    downscale_freq_shift=0)``); an odd ``dim`` is zero-padded.

    Args:
      timestep: ``(B,)`` timesteps in diffusers units (0..1000).
      dim: the embedding width.
      max_period: the longest period.

    Returns:
      ``(B, dim)`` float32.
    """
    half = dim // 2
    exponent = (np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32)) / np.float32(half)
    freqs = np.exp(exponent.astype(np.float64)).astype(np.float32)
    angles = jnp.asarray(timestep, F32)[:, None] * freqs[None]
    emb = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
    return jnp.pad(emb, ((0, 0), (0, dim - 2 * half)))


# ----------------------------------------------------------------------------------- feed-forward, attention


class _GELUProj(nnx.Module):
    """diffusers' ``GELU``: ``gelu(proj(x))`` (tanh approximation or exact)."""

    def __init__(self, din: int, dout: int, approximate: bool, dtype, rngs: nnx.Rngs):
        self.proj = linear(din, dout, dtype, rngs)
        self.approximate = approximate

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.gelu(self.proj(x), approximate=self.approximate)


class _Dropout(nnx.Module):
    """Holds the place of diffusers' ``nn.Dropout`` (p = 0) so the output projection keeps index 2."""


class FeedForward(nnx.Module):
    """diffusers' ``FeedForward`` with a GELU activation: ``net.2(gelu(net.0.proj(x)))``, ``dim -> inner -> dim_out``."""

    def __init__(self, dim: int, inner_dim: int, dim_out: int, *, approximate: bool, dtype, rngs: nnx.Rngs):
        self.net = nnx.List(
            [_GELUProj(dim, inner_dim, approximate, dtype, rngs), _Dropout(), linear(inner_dim, dim_out, dtype, rngs)]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.net[2](self.net[0](x))


class WanAttention(nnx.Module):
    """Wan attention: q/k RMS-normed across heads, RoPE on self-attention, and for I2V a second
    attention of the same queries over image tokens (``add_k_proj`` / ``add_v_proj``) added to the text one."""

    def __init__(
        self,
        dim: int,
        heads: int,
        head_dim: int,
        eps: float,
        *,
        added_kv_proj_dim: int | None = None,
        dtype,
        rngs: nnx.Rngs,
        implementation: str = "xla",
    ):
        inner = heads * head_dim
        self.heads = heads
        self.implementation = implementation
        self.to_q = linear(dim, inner, dtype, rngs)
        self.to_k = linear(dim, inner, dtype, rngs)
        self.to_v = linear(dim, inner, dtype, rngs)
        self.to_out = nnx.List([linear(inner, dim, dtype, rngs)])
        self.norm_q = fp32_rms_norm(inner, eps, rngs)
        self.norm_k = fp32_rms_norm(inner, eps, rngs)
        self.has_added_kv = added_kv_proj_dim is not None
        if self.has_added_kv:
            self.add_k_proj = linear(added_kv_proj_dim, inner, dtype, rngs)
            self.add_v_proj = linear(added_kv_proj_dim, inner, dtype, rngs)
            self.norm_added_k = fp32_rms_norm(inner, eps, rngs)

    def _heads(self, x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:2], self.heads, -1)

    def __call__(
        self,
        x: jax.Array,
        context: jax.Array | None = None,
        *,
        rope: tuple[jax.Array, jax.Array] | None = None,
        image: jax.Array | None = None,
    ) -> jax.Array:
        """``(B, L, dim)`` attention of ``x`` over itself (``context=None``) or ``context`` ``(B, T, dim)``,
        plus over embedded ``image`` tokens ``(B, S, dim)`` when the layer has added K/V projections."""
        context = x if context is None else context
        dtype = x.dtype
        q = self._heads(self.norm_q(self.to_q(x).astype(F32)).astype(dtype))
        k = self._heads(self.norm_k(self.to_k(context).astype(F32)).astype(dtype))
        v = self._heads(self.to_v(context))
        if rope is not None:
            q, k = apply_rotary_emb(q, *rope), apply_rotary_emb(k, *rope)
        out = attention(q, k, v, implementation=self.implementation)
        if self.has_added_kv:
            if image is None:
                raise ValueError("this attention layer has added K/V projections (I2V) and needs image tokens")
            k_img = self._heads(self.norm_added_k(self.add_k_proj(image).astype(F32)).astype(dtype))
            out = out + attention(q, k_img, self._heads(self.add_v_proj(image)), implementation=self.implementation)
        return self.to_out[0](out.reshape(*x.shape[:2], -1))


# ----------------------------------------------------------------------------------- the transformer block


class WanTransformerBlock(nnx.Module):
    """Modulated self-attention (RoPE), cross-attention to text (+ image), modulated GELU FFN.

    The six modulations are ``scale_shift_table + timestep_proj`` (shift, scale, gate for each of
    self-attention and FFN); the residual stream keeps the network's dtype.
    """

    def __init__(
        self,
        dim: int,
        ffn_dim: int,
        num_heads: int,
        *,
        cross_attn_norm: bool,
        eps: float,
        added_kv_proj_dim: int | None,
        dtype,
        rngs: nnx.Rngs,
        implementation: str = "xla",
    ):
        head_dim = dim // num_heads
        self.norm1 = fp32_layer_norm(dim, eps, False, rngs)
        self.attn1 = WanAttention(dim, num_heads, head_dim, eps, dtype=dtype, rngs=rngs, implementation=implementation)
        self.attn2 = WanAttention(
            dim,
            num_heads,
            head_dim,
            eps,
            added_kv_proj_dim=added_kv_proj_dim,
            dtype=dtype,
            rngs=rngs,
            implementation=implementation,
        )
        self.cross_attn_norm = cross_attn_norm
        if cross_attn_norm:
            self.norm2 = fp32_layer_norm(dim, eps, True, rngs)
        self.ffn = FeedForward(dim, ffn_dim, dim, approximate=True, dtype=dtype, rngs=rngs)
        self.norm3 = fp32_layer_norm(dim, eps, False, rngs)
        self.scale_shift_table = nnx.Param(jax.random.normal(rngs.params(), (1, 6, dim), F32) / dim**0.5)

    def __call__(
        self,
        h: jax.Array,
        context: jax.Array,
        image: jax.Array | None,
        timestep_proj: jax.Array,
        rope: tuple[jax.Array, jax.Array],
    ) -> jax.Array:
        """``h`` ``(B, L, dim)`` -> ``(B, L, dim)``; ``timestep_proj`` ``(B, 6, dim)``, ``context`` ``(B, T, dim)``."""
        dtype = h.dtype
        mods = self.scale_shift_table[...] + timestep_proj.astype(F32)
        shift, scale, gate, c_shift, c_scale, c_gate = (mods[:, i : i + 1] for i in range(6))

        x = (self.norm1(h.astype(F32)) * (1 + scale) + shift).astype(dtype)
        h = (h.astype(F32) + self.attn1(x, rope=rope).astype(F32) * gate).astype(dtype)

        x = self.norm2(h.astype(F32)).astype(dtype) if self.cross_attn_norm else h
        h = h + self.attn2(x, context, image=image)

        x = (self.norm3(h.astype(F32)) * (1 + c_scale) + c_shift).astype(dtype)
        return (h.astype(F32) + self.ffn(x).astype(F32) * c_gate).astype(dtype)


# ----------------------------------------------------------------------------------- condition embeddings


class _TwoLinear(nnx.Module):
    """``linear_2(act(linear_1(x)))``: diffusers' ``TimestepEmbedding`` (SiLU) and ``PixArtAlphaTextProjection`` (tanh GELU)."""

    def __init__(self, din: int, dim: int, act: str, dtype, rngs: nnx.Rngs):
        self.linear_1 = linear(din, dim, dtype, rngs)
        self.linear_2 = linear(dim, dim, dtype, rngs)
        self.act = act

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.linear_1(x)
        h = jax.nn.silu(h) if self.act == "silu" else jax.nn.gelu(h, approximate=True)
        return self.linear_2(h)


class WanImageEmbedding(nnx.Module):
    """CLIP image tokens ``(B, S, image_dim)`` -> ``(B, S, dim)``: LayerNorm, exact-GELU MLP, LayerNorm.

    With ``pos_embed_seq_len`` (first-last-frame models) consecutive token sets are paired into
    ``(B, pos_embed_seq_len, image_dim)`` and a learned position embedding is added first.
    """

    def __init__(self, in_features: int, out_features: int, pos_embed_seq_len: int | None, dtype, rngs: nnx.Rngs):
        # diffusers builds these two norms with nn.LayerNorm's default eps (1e-5), not the config's.
        self.norm1 = fp32_layer_norm(in_features, 1e-5, True, rngs)
        self.ff = FeedForward(in_features, in_features, out_features, approximate=False, dtype=dtype, rngs=rngs)
        self.norm2 = fp32_layer_norm(out_features, 1e-5, True, rngs)
        self.pos_embed_seq_len = pos_embed_seq_len
        if pos_embed_seq_len is not None:
            self.pos_embed = nnx.Param(jnp.zeros((1, pos_embed_seq_len, in_features), F32))

    def __call__(self, image: jax.Array, dtype) -> jax.Array:
        x = image.astype(F32)
        if self.pos_embed_seq_len is not None:
            x = x.reshape(-1, self.pos_embed_seq_len, x.shape[-1]) + self.pos_embed[...]
        x = self.ff(self.norm1(x).astype(dtype))
        return self.norm2(x.astype(F32)).astype(dtype)


class WanTimeTextImageEmbedding(nnx.Module):
    """Timestep -> ``temb`` ``(B, dim)`` and its six modulations ``(B, 6·dim)``; text ``(B, T, text_dim)`` ->
    ``(B, T, dim)``; CLIP image tokens -> ``(B, S, dim)`` (I2V)."""

    def __init__(
        self,
        dim: int,
        time_freq_dim: int,
        text_embed_dim: int,
        image_embed_dim: int | None,
        pos_embed_seq_len: int | None,
        *,
        dtype,
        rngs: nnx.Rngs,
    ):
        self.time_freq_dim = time_freq_dim
        self.time_embedder = _TwoLinear(time_freq_dim, dim, "silu", F32, rngs)
        self.time_proj = linear(dim, 6 * dim, dtype, rngs)
        self.text_embedder = _TwoLinear(text_embed_dim, dim, "gelu_tanh", dtype, rngs)
        self.has_image = image_embed_dim is not None
        if self.has_image:
            self.image_embedder = WanImageEmbedding(image_embed_dim, dim, pos_embed_seq_len, dtype, rngs)

    def __call__(
        self, timestep: jax.Array, text: jax.Array, image: jax.Array | None
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
        dtype = text.dtype
        temb = self.time_embedder(timestep_sinusoid(timestep, self.time_freq_dim)).astype(dtype)
        timestep_proj = self.time_proj(jax.nn.silu(temb))
        image = None if image is None else self.image_embedder(image, dtype)
        return temb, timestep_proj, self.text_embedder(text), image
