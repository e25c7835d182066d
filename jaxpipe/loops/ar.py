"""The autoregressive decode loop: KV-cached sampling as a pure ``step``, a fused ``lax.scan``
runner (its engine driver is ``jaxpipe.loops.ar_driver``, also reachable as ``ar.DRIVER``).

The loop drives any model satisfying the ``Decoder`` protocol (``init_cache`` / ``prefill`` /
``decode_step`` plus a teacher-forced ``__call__``; e.g. ``jaxpipe.nn.RefinerLM``).

State is an explicit pytree holding everything per request: a fixed-size token buffer
``(B, max_len)`` (prompt then generated tokens), the current length, the prompt length, a
``done`` mask, the KV cache, the next-token logits and per-request PRNG keys. Generated token
``i`` of a request is drawn with ``fold_in(request_key, i)``, so a request's tokens do not depend
on which other requests share its batch or on who drives the loop (``run`` or the engine).

Log-probs: every record carries ``log π(y_t | prompt, y_<t)`` of the model's own distribution —
the log-softmax of the *untempered* logits (temperature 1) at the sampled token — whatever
``temperature`` the tokens were sampled at. This is the policy of's token policy
gradient, and exactly what ``sequence_log_probs`` recomputes with one teacher-forced forward
(C2: ratio == 1). With ``temperature != 1`` the tokens come from the tempered distribution, so
the log-prob is not the sampling density; train at temperature 1 for on-policy gradients.

EOS masking: a request that samples ``eos_id`` keeps that token (it is a valid, scored action)
and is then done; a done request, or one whose buffer is full, emits ``<pad>`` (0) with
``valid == False`` and ``log_prob == 0`` and stays done.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import validate

__all__ = [
    "Decoder",
    "ARConfig",
    "ARState",
    "TokenRecord",
    "init",
    "step",
    "run",
    "sequence_log_probs",
    "generated_mask",
    "scatter_steps",
    "Continuation",
    "continuation",
    "Driver",  # noqa: F822 (jaxpipe.loops.ar_driver, reached by __getattr__ below)
    "DRIVER",  # noqa: F822 (jaxpipe.loops.ar_driver, reached by __getattr__ below)
    "PAD_ID",
]

PAD_ID = 0
"""The ``<pad>`` token id: right-padding of prompts, and what a finished request emits."""


@runtime_checkable
class Decoder(Protocol):
    """What the AR loop drives: a causal decoder with an explicit KV cache (a pytree).

    Besides the cached ``prefill`` / ``decode_step`` pair that sampling uses, a decoder is callable as
    ``model(ids (B, T), mask (B, T)) -> logits (B, T, V)``: one teacher-forced forward, what
    ``sequence_log_probs`` scores with.
    """

    @property
    def max_len(self) -> int:
        """The token buffer and KV-cache length: prompt plus generated tokens fit in it."""

    @property
    def vocab_size(self) -> int:
        """The width ``V`` of the logits."""

    def init_cache(self, batch: int) -> Any:
        """An empty KV cache for ``batch`` requests.

        Args:
          batch: the number of requests ``B``.

        Returns:
          The cache pytree (leading axis ``B``).
        """

    def prefill(self, ids: jax.Array, lengths: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Run the prompts through the decoder, writing their keys and values into ``cache``.

        Args:
          ids: right-padded prompts ``(B, L)`` int32.
          lengths: the true prompt lengths ``(B,)`` int32.
          cache: the cache to write into.

        Returns:
          ``(logits (B, V), cache)``: each request's next-token logits after its last prompt token,
          and the filled cache.
        """

    def decode_step(self, token: jax.Array, position: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Feed one token per request at buffer slot ``position`` and read the next-token logits.

        Args:
          token: ``(B,)`` int32 token ids.
          position: ``(B,)`` int32 slots of those tokens.
          cache: the KV cache.

        Returns:
          ``(logits (B, V), cache)`` with the token's keys and values written.
        """

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class ARConfig:
    """The static sampling policy of an AR loop (hashable: static under ``jit``).

    Attributes:
      max_new_tokens: tokens generated per request, a positive int (``run`` scans this many steps).
      temperature: ``0`` is greedy (argmax); ``> 0`` samples ``softmax(logits / temperature)``.
      eos_id: the token that ends a request (``None``: only the budget or the buffer end do).

    Raises:
      ValueError: on construction, if a field is out of range (``max_new_tokens`` not a positive int,
        ``temperature`` negative or not finite, ``eos_id`` negative).
    """

    max_new_tokens: int = 8
    temperature: float = 1.0
    eos_id: int | None = None

    def __post_init__(self):
        n = self.max_new_tokens
        validate.rule(
            not (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0),
            f"max_new_tokens must be a positive int (got {n!r})",
        )
        object.__setattr__(self, "max_new_tokens", int(n))
        t = self.temperature
        validate.rule(
            not (isinstance(t, bool) or not isinstance(t, (int, float, np.floating)) or not math.isfinite(t) or t < 0),
            f"temperature must be a finite number >= 0 (0 = greedy) (got {t!r})",
        )
        object.__setattr__(self, "temperature", float(t))
        e = self.eos_id
        validate.rule(
            not (e is not None and (isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0)),
            f"eos_id must be None or a token id >= 0 (got {e!r})",
        )
        if e is not None:
            object.__setattr__(self, "eos_id", int(e))

    def replace(self, **changes) -> ARConfig:
        """A copy with ``changes`` applied (``dataclasses.replace``; the fields are validated again).

        Args:
          **changes: field name -> new value.

        Returns:
          The new ``ARConfig``.
        """
        return dataclasses.replace(self, **changes)


class ARState(NamedTuple):
    """Everything per request of an AR loop (``B`` requests, buffer width ``T = model.max_len``).

    Attributes:
      tokens: ``(B, T)`` int32: prompt then generated tokens, ``<pad>`` after.
      length: ``(B,)`` int32: tokens in the buffer (the slot of the next token).
      prompt_length: ``(B,)`` int32: the true prompt lengths.
      generated: ``(B,)`` int32: tokens generated so far (the ``fold_in`` index of the next draw).
      done: ``(B,)`` bool: finished requests.
      logits: ``(B, V)``: the next-token logits.
      cache: the decoder's KV cache.
      key: ``(B,)`` typed PRNG keys, one per request.
    """

    tokens: jax.Array
    length: jax.Array
    prompt_length: jax.Array
    generated: jax.Array
    done: jax.Array
    logits: jax.Array
    cache: Any
    key: jax.Array


class TokenRecord(NamedTuple):
    """What one AR step generated (under ``run`` each field gains a leading time axis ``S``).

    Attributes:
      token: ``(B,)`` int32: the sampled tokens (``<pad>`` where not valid).
      log_prob: ``(B,)`` float32: ``log_softmax(untempered logits)[token]`` (0 where not valid).
      valid: ``(B,)`` bool: a token was generated this step.
      position: ``(B,)`` int32: the buffer slot the token went to.
    """

    token: jax.Array
    log_prob: jax.Array
    valid: jax.Array
    position: jax.Array


def _concrete(x) -> np.ndarray | None:
    try:
        return np.asarray(x)
    except jax.errors.TracerArrayConversionError:
        return None
    except jax.errors.ConcretizationTypeError:
        return None


def init(
    model: Decoder,
    prompt_ids: jax.Array,
    keys: jax.Array,
    config: ARConfig,
    *,
    cache: Any = None,
    prefilled: tuple[jax.Array, Any] | None = None,
) -> ARState:
    """Start ``B`` requests from right-padded prompts: prefill the KV cache and keep the next-token logits.

    Needs ``prompt length + max_new_tokens <= model.max_len``, checked on the true lengths when they
    are concrete and on the width ``L`` under tracing.

    Args:
      model: the decoder.
      prompt_ids: right-padded prompts ``(B, L)``, integer (pad = 0; the true lengths are
        ``sum(ids != 0)``, each >= 1).
      keys: ``(B,)`` typed PRNG keys (``jax.random.key``), one per request.
      config: the sampling policy.
      cache: prefill on top of this cache instead of an empty one (e.g. one already holding an image
        the prompt attends to).
      prefilled: the ``(logits (B, V), cache)`` of ``model.prefill`` on exactly these prompts,
        computed earlier (a cached program node), so the prompt is not run again.

    Returns:
      The ``ARState`` of the requests, nothing generated yet.

    Raises:
      ValueError: if ``prompt_ids`` is not a ``(B, L)`` integer array, ``keys`` not ``(B,)`` typed
        keys, a prompt is empty or too long for ``max_len``, or both ``cache`` and ``prefilled`` are given.
    """
    max_len = model.max_len
    prompt_ids = jnp.asarray(prompt_ids)
    if prompt_ids.ndim != 2 or not jnp.issubdtype(prompt_ids.dtype, jnp.integer):
        raise ValueError(f"prompt_ids must be a (B, L) integer array, got {prompt_ids.dtype}{prompt_ids.shape}")
    b, width = prompt_ids.shape
    keys = jnp.asarray(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.shape != (b,):
        raise ValueError(
            f"keys must be a ({b},) array of typed PRNG keys (jax.random.key), got {keys.dtype}{keys.shape}"
        )
    if width > max_len:
        raise ValueError(f"prompt_ids has width {width}; the LM's max_len is {max_len}")
    prompt_ids = prompt_ids.astype(jnp.int32)
    lengths = jnp.sum(prompt_ids != PAD_ID, axis=1).astype(jnp.int32)
    known = _concrete(lengths)
    longest = int(known.max()) if known is not None else width
    if known is not None and known.min() < 1:
        raise ValueError(
            f"prompt_ids: every prompt needs at least one token (rows {np.flatnonzero(known < 1).tolist()} are empty)"
        )
    if longest + config.max_new_tokens > max_len:
        raise ValueError(
            f"prompt_ids: a prompt of {longest} tokens + max_new_tokens={config.max_new_tokens} exceeds the LM's "
            f"max_len={max_len}; prompts may have at most max_len - max_new_tokens = {max_len - config.max_new_tokens} tokens"
        )
    if prefilled is not None:
        if cache is not None:
            raise ValueError("pass either cache (to prefill on) or prefilled (already prefilled), not both")
        logits, cache = prefilled
        chex.assert_shape(logits, (b, model.vocab_size))
    else:
        logits, cache = model.prefill(prompt_ids, lengths, model.init_cache(b) if cache is None else cache)
    tokens = jnp.zeros((b, max_len), jnp.int32).at[:, :width].set(prompt_ids)
    zeros = jnp.zeros((b,), jnp.int32)
    return ARState(
        tokens=tokens,
        length=lengths,
        prompt_length=lengths,
        generated=zeros,
        done=jnp.zeros((b,), bool),
        logits=logits,
        cache=cache,
        key=keys,
    )


def _sample(logits: jax.Array, keys: jax.Array, index: jax.Array, temperature: float) -> jax.Array:
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    draw = lambda k, i, lg: jax.random.categorical(jax.random.fold_in(k, i), lg / temperature)
    return jax.vmap(draw)(keys, index, logits).astype(jnp.int32)


def step(model: Decoder, state: ARState, config: ARConfig) -> tuple[ARState, TokenRecord]:
    """Generate one token per unfinished request.

    Samples from ``state.logits`` (greedy, or from ``softmax(logits / temperature)`` with key
    ``fold_in(key, generated)``), writes the token at slot ``length``, then runs one cached
    ``decode_step`` for the next logits. A request that is done, has used ``max_new_tokens`` or has a
    full buffer records ``<pad>``, invalid, and keeps its tokens, length and counters. A request that
    samples ``eos_id`` keeps that token and is then done.

    Args:
      model: the decoder.
      state: the requests' state.
      config: the sampling policy.

    Returns:
      ``(new state, TokenRecord)`` of this step, record fields ``(B,)``.
    """
    b, max_len = state.tokens.shape
    chex.assert_shape([state.length, state.prompt_length, state.generated, state.done, state.key], (b,))
    chex.assert_shape(state.logits, (b, model.vocab_size))
    active = ~state.done & (state.generated < config.max_new_tokens) & (state.length < max_len)
    sampled = _sample(state.logits, state.key, state.generated, config.temperature)
    token = jnp.where(active, sampled, PAD_ID)
    log_probs = jax.nn.log_softmax(state.logits, axis=-1)
    log_prob = jnp.take_along_axis(log_probs, sampled[:, None], axis=1)[:, 0]
    position = jnp.minimum(state.length, max_len - 1)
    rows = jnp.arange(b)
    tokens = state.tokens.at[rows, position].set(jnp.where(active, token, state.tokens[rows, position]))
    logits, cache = model.decode_step(token, position, state.cache)
    ended = active & (token == config.eos_id) if config.eos_id is not None else jnp.zeros_like(active)
    length = state.length + active.astype(jnp.int32)
    generated = state.generated + active.astype(jnp.int32)
    done = state.done | ended | (generated >= config.max_new_tokens) | (length >= max_len)
    record = TokenRecord(token=token, log_prob=jnp.where(active, log_prob, 0.0), valid=active, position=position)
    new_state = state._replace(tokens=tokens, length=length, generated=generated, done=done, logits=logits, cache=cache)
    return new_state, record


def run(
    model: Decoder, state: ARState, config: ARConfig, *, capture: bool = False
) -> tuple[ARState, TokenRecord | None]:
    """Run ``config.max_new_tokens`` steps as one fused ``lax.scan``.

    Args:
      model: the decoder.
      state: the requests' state (e.g. from ``init``).
      config: the sampling policy (static under ``jit``).
      capture: also return every step's record (static under ``jit``).

    Returns:
      ``(final state, records)``: with ``capture`` the ``TokenRecord`` of every step stacked, fields
      ``(S, B)`` with ``S = max_new_tokens``; otherwise ``None``.
    """

    def body(s, _):
        s, record = step(model, s, config)
        return s, (record if capture else None)

    state, records = jax.lax.scan(body, state, length=config.max_new_tokens)
    return state, records


def generated_mask(prompt_lengths: jax.Array, lengths: jax.Array, width: int) -> jax.Array:
    """The buffer slots that hold generated tokens: ``[prompt_length, length)`` of each row.

    Args:
      prompt_lengths: ``(B,)`` prompt lengths.
      lengths: ``(B,)`` filled lengths (``ARState.length``).
      width: the buffer width ``T``.

    Returns:
      ``(B, width)`` bool (EOS included, nothing after it).
    """
    t = jnp.arange(width)[None, :]
    return (t >= prompt_lengths[:, None]) & (t < lengths[:, None])


def scatter_steps(values: jax.Array, records: TokenRecord, width: int) -> jax.Array:
    """Place per-step values at the buffer slots their tokens went to.

    Args:
      values: per-step values ``(S, B)`` (e.g. ``records.log_prob``).
      records: the stacked ``TokenRecord`` of the same steps (fields ``(S, B)``).
      width: the buffer width ``T``.

    Returns:
      ``(B, width)`` in the dtype of ``values``: each valid step's value at its ``position``, zeros
      where no valid token was generated.
    """
    chex.assert_equal_shape([values, records.position, records.valid])
    b = values.shape[1]
    out = jnp.zeros((b, width), values.dtype)
    rows = jnp.broadcast_to(jnp.arange(b)[None, :], values.shape)
    return out.at[rows, records.position].add(jnp.where(records.valid, values, 0))


class Continuation(NamedTuple):
    """A finished, captured decode: what a trainer needs of an AR rollout.

    Attributes:
      tokens: ``(B, T)`` int32: prompt then generated tokens.
      prompt_length: ``(B,)`` int32 prompt lengths.
      length: ``(B,)`` int32 filled lengths.
      mask: ``(B, T)`` bool: the generated slots (EOS included).
      log_prob: ``(B, T)`` float32: the captured ``log π(y_t | prompt, y_<t)`` at each generated slot, 0
        elsewhere.
    """

    tokens: jax.Array
    prompt_length: jax.Array
    length: jax.Array
    mask: jax.Array
    log_prob: jax.Array


def continuation(final: ARState, records: TokenRecord) -> Continuation:
    """The ``Continuation`` of a captured ``run``.

    Args:
      final: the final state of ``run(..., capture=True)``.
      records: its stacked records (fields ``(S, B)``).

    Returns:
      The ``Continuation``, fields ``(B, ...)``.
    """
    width = final.tokens.shape[1]
    mask = generated_mask(final.prompt_length, final.length, width)
    return Continuation(
        final.tokens, final.prompt_length, final.length, mask, scatter_steps(records.log_prob, records, width)
    )


def sequence_log_probs(model: Decoder, tokens: jax.Array, prompt_lengths: jax.Array, gen_mask: jax.Array) -> jax.Array:
    """Recompute ``log π(tokens[t] | tokens[<t])`` with ONE uncached, teacher-forced causal forward.

    The forward attends to the prompt and the generated slots; the log-softmax is of the untempered
    logits, so at the rollout's weights this reproduces the captured ``TokenRecord.log_prob``.
    Differentiable in the model: what a trainer uses for ratios and the policy gradient.

    Args:
      model: the decoder.
      tokens: a right-padded buffer ``(B, T)`` (prompt then generated tokens, as ``ARState.tokens``).
      prompt_lengths: ``(B,)`` prompt lengths.
      gen_mask: ``(B, T)`` the generated slots to score (e.g. ``generated_mask``).

    Returns:
      ``(B, T)`` float32 log-probs, 0 outside ``gen_mask``.
    """
    chex.assert_rank(tokens, 2)
    b, width = tokens.shape
    chex.assert_shape(prompt_lengths, (b,))
    chex.assert_shape(gen_mask, (b, width))
    gen_mask = jnp.asarray(gen_mask, bool)
    valid = (jnp.arange(width)[None, :] < prompt_lengths[:, None]) | gen_mask
    logits = model(tokens, valid)
    log_probs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    scored = jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)[..., 0]
    scored = jnp.concatenate([jnp.zeros((b, 1), scored.dtype), scored], axis=1)
    return jnp.where(gen_mask, scored, 0.0)


def __getattr__(name: str):
    # The engine's driver builds on this module's loop, so it lives in its own module and is
    # reached here lazily (``ar.DRIVER`` / ``ar.Driver`` keep working).
    if name in ("Driver", "DRIVER"):
        from jaxpipe.loops import ar_driver

        return getattr(ar_driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
