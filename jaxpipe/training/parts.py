"""A card split for training: the components each trained part owns, the frozen rest, and the way back to a card.

Every trainer splits its card once (``nnx.split`` into the graph, the parameters and the other
variables), keeps the parameters of each trained part apart — ``{"generator": {"transformer": ...}}``,
``{"refiners": ...}``, ``{"student": ..., "critic": ...}`` — and merges them back with the frozen
parameters whenever a network is needed inside its jitted step, or when ``card(state)`` returns
the trained card.

A trained component with LoRA adapters (``jaxpipe.nn.lora``) trains its adapters only: its part holds
its ``LoRAParam`` leaves, and its base weights join the frozen state, under the same component key;
``components`` merges the nested states back (``nnx.merge`` of several states).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.card import Card, CardSpec
from jaxpipe.nn import lora

__all__ = ["Parts", "master_weights", "copy"]


def master_weights(params: nnx.State) -> nnx.State:
    """``params`` with every floating leaf in float32: what an optimiser updates whatever the compute dtype.

    A bfloat16-stored card trains float32 copies; each forward casts them back down.

    Args:
      params: a parameter state (any pytree of arrays).

    Returns:
      The same tree, floating leaves cast to float32, other leaves as they are.
    """
    return jax.tree.map(lambda a: a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a, params)


def copy(tree: Any) -> Any:
    """A copy of every array of ``tree`` (a state a jitted step may donate must not alias the card's own arrays).

    Args:
      tree: a pytree of arrays.

    Returns:
      The same tree with every leaf a fresh ``jnp.array`` copy.
    """
    return jax.tree.map(jnp.array, tree)


class Parts:
    """``card``'s components split into trained parts and the frozen rest.

    ``components(params, frozen)`` merges them back into modules.

    Args:
      card: the card to train.
      trained: part name -> the components it owns (disjoint; every one the card's), in order.
      master: keep the trained parameters in float32 (``master_weights``) whatever the card stores.

    Attributes:
      spec: the card's spec.
      trained: part name -> its components (tuples).
      params: part name -> its parameters (``nnx.State`` keyed by component): of a component with LoRA
        adapters, the adapters (``lora.LoRAParam``) alone.
      frozen: the parameters (``nnx.Param``) of every other component, and the base weights of adapted ones.

    Raises:
      ValueError: if ``trained`` names a component the card lacks, or one component twice.
    """

    def __init__(self, card: Card, trained: Mapping[str, Sequence[str]], *, master: bool = False):
        owned = [name for names in trained.values() for name in names]
        missing = sorted(set(owned) - set(card.components))
        if missing:
            raise ValueError(
                f"trainable names component(s) {missing} that card {card.model_id!r} lacks: {sorted(card.components)}"
            )
        if len(set(owned)) != len(owned):
            raise ValueError(f"a component may be trained by one part only (got {dict(trained)})")
        self.spec: CardSpec = card.spec
        self.trained = {part: tuple(names) for part, names in trained.items()}
        self.graphdef, params, self.rest = nnx.split(card.components, nnx.Param, ...)
        frozen = {k: params[k] for k in params if k not in owned}
        self.params = {}
        for part, names in self.trained.items():
            own = {}
            for k in (k for k in params if k in names):
                if lora.has_adapters(card[k]):
                    own[k], frozen[k] = nnx.split_state(params[k], lora.LoRAParam, ...)
                else:
                    own[k] = params[k]
            self.params[part] = (master_weights if master else (lambda s: s))(nnx.State(own))
        self.frozen = nnx.State(frozen)

    def components(self, params: Mapping[str, nnx.State], frozen: nnx.State) -> dict:
        """The card's components (modules, name -> module) from the parts' ``params`` and ``frozen``."""
        return nnx.merge(self.graphdef, *params.values(), frozen, self.rest)

    def card(self, params: Mapping[str, nnx.State], frozen: nnx.State, spec: CardSpec | None = None) -> Card:
        """The card with the parts' ``params`` (and ``spec``, default the card's own)."""
        return Card(self.components(params, frozen), self.spec if spec is None else spec)

    def models(self, params: Mapping[str, nnx.State], frozen: nnx.State, names: Sequence[str]) -> tuple:
        """The modules ``names`` (e.g. the denoisers a loop binds) of ``components(params, frozen)``."""
        components = self.components(params, frozen)
        return tuple(components[name] for name in names)
