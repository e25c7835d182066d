"""How the engine and the program drive ``ar_decode`` loops: check, step and batch them.

The loop itself (state, pure ``step``, fused ``run``) is ``jaxpipe.loops.ar``; this module is its
``LoopDriver`` (``jaxpipe.loops.registry``), also reachable as ``ar.DRIVER``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxpipe.loops.ar import ARConfig, ARState, Decoder, run, step
from jaxpipe.loops.unpadded import SameConfigBatching

__all__ = ["Driver", "DRIVER"]


def _one(models) -> Decoder:
    models = tuple(models) if isinstance(models, (tuple, list)) else (models,)
    if len(models) != 1:
        raise ValueError(f"an ar_decode loop drives one decoder (got {len(models)})")
    return models[0]


class Driver(SameConfigBatching):
    """Drives ``ar_decode`` loops over the one decoder the loop binds.

    A request takes ``max_new_tokens`` steps (a request that emits ``<eos>`` earlier is done and
    its remaining steps leave its tokens unchanged), so the engine retires it after exactly the
    steps ``run`` scans. Every row draws its tokens from its own key (``fold_in(key, i)``), so
    rows at different steps share a batch; configs batch together only when equal (``batch_key``
    is the whole ``ARConfig``: ``step`` reads ``max_new_tokens``, temperature and ``eos_id``).
    There is no per-row schedule (``schedule`` is an empty row); ``latents`` is the token
    buffer ``(B, max_len)`` (what a preview of this loop shows).
    """

    kind = "ar_decode"

    def check(self, loop) -> None:
        """Raise ``ValueError`` unless ``loop`` (a ``LoopSpec``) has an ``ARConfig`` and binds one decoder.

        Args:
          loop: the loop's ``LoopSpec``.
        """
        if not isinstance(loop.config, ARConfig):
            raise ValueError(f"an ar_decode loop's config must be an ARConfig (got {type(loop.config).__name__})")
        if len(loop.binds) != 1:
            raise ValueError(f"an ar_decode loop drives one decoder; it binds {list(loop.binds)}")

    def step(self, models, state: ARState, config: ARConfig) -> ARState:
        """One ``step`` of the one bound decoder, without its record.

        Args:
          models: the bound decoder, alone or in a one-element tuple.
          state: the batch's state.
          config: the batch's config.

        Returns:
          The new ``ARState``.
        """
        return step(_one(models), state, config)[0]

    def run(self, models, state: ARState, config: ARConfig, *, capture: bool = False):
        """``run`` of the one bound decoder: ``(final state, stacked TokenRecord or None)``.

        Args:
          models: the bound decoder, alone or in a one-element tuple.
          state: the batch's state.
          config: the batch's config.
          capture: return the stacked records.
        """
        return run(_one(models), state, config, capture=capture)

    def num_steps(self, config: ARConfig) -> int:
        """The steps a request takes: ``config.max_new_tokens``.

        Args:
          config: the request's config.
        """
        return config.max_new_tokens

    def deactivate(self, state: ARState, rows: jax.Array) -> ARState:
        """``state`` with ``rows`` ``(B,)`` bool marked done, so a step leaves them alone.

        Args:
          state: the batch's state.
          rows: ``(B,)`` bool, the rows to retire.
        """
        return state._replace(done=state.done | rows)

    def empty(self, state: ARState, capacity: int) -> ARState:
        """``capacity`` inert rows shaped like one row of ``state`` (``done``: a step leaves their tokens alone)."""
        rows = jax.tree.map(lambda a: jnp.zeros((capacity,) + a.shape[1:], a.dtype), state._replace(key=None))
        keys = jax.random.split(jax.random.key(0), capacity)  # never read: the rows are done
        return rows._replace(key=keys, done=jnp.ones((capacity,), bool))

    def latents(self, state: ARState) -> jax.Array:
        """What a preview shows of the batch: the token buffer ``(B, max_len)`` int32.

        Args:
          state: the batch's state.
        """
        return state.tokens


DRIVER = Driver()
