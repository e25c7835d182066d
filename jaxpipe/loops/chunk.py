"""The chunk rollout loop: causal video generated chunk by chunk over a KV cache.

The loop drives a block-causal denoiser (``jaxpipe.nn.CausalDiT``): ``velocity(x, sigma,
ChunkCond)`` of the current chunk given the cache, and ``write(x, ChunkCond, rows)``, which
stores a finished chunk's clean K/V. Per chunk it runs a short Euler schedule from fresh noise;
after the chunk's last step the clean chunk is written into the video and the cache, and the
next chunk starts. One ``step`` is one denoise step of one chunk, so a request takes
``chunks × num_steps`` steps and its chunks stream through the engine's ``on_step`` as they
finish (``Driver.latents`` is the video so far).

State is an explicit pytree holding everything per request: the video latents (an optional
clean prefix, then the generated chunks; unfinished chunks are zero), the current chunk's
latents, the per-request sigma schedule of one chunk, the chunk and step counters, the PRNG
key, the text conditioning (and its unconditional half for guidance) and the KV cache. Chunk
``c``'s noise is drawn from ``fold_in(key, c)``, so a request's bits do not depend on its
batch-mates or on who drives the loop. Guidance composes as in the denoise loop
(``policies.guidance``); the unconditional forward reads the same cache (the past is given,
guidance steers the current chunk).

``train_run`` is the same rollout as a pure, differentiable function for training on the
model's own rollouts (self-forcing): the same noise, schedule, guidance and cache writes, so
its video equals ``run``'s to float tolerance, with gradient only through each chunk's last
denoising step (the earlier steps and every cache write are stop-gradient).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe import samplers, validate
from jaxpipe.loops import policies
from jaxpipe.loops.unpadded import SameConfigBatching
from jaxpipe.nn.causal_dit import ChunkCache, ChunkCond, init_cache

__all__ = [
    "ChunkConfig",
    "ChunkState",
    "ChunkTrace",
    "Driver",
    "DRIVER",
    "init",
    "step",
    "run",
    "train_run",
    "schedule",
]


@dataclasses.dataclass(frozen=True)
class ChunkConfig:
    """The static sampling policy of a chunk rollout (hashable: static under ``jit``).

    Attributes:
      num_steps: Euler steps per chunk, a positive int.
      shift: the flow-shift of each chunk's schedule, > 0.
      guidance: the CFG scale (1 = one forward), >= 0.
      chunks: chunks generated per request, a positive int.
      chunk_frames: latent frames per chunk, a positive int.
      window: finished chunks the cache keeps, i.e. how many earlier chunks a chunk sees (``None``:
        every one, prefix included), >= 1.
      sampler: only ``"ode"`` (a chunk rollout has no SDE/RL path yet).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    num_steps: int = 4
    shift: float = 1.0
    guidance: float = 1.0
    chunks: int = 4
    chunk_frames: int = 2
    window: int | None = None
    sampler: str = "ode"

    def __post_init__(self):
        for name in ("num_steps", "chunks", "chunk_frames"):
            value = getattr(self, name)
            validate.rule(
                not (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1),
                f"ChunkConfig.{name} must be a positive int (got {value!r})",
            )
            object.__setattr__(self, name, int(value))
        if self.window is not None:
            validate.rule(
                not (
                    isinstance(self.window, bool) or not isinstance(self.window, (int, np.integer)) or self.window < 1
                ),
                f"ChunkConfig.window must be None (keep every chunk) or an int >= 1 (got {self.window!r})",
            )
            object.__setattr__(self, "window", int(self.window))
        validate.rule(
            math.isfinite(self.shift) and self.shift > 0,
            f"ChunkConfig.shift must be a finite number > 0 (got {self.shift})",
        )
        validate.rule(
            math.isfinite(self.guidance) and self.guidance >= 0,
            f"ChunkConfig.guidance must be a finite number >= 0 (got {self.guidance})",
        )
        validate.rule(
            self.sampler == "ode", f"a chunk rollout samples with the ODE only (sampler='ode'); got {self.sampler!r}"
        )

    @property
    def guide(self) -> policies.Unguided | policies.CFG:
        """The guidance policy: ``policies.guidance(self.guidance)`` (no STG on a chunk rollout)."""
        return policies.guidance(self.guidance)

    @property
    def frames(self) -> int:
        """Frames generated per request."""
        return self.chunks * self.chunk_frames

    def replace(self, **changes) -> ChunkConfig:
        """A copy with ``changes`` applied (``dataclasses.replace``; the fields are validated again).

        Args:
          **changes: field name -> new value.

        Returns:
          The new ``ChunkConfig``.
        """
        return dataclasses.replace(self, **changes)


class ChunkState(NamedTuple):
    """Everything per request of a chunk rollout (leading axis ``B`` on every leaf).

    Attributes:
      video: ``(B, P + chunks·F, h, w, C)`` float32: the clean prefix (``P`` frames), then the
        generated chunks (zeros until finished).
      x: ``(B, F, h, w, C)``: the current chunk's latents.
      sigmas: ``(B, N+1)``: one chunk's schedule.
      chunk: ``(B,)`` int32: generated chunks finished.
      end: ``(B,)`` int32: chunks to generate (``chunk == end``: done).
      step: ``(B,)`` int32: the step within the current chunk.
      key: ``(B,)`` typed PRNG keys.
      cond: the text conditioning (``DiTCond``-like: ``context``, ``context_mask``).
      uncond: its unconditional counterpart (``None`` without guidance).
      cache: the ``ChunkCache`` of the finished chunks.
    """

    video: jax.Array
    x: jax.Array
    sigmas: jax.Array
    chunk: jax.Array
    end: jax.Array
    step: jax.Array
    key: jax.Array
    cond: Any
    uncond: Any
    cache: ChunkCache


def schedule(config: ChunkConfig) -> jax.Array:
    """One chunk's noise schedule, ``samplers.flow_sigmas(num_steps, shift)``.

    Args:
      config: the rollout's config.

    Returns:
      ``(num_steps + 1,)`` float32 sigmas from 1 down to 0.
    """
    return samplers.flow_sigmas(config.num_steps, config.shift)


def _one(models):
    models = tuple(models) if isinstance(models, (tuple, list)) else (models,)
    if len(models) != 1:
        raise ValueError(f"a chunk_rollout loop drives one causal denoiser (got {len(models)})")
    return models[0]


def _noise(keys: jax.Array, chunk: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Chunk ``chunk[i]``'s starting noise of request ``i``: ``normal(fold_in(keys[i], chunk[i]))``."""
    return jax.vmap(lambda k, c: jax.random.normal(jax.random.fold_in(k, c), shape, jnp.float32))(keys, chunk)


def _conds(state: ChunkState) -> tuple[ChunkCond, ChunkCond | None]:
    cond = ChunkCond(state.cond.context, state.cond.context_mask, state.cache)
    uncond = None if state.uncond is None else ChunkCond(state.uncond.context, state.uncond.context_mask, state.cache)
    return cond, uncond


def init(
    model,
    keys: jax.Array,
    latent_shape: Sequence[int],
    cond: Any,
    config: ChunkConfig,
    uncond: Any = None,
    prefix: jax.Array | None = None,
) -> ChunkState:
    """Start ``B = len(keys)`` requests, each generating ``config.chunks`` chunks of ``latent_shape[1:]`` frames.

    The first chunk's noise is drawn from ``fold_in(key, 0)``. A ``prefix`` is prefilled into the
    cache chunk by chunk, as if it had been generated, and the generated frames continue after it.
    The cache keeps ``config.window`` chunks (default: all).

    Args:
      model: the causal denoiser (``jaxpipe.nn.CausalDiT``: its ``cfg`` sizes the cache, its
        ``write`` prefills it).
      keys: ``(B,)`` typed PRNG keys, one per request.
      latent_shape: the per-request latent shape ``(T, h, w, C)`` (only the frame shape ``(h, w, C)``
        is read).
      cond: text conditioning (``DiTCond``-like: ``context``, ``context_mask``, leading axis ``B``).
      config: the rollout's config.
      uncond: the unconditional conditioning, required when the config guides.
      prefix: ``(B, P, h, w, C)`` clean latents to continue, ``P`` a multiple of ``chunk_frames``
        (default: none).

    Returns:
      The ``ChunkState`` of the requests.

    Raises:
      ValueError: if ``keys`` are not ``(B,)`` typed keys, ``latent_shape`` is not 4-D, guidance lacks
        ``uncond``, or ``prefix`` is misshapen.
    """
    keys = jnp.asarray(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.ndim != 1:
        raise ValueError(f"keys must be a (B,) array of typed PRNG keys (jax.random.key), got {keys.dtype}{keys.shape}")
    b, f = keys.shape[0], config.chunk_frames
    frame = tuple(latent_shape)[1:]
    if len(frame) != 3:
        raise ValueError(f"latent_shape must be (T, h, w, C) (got {tuple(latent_shape)})")
    chex.assert_tree_shape_prefix(cond, (b,))
    if config.guide.needs_uncond and uncond is None:
        raise ValueError(f"guidance={config.guidance} needs the unconditional input (uncond)")
    if prefix is None:
        prefix = jnp.zeros((b, 0) + frame, jnp.float32)
    prefix = jnp.asarray(prefix, jnp.float32)
    if prefix.shape[0] != b or prefix.shape[2:] != frame or prefix.shape[1] % f:
        raise ValueError(
            f"prefix must be (B={b}, P, {', '.join(map(str, frame))}) latents with P a multiple of chunk_frames={f} "
            f"(got {prefix.shape})"
        )
    before = prefix.shape[1] // f
    total = before + config.chunks
    cfg = model.cfg
    tokens = f * (frame[0] // cfg.patch_size) * (frame[1] // cfg.patch_size)
    # a chunk sees at most total - 1 earlier ones, so that many slots hold every one (none for a 1-chunk video)
    cache = init_cache(cfg, b, min(config.window or total, total - 1), tokens)
    for c in range(before):  # prefill: every prefix chunk, clean, as if it had been generated
        cache = model.write(prefix[:, c * f : (c + 1) * f], ChunkCond(cond.context, cond.context_mask, cache))
    video = jnp.concatenate([prefix, jnp.zeros((b, config.frames) + frame, jnp.float32)], axis=1)
    zeros = jnp.zeros((b,), jnp.int32)
    sigmas = jnp.broadcast_to(schedule(config), (b, config.num_steps + 1))
    return ChunkState(
        video=video,
        x=_noise(keys, zeros, (f,) + frame),
        sigmas=sigmas,
        chunk=zeros,
        end=jnp.full((b,), config.chunks, jnp.int32),
        step=zeros,
        key=keys,
        cond=cond,
        uncond=uncond,
        cache=cache,
    )


def step(models, state: ChunkState, config: ChunkConfig) -> ChunkState:
    """One Euler step of every unfinished request's current chunk.

    A request whose chunk takes its last step writes the clean chunk into its video and its
    cache (one extra σ = 0 forward, run only when some row finishes a chunk) and starts the next
    chunk ``c`` from fresh noise ``fold_in(key, c)``. Finished rows (``chunk == end``) are left unchanged.

    Args:
      models: the one causal denoiser, alone or in a one-element tuple.
      state: the requests' state.
      config: the rollout's config.

    Returns:
      The new ``ChunkState``.
    """
    model = _one(models)
    num_steps = state.sigmas.shape[1] - 1
    active = state.chunk < state.end
    idx = jnp.minimum(state.step, num_steps - 1)
    sigma = jnp.take_along_axis(state.sigmas, idx[:, None], axis=1)[:, 0]
    sigma_next = jnp.take_along_axis(state.sigmas, idx[:, None] + 1, axis=1)[:, 0]
    cond, uncond = _conds(state)
    v = config.guide(model.velocity, state.x, sigma, cond, uncond)
    rows = lambda m, a: m.reshape(m.shape + (1,) * (a.ndim - 1))
    x = jnp.where(rows(active, state.x), samplers.euler_step(state.x, v, sigma, sigma_next), state.x)
    finishing = active & (state.step + 1 >= num_steps)

    def finish(cache: ChunkCache) -> ChunkCache:
        return model.write(x, cond._replace(cache=cache), finishing)

    cache = jax.lax.cond(jnp.any(finishing), finish, lambda c: c, state.cache)
    # The chunk's absolute frame: prefix chunks plus generated ones, i.e. what the cache had written.
    at = state.cache.written * x.shape[1]
    put = jax.vmap(lambda video, chunk, t: jax.lax.dynamic_update_slice_in_dim(video, chunk, t, 0))
    video = jnp.where(rows(finishing, state.video), put(state.video, x, at), state.video)
    chunk = state.chunk + finishing.astype(jnp.int32)
    fresh = _noise(state.key, chunk, x.shape[1:])
    x = jnp.where(rows(finishing & (chunk < state.end), x), fresh, x)
    new_step = jnp.where(finishing, 0, state.step + active.astype(jnp.int32))
    return state._replace(video=video, x=x, chunk=chunk, step=new_step, cache=cache)


def run(models, state: ChunkState, config: ChunkConfig, *, capture: bool = False) -> tuple[ChunkState, None]:
    """Run ``chunks × num_steps`` steps as one fused ``lax.scan``.

    Args:
      models: the one causal denoiser, alone or in a one-element tuple.
      state: the requests' state (e.g. from ``init``).
      config: the rollout's config (static under ``jit``).
      capture: must be false: a chunk rollout records no trajectory.

    Returns:
      ``(final state, None)``.

    Raises:
      ValueError: if ``capture`` is true or ``state`` has another step count than ``config``.
    """
    if capture:
        raise ValueError("a chunk_rollout loop records no trajectory (capture=True is not supported: no RL on it yet)")
    num_steps = state.sigmas.shape[1] - 1
    if num_steps != config.num_steps:
        raise ValueError(f"state has {num_steps} steps per chunk but config.num_steps is {config.num_steps}")
    state, _ = jax.lax.scan(lambda s, _: (step(models, s, config), None), state, length=config.chunks * num_steps)
    return state, None


class ChunkTrace(NamedTuple):
    """What each chunk's differentiable last step saw (leading axis ``chunks``, then ``B``); all stop-gradient.

    Attributes:
      x: ``(chunks, B, F, h, w, C)``: the last step's input.
      sigma: ``(chunks, B)``: its noise level.
      cache: the ``ChunkCache`` it attended to (leaves ``(chunks, B, ...)``).
    """

    x: jax.Array
    sigma: jax.Array
    cache: ChunkCache


def _stop_gradient_module(model):
    """A copy of the nnx ``model`` whose every variable is ``stop_gradient``-ed (same values)."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jax.lax.stop_gradient, state))


def train_run(model, state: ChunkState, config: ChunkConfig) -> tuple[jax.Array, ChunkTrace]:
    """The whole rollout from a fresh ``init`` state as a pure function differentiable in ``model``.

    It computes what ``run`` computes (same per-chunk noise ``fold_in(key, c)``, schedule, guidance,
    cache writes), chunk by chunk as one ``lax.scan`` over chunks. Gradient reaches ``model`` only
    through each chunk's LAST denoising step (the one giving its clean latents): the earlier steps run
    on a stop-gradient copy of the weights and their output is stop-gradient, and the cache is written
    from the stop-gradient clean chunk by that copy too, so later chunks see earlier ones as
    constants (no gradient through the cache). Every chunk exits at its last step (the video is the
    served one), unlike the paper's random exit step.

    Args:
      model: the causal denoiser (an nnx module), alone or in a one-element tuple.
      state: a fresh ``init`` state (no chunk generated yet).
      config: the rollout's config.

    Returns:
      ``(video (B, P + chunks·F, h, w, C), ChunkTrace)``.

    Raises:
      ValueError: if ``state`` has another step count than ``config``.
    """
    model = _one(model)
    num_steps = state.sigmas.shape[1] - 1
    if num_steps != config.num_steps:
        raise ValueError(f"state has {num_steps} steps per chunk but config.num_steps is {config.num_steps}")
    frozen = _stop_gradient_module(model)
    b, f = state.x.shape[:2]
    sigmas = jax.lax.stop_gradient(state.sigmas)
    put = jax.vmap(lambda video, chunk, t: jax.lax.dynamic_update_slice_in_dim(video, chunk, t, 0))

    def one_chunk(carry, c):
        video, x, cache = carry
        cond, uncond = _conds(state._replace(cache=cache))

        def no_grad_step(x, i):
            v = config.guide(frozen.velocity, x, sigmas[:, i], cond, uncond)
            return samplers.euler_step(x, v, sigmas[:, i], sigmas[:, i + 1]), None

        x, _ = jax.lax.scan(no_grad_step, x, jnp.arange(num_steps - 1))
        x = jax.lax.stop_gradient(x)
        sigma = sigmas[:, num_steps - 1]
        v = config.guide(model.velocity, x, sigma, cond, uncond)
        clean = samplers.euler_step(x, v, sigma, sigmas[:, num_steps])
        written = frozen.write(jax.lax.stop_gradient(clean), cond)
        video = put(video, clean, cache.written * f)
        fresh = _noise(state.key, jnp.full((b,), c + 1, jnp.int32), x.shape[1:])
        return (video, fresh, written), ChunkTrace(x, sigma, cache)

    (video, _, _), trace = jax.lax.scan(one_chunk, (state.video, state.x, state.cache), jnp.arange(config.chunks))
    return video, trace


# --------------------------------------------------------------------------------------------
# The driver: how the engine steps and batches chunk rollouts
# --------------------------------------------------------------------------------------------


class Driver(SameConfigBatching):
    """Drives ``chunk_rollout`` loops over the one causal denoiser the loop binds.

    A request takes ``chunks × num_steps`` steps. Every row carries its own chunk and step
    counters, cache and noise keys, so rows at different chunks and steps share a batch; configs
    batch together only when equal (``batch_key`` is the whole ``ChunkConfig``), and the engine
    groups rows whose state shapes agree (same prefix length and window). ``latents`` is the
    video so far ``(B, P + chunks·F, h, w, C)``: finished chunks filled, the rest zero.
    """

    kind = "chunk_rollout"

    def check(self, loop) -> None:
        """Raise ``ValueError`` unless ``loop`` (a ``LoopSpec``) has a ``ChunkConfig``, binds one denoiser
        and has a ``(T, h, w, C)`` latent shape whose ``T`` ``chunk_frames`` divides.

        Args:
          loop: the loop's ``LoopSpec``.
        """
        if not isinstance(loop.config, ChunkConfig):
            raise ValueError(f"a chunk_rollout loop's config must be a ChunkConfig (got {type(loop.config).__name__})")
        if len(loop.binds) != 1:
            raise ValueError(f"a chunk_rollout loop drives one causal denoiser; it binds {list(loop.binds)}")
        if loop.latent_shape is None or len(loop.latent_shape) != 4:
            raise ValueError(f"a chunk_rollout loop needs latent_shape (T, h, w, C) (got {loop.latent_shape})")
        if loop.latent_shape[0] % loop.config.chunk_frames:
            raise ValueError(
                f"chunk_frames={loop.config.chunk_frames} does not divide the loop's {loop.latent_shape[0]} frames"
            )

    def step(self, models, state: ChunkState, config: ChunkConfig) -> ChunkState:
        """One ``step`` of the rollout.

        Args:
          models: the bound causal denoiser, alone or in a one-element tuple.
          state: the batch's state.
          config: the batch's config.

        Returns:
          The new ``ChunkState``.
        """
        return step(models, state, config)

    def run(self, models, state: ChunkState, config: ChunkConfig, *, capture: bool = False):
        """``run``: ``(final state, None)`` (``capture`` must be false).

        Args:
          models: the bound causal denoiser, alone or in a one-element tuple.
          state: the batch's state.
          config: the batch's config.
          capture: must be false.
        """
        return run(models, state, config, capture=capture)

    def num_steps(self, config: ChunkConfig) -> int:
        """The steps a request takes: ``chunks × num_steps``.

        Args:
          config: the request's config.
        """
        return config.chunks * config.num_steps

    def deactivate(self, state: ChunkState, rows: jax.Array) -> ChunkState:
        """``state`` with ``rows`` ``(B,)`` bool finished (``chunk = end``), so a step leaves them alone.

        Args:
          state: the batch's state.
          rows: ``(B,)`` bool, the rows to retire.
        """
        return state._replace(chunk=jnp.where(rows, state.end, state.chunk))

    def empty(self, state: ChunkState, capacity: int) -> ChunkState:
        """``capacity`` inert rows shaped like one row of ``state`` (``chunk == end == 0``: done)."""
        rows = jax.tree.map(lambda a: jnp.zeros((capacity,) + a.shape[1:], a.dtype), state._replace(key=None))
        return rows._replace(key=jax.random.split(jax.random.key(0), capacity))  # never read: the rows are done

    def latents(self, state: ChunkState) -> jax.Array:
        """What a preview shows: the video so far ``(B, P + chunks·F, h, w, C)`` (unfinished chunks zero).

        Args:
          state: the batch's state.
        """
        return state.video


DRIVER = Driver()
