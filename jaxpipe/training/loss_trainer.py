"""``LossTrainer``: one loss, one optimiser, one guarded step — what every pretraining recipe runs.

``LossTrainer(model, loss, optimizer)`` (the trainer once named ``Supervised``) trains the parameters of ``model`` (a Flax NNX module or a
mapping of modules) on ``loss(model, batch, key) -> (scalar, metrics)``: ``init(key)``, a jitted
``step(state, batch, key) -> (state, metrics)`` (the state is donated: it is updated in place) and
``model(state)``. ``Finetune``, the autoencoder trainer and the digits world's LM, MoT, causal,
upsampler and scorer recipes are each a loss handed to it. A non-finite loss or gradient skips the
step (``jaxpipe.training.update``): ``metrics["skipped"] == 1`` and the weights stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.training import update
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.parts import copy
from jaxpipe.training.trainer import TrainState

__all__ = ["LossTrainer", "PART", "Loss"]

PART = "model"
"""The one trained part of a ``LossTrainer`` state: ``state.params["model"]``."""

Loss = Callable[[Any, Any, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]
"""A trainer's loss ``loss(model, batch, key) -> (scalar, metrics)``."""


class LossTrainer:
    """Train ``model``'s parameters on ``loss(model, batch, key) -> (loss, metrics)`` with ``optimizer``.

    Args:
      model: the module, or a mapping of named modules, whose parameters (``nnx.Param``) train; its other
        variables stay.
      loss: pure and differentiable in the model it is given (built from the state's parameters).
      optimizer: an ``Optimizer`` config or an optax transformation.
      frozen: names (in a mapping ``model``) of modules whose parameters do not train: they ride in
        ``state.frozen`` (arguments of the step, not constants compiled into it).

    Raises:
      ValueError: if ``frozen`` names a module the model has not.
    """

    roles = {}

    def __init__(
        self,
        model: Any,
        loss: Loss,
        optimizer: Optimizer | optax.GradientTransformation,
        *,
        frozen: tuple[str, ...] = (),
    ):
        self._graphdef, params, self._rest = nnx.split(model, nnx.Param, ...)
        unknown = sorted(set(frozen) - set(params)) if frozen else []
        if unknown:
            raise ValueError(f"frozen names {unknown}, which the model has not (it has {sorted(params)})")
        self._params = nnx.State({k: params[k] for k in params if k not in frozen}) if frozen else params
        self._frozen = nnx.State({k: params[k] for k in params if k in frozen}) if frozen else None
        self.loss_fn = loss
        self.tx = optimizer.make() if isinstance(optimizer, Optimizer) else optimizer
        self.step = jax.jit(self.step_fn, donate_argnums=0)

    def init(self, key: jax.Array | None = None) -> TrainState:
        """The model's weights and a fresh optimiser state (``key`` is unused: nothing random)."""
        del key
        params, frozen = copy((self._params, self._frozen))  # the step donates its state: it must not own the model's
        return TrainState({PART: params}, {PART: self.tx.init(params)}, frozen, {}, jnp.zeros((), jnp.int32))

    def model(self, state: TrainState) -> Any:
        """The module(s) with the state's weights."""
        return self._merge(state.params[PART], state.frozen)

    def _merge(self, params: nnx.State, frozen: nnx.State | None) -> Any:
        return nnx.merge(self._graphdef, params if frozen is None else nnx.State({**params, **frozen}), self._rest)

    def loss(self, params: nnx.State, frozen: nnx.State | None, batch: Any, key: jax.Array) -> tuple[jax.Array, dict]:
        """``loss`` of the model with ``params`` (and ``frozen``); pure, differentiable in ``params``."""
        return self.loss_fn(self._merge(params, frozen), batch, key)

    def check_batch(self, batch: Any) -> None:
        """Nothing to check before the step (its loss reads the batch)."""

    def step_fn(self, state: TrainState, batch: Any, key: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        """One guarded optimiser step (pure, unjitted): ``(state, metrics + grad_norm + skipped)``."""
        out = update.step(self.loss, self.tx, state.params[PART], state.opt_state[PART], state.frozen, batch, key)
        new = state._replace(params={PART: out.params}, opt_state={PART: out.opt_state}, step=state.step + 1)
        return new, {**out.aux, "grad_norm": out.grad_norm, "skipped": update.skipped(out.finite)}
