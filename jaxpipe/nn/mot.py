"""A Mixture-of-Transformers over text and image tokens: one module that understands and generates.

One packed sequence per request holds text tokens (a prompt, then generated "thought" tokens, in
``max_text`` slots) and the latent tokens of an image or a short video. Every layer runs ONE joint
attention over the whole sequence while the per-token parameters (norms, QKV / output
projections, FFN) come from the token's **modality expert**, as a ``Routing`` policy chooses:

- ``"shared"``: one parameter set for every token (a single transformer, as Cosmos3);
- ``"modality"``: an understanding expert for text tokens and a generation expert for image
  tokens (as BAGEL), attention still joint;
- ``"partial"``: per layer, whether the attention group and the FFN group are routed or shared
  (``Routing.partial``; e.g. shared attention with routed FFNs, or the first k layers shared).

Who attends to whom is a pure function of token type, position and the ``layout``: text tokens
are causal among themselves; image tokens see each other; under ``"generate"`` image tokens also
see every valid text token (text -> image generation), under ``"understand"`` text tokens see the
image (image -> caption). Text never sees the image while generating, so the text K/V of a
prompt + thoughts is computed once (``prefill`` / ``decode_step`` of the AR loop) and reused by
every denoising step (``velocity`` with a ``MoTCond`` holding those K/V).

Entry points, all one set of weights:

- the AR-loop ``Decoder`` protocol: ``init_cache`` / ``prefill`` / ``decode_step`` / ``__call__``
  (text logits; an image placed in the cache with ``prefill_image`` is context under "understand");
- the denoise-loop ``Denoiser`` protocol: ``velocity(x, sigma, MoTCond)``;
- ``forward(ids, text_mask, x, sigma)``: both at once, uncached (what training recomputes);
- ``understand(ids, text_mask, image_latents)``: caption logits given an image, uncached.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from flax import nnx

from jaxpipe import validate
from jaxpipe.nn.layers import check_divisible, check_sizes, compute_dtype, sincos_1d, sincos_grid
from jaxpipe.nn.mot_layer import IMAGE, LAYOUTS, TEXT, MoTLayer, Tokens, attention_mask, cat_tokens, token_meta
from jaxpipe.nn.stacked import Stacked, check_layout, scan

__all__ = ["IMAGE", "LAYOUTS", "POLICIES", "TEXT", "MoT", "MoTCache", "MoTCond", "MoTConfig", "Routing"]

POLICIES = ("shared", "modality", "partial")


@dataclasses.dataclass(frozen=True)
class Routing:
    """Which parameter groups of each layer are per-modality experts.

    ``policy``: ``"shared"`` (nothing routed), ``"modality"`` (everything routed) or ``"partial"``,
    which names per layer whether the attention group (norm, QKV, output projection) and the FFN
    group (norm, MLP) are routed: ``attention`` / ``ffn``, tuples of ``depth`` bools.
    """

    policy: str = "modality"
    attention: tuple[bool, ...] = ()
    ffn: tuple[bool, ...] = ()

    def __post_init__(self):
        validate.rule(
            self.policy in POLICIES, f"unknown routing policy {self.policy!r}; the policies are {', '.join(POLICIES)}"
        )
        object.__setattr__(self, "attention", tuple(bool(a) for a in self.attention))
        object.__setattr__(self, "ffn", tuple(bool(f) for f in self.ffn))
        if self.policy == "partial":
            validate.rule(
                len(self.attention) == len(self.ffn) and bool(self.attention),
                "partial routing needs per-layer attention and ffn flags of the same length (the depth)",
            )
        else:
            validate.rule(
                not (self.attention or self.ffn),
                f"{self.policy!r} routing takes no per-layer flags (use Routing.partial)",
            )

    @classmethod
    def partial(cls, attention, ffn) -> Routing:
        """Per-layer flags: ``attention[l]`` / ``ffn[l]`` true = that group of layer ``l`` is routed."""
        return cls("partial", tuple(attention), tuple(ffn))

    @classmethod
    def first_shared(cls, depth: int, shared: int) -> Routing:
        """The first ``shared`` layers shared, the rest routed."""
        flags = tuple(i >= shared for i in range(depth))
        return cls.partial(flags, flags)

    @classmethod
    def ffn_only(cls, depth: int) -> Routing:
        """Shared attention projections, routed FFNs in every layer."""
        return cls.partial((False,) * depth, (True,) * depth)

    def routed(self, layer: int) -> tuple[bool, bool]:
        """``(attention routed, ffn routed)`` of ``layer``."""
        if self.policy == "partial":
            return self.attention[layer], self.ffn[layer]
        return (self.policy == "modality",) * 2


@dataclasses.dataclass(frozen=True)
class MoTConfig:
    """Sizes of the MoT.

    Attributes:
      vocab_size: the number of text ids.
      max_text: the text slots (prompt + thoughts; the text KV-cache length).
      latent_channels: channels of the image / video latents.
      latent_size: the latents' side.
      frames: latent frames (1: an image).
      patch_size: the side of a square latent patch (one token; divides ``latent_size``).
      dim: the model width.
      depth: the number of layers.
      heads: attention heads (``dim`` must be divisible by it).
      mlp_ratio: the MLP hidden width as a multiple of ``dim``.
      time_embed_dim: the width of the sinusoidal timestep features.
      routing: the modality routing, a ``Routing`` or a policy name.
      dtype: the compute dtype's name.
      scan_layers: store the layers stacked (``layers/stacked/...``) and run every entry point's layers,
        cached ones included, as one ``lax.scan``; ``False`` (the default) keeps one parameter set per
        layer (``layers/3/...``), the layout the bundled cards are saved in. The caches are per layer
        either way. Stacking needs layers of one structure: partial routing must route every layer alike.
      remat: what each layer keeps for the backward pass (``stacked.REMAT_POLICIES``).

    Raises:
      TypeError: on a ``routing`` that is neither a ``Routing`` nor a policy name.
      ValueError: on a non-positive size, indivisible ``dim`` / ``latent_size``, partial routing of the
        wrong length (or, scanned, not the same in every layer), an unknown dtype, a non-bool
        ``scan_layers`` or an unknown ``remat``.
    """

    vocab_size: int
    max_text: int = 16
    latent_channels: int = 4
    latent_size: int = 8
    frames: int = 1
    patch_size: int = 2
    dim: int = 64
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    time_embed_dim: int = 128
    routing: Routing = Routing()
    dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"

    def __post_init__(self):
        if isinstance(self.routing, str):
            object.__setattr__(self, "routing", Routing(self.routing))
        validate.rule(
            isinstance(self.routing, Routing),
            f"routing must be a Routing or one of {', '.join(POLICIES)} (got {self.routing!r})",
            TypeError,
        )
        check_sizes(
            self,
            (
                "vocab_size",
                "max_text",
                "latent_channels",
                "latent_size",
                "frames",
                "patch_size",
                "dim",
                "depth",
                "heads",
            ),
        )
        check_divisible(self, "dim", "heads")
        check_divisible(self, "latent_size", "patch_size")
        validate.rule(
            self.routing.policy != "partial" or len(self.routing.attention) == self.depth,
            f"partial routing names {len(self.routing.attention)} layers; the depth is {self.depth}",
        )
        compute_dtype(self.dtype)
        check_layout(self)
        validate.rule(
            not self.scan_layers or len({self.routing.routed(i) for i in range(self.depth)}) == 1,
            "scan_layers stacks layers of one structure, but this partial routing routes layers differently "
            f"(attention {self.routing.attention}, ffn {self.routing.ffn}); use scan_layers=False",
        )

    @property
    def head_dim(self) -> int:
        """The width of one attention head, ``dim // heads``."""
        return self.dim // self.heads

    @property
    def frame_tokens(self) -> int:
        """Latent tokens per frame (the image context slots of the KV cache)."""
        return (self.latent_size // self.patch_size) ** 2

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """Per-request latent shape ``(frames, latent_size, latent_size, latent_channels)``."""
        return (self.frames, self.latent_size, self.latent_size, self.latent_channels)

    @property
    def patch_features(self) -> int:
        """Features of one patch token before embedding: ``patch_size² · latent_channels``."""
        return self.patch_size**2 * self.latent_channels


class MoTCache(NamedTuple):
    """The AR loop's KV cache: per layer ``k`` / ``v`` ``(B, max_text + frame_tokens, heads, head_dim)``
    — text slots first, then one image frame's slots — and ``image`` ``(B,)`` bool: the image slots
    hold an image the text attends to (``prefill_image``, understanding)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    image: jax.Array


class MoTCond(NamedTuple):
    """What ``velocity`` conditions on: per layer the text K/V ``(B, L, heads, head_dim)`` computed by
    this module and the valid text slots ``mask`` ``(B, L)`` (all false: unconditional)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    mask: jax.Array


class MoT(nnx.Module):
    """A Mixture-of-Transformers (see the module docstring): text logits and image velocities from one stack."""

    def __init__(self, cfg: MoTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dtype = compute_dtype(cfg.dtype)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.dim, dtype=dtype, rngs=rngs)
        self.text_pos = nnx.Param(jax.random.normal(rngs.params(), (cfg.max_text, cfg.dim)) * 0.02)
        self.patch_embed = nnx.Linear(cfg.patch_features, cfg.dim, dtype=dtype, rngs=rngs)
        self.time_in = nnx.Linear(cfg.time_embed_dim, cfg.dim, dtype=dtype, rngs=rngs)
        self.time_out = nnx.Linear(cfg.dim, cfg.dim, dtype=dtype, rngs=rngs)
        layers = [MoTLayer(cfg, cfg.routing.routed(i), rngs) for i in range(cfg.depth)]
        self.layers = Stacked(layers) if cfg.scan_layers else nnx.List(layers)
        self.text_norm = nnx.LayerNorm(cfg.dim, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(cfg.dim, cfg.vocab_size, use_bias=False, dtype=dtype, rngs=rngs)
        self.image_norm = nnx.LayerNorm(cfg.dim, use_bias=False, use_scale=False, dtype=dtype, rngs=rngs)
        zeros = nnx.initializers.zeros_init()
        self.image_ada = nnx.Linear(cfg.dim, 2 * cfg.dim, kernel_init=zeros, bias_init=zeros, dtype=dtype, rngs=rngs)
        self.image_out = nnx.Linear(
            cfg.dim, cfg.patch_features, kernel_init=zeros, bias_init=zeros, dtype=dtype, rngs=rngs
        )

    # ----------------------------------------------------------------- protocol properties
    @property
    def max_len(self) -> int:
        """The text slots (``cfg.max_text``): the AR loop's buffer width."""
        return self.cfg.max_text

    @property
    def vocab_size(self) -> int:
        """The number of text ids."""
        return self.cfg.vocab_size

    # ----------------------------------------------------------------- embeddings and heads
    def _text_in(self, ids: jax.Array, pos: jax.Array) -> jax.Array:
        return self.embed(ids) + self.text_pos[pos].astype(compute_dtype(self.cfg.dtype))

    def _time(self, sigma: jax.Array, batch: int) -> jax.Array:
        sigma = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32), (batch,))
        return self.time_out(jax.nn.silu(self.time_in(sincos_1d(sigma * 1000.0, self.cfg.time_embed_dim))))

    def _image_in(self, x: jax.Array, t_emb: jax.Array) -> jax.Array:
        cfg = self.cfg
        chex.assert_rank(x, 5)
        _, frames, hh, ww, c = x.shape
        if c != cfg.latent_channels or hh % cfg.patch_size or ww % cfg.patch_size:
            raise ValueError(
                f"latents must be (B, T, H, W, {cfg.latent_channels}) with H, W divisible by patch_size={cfg.patch_size}; "
                f"got {x.shape}"
            )
        p = cfg.patch_size
        tokens = rearrange(x.astype(compute_dtype(cfg.dtype)), "b t (h p) (w q) c -> b (t h w) (p q c)", p=p, q=p)
        h = self.patch_embed(tokens) + sincos_grid(frames, hh // p, ww // p, cfg.dim).astype(tokens.dtype)
        return h + t_emb[:, None].astype(h.dtype)

    def _text_out(self, h: jax.Array) -> jax.Array:
        return self.head(self.text_norm(h)).astype(jnp.float32)

    def _image_out(self, h: jax.Array, t_emb: jax.Array, shape) -> jax.Array:
        shift, scale = jnp.split(self.image_ada(jax.nn.silu(t_emb)), 2, axis=-1)
        out = self.image_out(self.image_norm(h) * (1.0 + scale[:, None]) + shift[:, None])
        _, frames, hh, ww, _ = shape
        p = self.cfg.patch_size
        v = rearrange(out, "b (t h w) (p q c) -> b t (h p) (w q) c", t=frames, h=hh // p, w=ww // p, p=p, q=p)
        return v.astype(jnp.float32)

    @staticmethod
    def _image_meta(batch: int, tokens: int) -> Tokens:
        return token_meta(IMAGE, jnp.broadcast_to(jnp.arange(tokens), (batch, tokens)), jnp.ones((batch, tokens), bool))

    # ----------------------------------------------------------------- the stack
    def transform(self, segments, queries: Tokens, keys: Tokens, layout: str, past=None):
        """Run every layer on hidden ``segments`` ``[(token type, h (B, L, dim))]`` (queries' metadata
        ``queries``; ``keys`` = past slots then these tokens). ``past``: per-layer ``(k, v)`` of cached
        slots or ``None``. Returns the final segments and per-layer ``(k, v)`` of these tokens."""
        mask = attention_mask(queries, keys, layout)
        kinds = [kind for kind, _ in segments]  # static: which expert each segment's tokens use

        def step(layer, hs, past_kv):
            past_k, past_v = (None, None) if past_kv is None else past_kv
            out, k, v = layer(list(zip(kinds, hs)), mask, past_k, past_v)
            return tuple(h for _, h in out), (k, v)

        hs, kvs = scan(self.layers, step, tuple(h for _, h in segments), past, remat=self.cfg.remat)
        return list(zip(kinds, hs)), kvs

    def forward(
        self, ids: jax.Array, text_mask: jax.Array, x: jax.Array, sigma: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Generation, uncached: text ``ids`` ``(B, L)`` (``text_mask`` ``(B, L)`` valid) and noisy latents
        ``x`` ``(B, T, H, W, C)`` at ``sigma`` ``(B,)`` in one packed sequence. Returns text logits
        ``(B, L, V)`` and the velocity ``(B, T, H, W, C)``, both float32."""
        b, length = self._check_ids(ids)
        chex.assert_shape(text_mask, (b, length))
        t_emb = self._time(sigma, b)
        h_img = self._image_in(x, t_emb)
        pos = jnp.broadcast_to(jnp.arange(length), (b, length))
        meta = cat_tokens(token_meta(TEXT, pos, text_mask), self._image_meta(b, h_img.shape[1]))
        segments, _ = self.transform([(TEXT, self._text_in(ids, pos)), (IMAGE, h_img)], meta, meta, "generate")
        return self._text_out(segments[0][1]), self._image_out(segments[1][1], t_emb, x.shape)

    def understand(self, ids: jax.Array, text_mask: jax.Array, latents: jax.Array) -> jax.Array:
        """Understanding, uncached: text logits ``(B, L, V)`` of ``ids`` ``(B, L)`` given clean image
        ``latents`` ``(B, 1, H, W, C)`` as context (image tokens first, then the caption)."""
        b, length = self._check_ids(ids)
        self._check_image(latents, b)
        h_img = self._image_in(latents, self._time(jnp.zeros((b,)), b))
        pos = jnp.broadcast_to(jnp.arange(length), (b, length))
        meta = cat_tokens(self._image_meta(b, h_img.shape[1]), token_meta(TEXT, pos, text_mask))
        segments, _ = self.transform([(IMAGE, h_img), (TEXT, self._text_in(ids, pos))], meta, meta, "understand")
        return self._text_out(segments[1][1])

    def _check_ids(self, ids: jax.Array) -> tuple[int, int]:
        chex.assert_rank(ids, 2)
        b, length = ids.shape
        if length > self.cfg.max_text:
            raise ValueError(
                f"a text of {length} tokens does not fit the packed sequence's max_text={self.cfg.max_text} slots"
            )
        return b, length

    def _check_image(self, latents: jax.Array, batch: int) -> None:
        cfg = self.cfg
        expected = (batch, 1, cfg.latent_size, cfg.latent_size, cfg.latent_channels)
        if tuple(latents.shape) != expected:
            raise ValueError(f"understanding reads one image's latents {expected}; got {tuple(latents.shape)}")

    # ----------------------------------------------------------------- the Decoder protocol (AR loop)
    def __call__(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Teacher-forced text logits ``(B, L, V)`` float32 of right-padded ``ids`` ``(B, L)`` (no image)."""
        b, length = self._check_ids(ids)
        mask = jnp.ones((b, length), bool) if mask is None else jnp.asarray(mask, bool)
        pos = jnp.broadcast_to(jnp.arange(length), (b, length))
        meta = token_meta(TEXT, pos, mask)
        segments, _ = self.transform([(TEXT, self._text_in(ids, pos))], meta, meta, "generate")
        return self._text_out(segments[0][1])

    def init_cache(self, batch: int) -> MoTCache:
        """An empty cache: per layer ``(batch, max_text + frame_tokens, heads, head_dim)`` zeros, no image."""
        cfg = self.cfg
        shape = (batch, cfg.max_text + cfg.frame_tokens, cfg.heads, cfg.head_dim)
        dtype = compute_dtype(cfg.dtype)
        zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.depth))
        return MoTCache(k=zeros(), v=zeros(), image=jnp.zeros((batch,), bool))

    def _check_cache(self, cache: MoTCache, batch: int) -> None:
        cfg = self.cfg
        if len(cache.k) != cfg.depth or len(cache.v) != cfg.depth:
            raise ValueError(f"cache has {len(cache.k)} layers; the MoT has depth {cfg.depth}")
        chex.assert_shape(
            list(cache.k) + list(cache.v), (batch, cfg.max_text + cfg.frame_tokens, cfg.heads, cfg.head_dim)
        )
        chex.assert_shape(cache.image, (batch,))

    def prefill_image(self, latents: jax.Array, cache: MoTCache) -> MoTCache:
        """Write clean image ``latents`` ``(B, 1, H, W, C)`` into the cache's image slots (understanding):
        text prefilled or decoded afterwards attends to them."""
        b = latents.shape[0]
        self._check_image(latents, b)
        self._check_cache(cache, b)
        h_img = self._image_in(latents, self._time(jnp.zeros((b,)), b))
        meta = self._image_meta(b, h_img.shape[1])
        _, kvs = self.transform([(IMAGE, h_img)], meta, meta, "understand")
        start = self.cfg.max_text
        write = lambda buf, new: jax.lax.dynamic_update_slice_in_dim(buf, new.astype(buf.dtype), start, axis=1)
        return MoTCache(
            k=tuple(write(buf, k) for buf, (k, _) in zip(cache.k, kvs)),
            v=tuple(write(buf, v) for buf, (_, v) in zip(cache.v, kvs)),
            image=jnp.ones((b,), bool),
        )

    def prefill(self, ids: jax.Array, lengths: jax.Array, cache: MoTCache) -> tuple[jax.Array, MoTCache]:
        """Prompts ``ids`` ``(B, L)`` (true ``lengths`` ``(B,)``) in one causal forward that also sees the
        cache's image (if any); writes text slots ``[0, L)``. Returns next-token logits ``(B, V)``."""
        b, length = self._check_ids(ids)
        chex.assert_shape(lengths, (b,))
        self._check_cache(cache, b)
        pos = jnp.broadcast_to(jnp.arange(length), (b, length))
        valid = pos < lengths[:, None]
        queries = token_meta(TEXT, pos, valid)
        image = self.cfg.max_text
        past = [(k[:, image:], v[:, image:]) for k, v in zip(cache.k, cache.v)]
        keys = cat_tokens(self._image_slots(cache), queries)
        segments, kvs = self.transform([(TEXT, self._text_in(ids, pos))], queries, keys, "understand", past=past)
        last = jnp.clip(lengths - 1, 0, length - 1)
        logits = self._text_out(jnp.take_along_axis(segments[0][1], last[:, None, None], axis=1))[:, 0]
        write = lambda buf, new: jax.lax.dynamic_update_slice_in_dim(buf, new.astype(buf.dtype), 0, axis=1)
        cache = cache._replace(
            k=tuple(write(buf, k) for buf, (k, _) in zip(cache.k, kvs)),
            v=tuple(write(buf, v) for buf, (_, v) in zip(cache.v, kvs)),
        )
        return logits, cache

    def _image_slots(self, cache: MoTCache) -> Tokens:
        b = cache.image.shape[0]
        image = self._image_meta(b, self.cfg.frame_tokens)
        return image._replace(valid=jnp.broadcast_to(cache.image[:, None], image.valid.shape))

    def decode_step(self, token: jax.Array, position: jax.Array, cache: MoTCache) -> tuple[jax.Array, MoTCache]:
        """One ``token`` ``(B,)`` per request at ``position`` ``(B,)``: writes its K/V into text slot
        ``position`` and attends over text slots ``<= position`` (and the image, if any).
        Returns next-token logits ``(B, V)`` and the cache."""
        chex.assert_rank(token, 1)
        b = token.shape[0]
        chex.assert_shape(position, (b,))
        self._check_cache(cache, b)
        position = jnp.asarray(position, jnp.int32)
        rows = jnp.arange(b)
        h = self._text_in(token[:, None], position[:, None])
        queries = token_meta(TEXT, position[:, None], jnp.ones((b, 1), bool))
        slots = jnp.broadcast_to(jnp.arange(self.cfg.max_text), (b, self.cfg.max_text))
        # Slot ``position`` may hold a stale key: the token's own key comes last, as "these tokens", and the
        # slots from ``position`` on get no token type, so not even the always-see-itself rule reaches them.
        earlier = slots < position[:, None]
        past_text = Tokens(jnp.where(earlier, TEXT, -1).astype(jnp.int32), slots.astype(jnp.int32), earlier)
        keys = cat_tokens(past_text, self._image_slots(cache), queries)
        segments, kvs = self.transform([(TEXT, h)], queries, keys, "understand", past=list(zip(cache.k, cache.v)))
        write = lambda buf, new: buf.at[rows, position].set(new[:, 0].astype(buf.dtype))
        cache = cache._replace(
            k=tuple(write(buf, k) for buf, (k, _) in zip(cache.k, kvs)),
            v=tuple(write(buf, v) for buf, (_, v) in zip(cache.v, kvs)),
        )
        return self._text_out(segments[0][1])[:, 0], cache

    # ----------------------------------------------------------------- the Denoiser protocol (denoise loop)
    def text_cond(self, cache: MoTCache, length: jax.Array) -> MoTCond:
        """The denoiser's conditioning from an AR cache: text slots ``[0, length)`` ``(B,)`` of every layer."""
        t = self.cfg.max_text
        mask = jnp.arange(t)[None, :] < length[:, None]
        return MoTCond(tuple(k[:, :t] for k in cache.k), tuple(v[:, :t] for v in cache.v), mask)

    def null_cond(self, batch: int) -> MoTCond:
        """The unconditional conditioning (no valid text): for guidance."""
        cache = self.init_cache(batch)
        return self.text_cond(cache, jnp.zeros((batch,), jnp.int32))

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: MoTCond) -> jax.Array:
        """Velocity ``(B, T, H, W, C)`` float32 of latents ``x`` at ``sigma`` ``(B,)``; image tokens attend
        to each other and to the cached text K/V of ``cond`` (never recomputed here)."""
        b = x.shape[0]
        chex.assert_shape(cond.mask, (b, None))
        t_emb = self._time(sigma, b)
        h_img = self._image_in(x, t_emb)
        queries = self._image_meta(b, h_img.shape[1])
        length = cond.mask.shape[1]
        text = token_meta(TEXT, jnp.broadcast_to(jnp.arange(length), (b, length)), cond.mask)
        keys = cat_tokens(text, queries)
        segments, _ = self.transform([(IMAGE, h_img)], queries, keys, "generate", past=list(zip(cond.k, cond.v)))
        return self._image_out(segments[0][1], t_emb, x.shape)

    # ----------------------------------------------------------------- parameter accounting
    def param_counts(self) -> dict[str, int]:
        """Parameters by role: ``shared`` (groups every token uses), ``understanding`` / ``generation``
        (each routed expert's groups), ``io`` (embeddings and heads, modality-specific by nature) and ``total``."""
        size = lambda module: sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(module, nnx.Param)))
        counts = {"shared": 0, "understanding": 0, "generation": 0}
        # a stacked layer's arrays hold every layer (leading layer axis): counted once, they count them all
        for layer in [self.layers.stacked] if isinstance(self.layers, Stacked) else self.layers:
            for groups in (layer.attn, layer.ffn):
                if len(groups) == 1:
                    counts["shared"] += size(groups[0])
                else:
                    counts["understanding"] += size(groups[TEXT])
                    counts["generation"] += size(groups[IMAGE])
        total = size(self)
        return {**counts, "io": total - sum(counts.values()), "total": total}
