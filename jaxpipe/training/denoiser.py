"""What every method that trains a card's denoiser sets up: the program, its denoise loop, the trained experts.

``FlowGRPO`` and ``DiffusionNFT`` render a card through its own program and train the denoiser(s)
its one denoise loop binds (``rollout.denoise_loop``), as the part ``"generator"``; ``DenoiserMethod``
writes that setup once. A subclass may train fewer experts than the loop binds (FlowGRPO trains only
the experts its SDE window reaches: ``trained_denoisers``). With ``config.lora`` the trained denoisers
get fresh LoRA adapters (``jaxpipe.nn.lora.apply``) and only those train (``Parts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.nn import lora
from jaxpipe.program import Program
from jaxpipe.rewards import Reward
from jaxpipe.training import ema as eval_ema
from jaxpipe.training import rollout
from jaxpipe.training.parts import Parts, copy
from jaxpipe.training.trainer import RolloutMethod, TrainState

__all__ = ["GENERATOR", "DenoiserMethod", "adapted"]

GENERATOR = "generator"
"""The trained part: the denoiser(s) of the card's denoise loop."""


def adapted(card: Card, names: Sequence[str], config: lora.LoRAConfig | None) -> Card:
    """``card`` with fresh LoRA adapters on its components ``names`` (``config``), or ``card`` itself for ``None``.

    Args:
      card: the card to train.
      names: the components that train (its denoisers).
      config: the adapters' settings, or ``None`` (train the components whole).

    Returns:
      The card whose ``names`` components carry adapters (``Parts`` then trains the adapters only).

    Raises:
      ValueError: as ``lora.apply`` (no layer matches the targets, the component already has adapters).
    """
    if config is None:
        return card
    components = {}
    for name in names:
        try:
            components[name] = lora.apply(card[name], config)
        except ValueError as err:
            raise ValueError(f"card {card.model_id!r}, component {name!r}: {err}") from None
    return card.replace(**components)


class DenoiserMethod(RolloutMethod):
    """A ``RolloutMethod`` on the denoiser(s) of one denoise loop of ``card``'s program (default: its family's).

    ``_setup`` sets ``config``, ``spec``, ``reward``, ``program``, ``loop``, ``denoisers`` (every denoiser
    the loop binds), ``sampling`` (``config.sampling`` on the loop's own settings), the part
    ``"generator"`` (``trained_denoisers()``, float32 master weights; with ``config.lora``, their adapters
    only: ``adapted``) and its optimiser ``tx``. With ``config.eval_ema`` (``training.eval_ema``) the fused
    ``step`` also keeps an average of the trained weights, the copy and role ``"ema"`` (``eval_card``).
    """

    def _setup(self, card: Card, reward: Reward, config: Any, program: Program | None) -> None:
        self.config = config
        self.spec = card.spec
        self.reward = reward
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        self.loop = rollout.denoise_loop(card, self.program)
        self.denoisers = self.loop.binds
        self.sampling = config.sampling.on(self.loop.config)
        trained = self.trained_denoisers()
        self.parts = Parts(adapted(card, trained, config.lora), {GENERATOR: trained}, master=True)
        self.optimizers = {GENERATOR: config.optimizer.make()}
        self.tx = self.optimizers[GENERATOR]
        self.eval_ema = getattr(config, "eval_ema", None)
        self.roles = {eval_ema.ROLE: trained} if self.eval_ema is not None else {}

    def init(self, key: jax.Array | None = None) -> TrainState:
        """As ``Method.init``, plus the evaluation average (the starting weights) when ``eval_ema`` is set."""
        state = super().init(key)
        if self.eval_ema is None:
            return state
        return state._replace(copies={**state.copies, eval_ema.ROLE: copy(state.params[GENERATOR])})

    def step_fn(
        self, state: TrainState, batch: Any, key: jax.Array, reward_weights: Any = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """The rollout and its updates, then (with ``eval_ema``) the evaluation average follows the new weights."""
        new, metrics = super().step_fn(state, batch, key, reward_weights)
        if self.eval_ema is None:
            return new, metrics
        ema = eval_ema.follow(self.eval_ema, state.copies[eval_ema.ROLE], new.params[GENERATOR], state.step)
        return new._replace(copies={**new.copies, eval_ema.ROLE: ema}), metrics

    def eval_card(self, state: TrainState) -> Card:
        """The card to evaluate: the evaluation average's weights with ``eval_ema``, else the trained ones."""
        return self.card(state) if self.eval_ema is None else self.role_card(state, eval_ema.ROLE)

    def trained_denoisers(self) -> tuple[str, ...]:
        """The bound denoisers this method trains (default: all of them)."""
        return tuple(self.denoisers)

    @property
    def transformer(self) -> str:
        """The (first) denoiser component that trains."""
        return self.parts.trained[GENERATOR][0]

    def models_of(self, frozen: nnx.State) -> Callable[[nnx.State], tuple]:
        """``params -> the loop's bound denoisers`` under ``frozen`` (the untrained experts among them)."""
        return lambda params: self.parts.models({GENERATOR: params}, frozen, self.denoisers)
