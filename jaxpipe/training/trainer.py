"""The one shape every training method has: the ``Trainer`` protocol, its ``TrainState`` and the base class.

A trainer is ``init(key) -> state``, a jitted ``step(state, batch, key) -> (state, metrics)``,
``card(state) -> Card`` (the trained card, ready to serve), ``roles`` (the other weight copies it
keeps that can be served beside the card — role name -> components; empty by default) and
``role_card(state, role)``. ``jaxpipe.training.fit`` runs any trainer; ``weight_sync.sync``
publishes any trainer's card and roles into an engine.

Every state is a ``TrainState``: the trained parts' parameters and optimiser states (by part:
``"generator"``, ``"refiners"``, ``"student"``, ``"critic"``, ``"model"`` ...), the card's frozen
parameters, the copies the method keeps (``"reference"``, the ``"old"`` policy, the ``"teacher"``)
and the step count. ``Method`` writes the protocol's plumbing once: the split of the card into
parts (``jaxpipe.training.parts``), the optimisers, ``init``, ``card``, ``role_card`` and the
jitted ``step`` with its batch check; a method adds its ``step_fn``.

LoRA (``jaxpipe.nn.lora``; the denoiser methods' ``lora`` setting): a trained component with adapters
trains the adapters alone (``Parts``: its base weights are frozen, its optimiser state adapter-sized).
Rollouts and updates run the unmerged network (``rollout_card``, ``components``), so C2 holds exactly;
``card`` and ``role_card`` fold the adapters into the base weights (``merged``): the trained card has the
modules and parameter paths of the card it was trained from, so it serves, publishes and saves like it.
To keep the adapters themselves, ``lora.save_adapters(method.components(state.params, state.frozen)[name], dir)``.

A method with a reward that holds weights (a reward model: ``jaxpipe.rewards.weighted``) passes them to its
jitted step, rollout and update as an argument (``reward_weights``), so they are not baked into the compiled
program as constants; ``step_fn(state, batch, key, reward_weights)`` takes them the same way.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import optax

from jaxpipe import prompts
from jaxpipe.card import Card, CardSpec
from jaxpipe.nn import lora
from jaxpipe.rewards import weighted
from jaxpipe.training.parts import Parts, copy

__all__ = ["Trainer", "TrainState", "Method", "RolloutMethod", "SHARED_TRAINERS", "UPDATE_KEY", "merged"]

SHARED_TRAINERS = 16
"""How many trainers' jitted functions a process keeps for their twins (least recently built dropped first)."""

_TWINS: collections.OrderedDict[Hashable, Method] = collections.OrderedDict()


def _share_key(cls: type, made_from: tuple) -> Hashable | None:
    """The key twins share, or ``None`` (nothing shared) when an argument cannot be hashed (an array)."""
    key = (cls, made_from)
    try:
        hash(key)
    except TypeError:
        return None
    return key


UPDATE_KEY = 1_000_003
"""``fold_in(step key, UPDATE_KEY)`` keys a step's updates (its rollout uses the step key itself)."""


class TrainState(NamedTuple):
    """What a trainer carries from step to step (a pytree).

    Attributes:
      params: trained part -> its parameters (``nnx.State`` keyed by component).
      opt_state: trained part -> its optimiser state.
      frozen: the card's parameters no part trains.
      copies: name -> a copy of some parameters the method keeps: frozen references, an EMA, a teacher.
      step: steps taken so far (int32 scalar).
    """

    params: dict[str, Any]
    opt_state: dict[str, Any]
    frozen: Any
    copies: dict[str, Any]
    step: jax.Array


@runtime_checkable
class Trainer(Protocol):
    """Every jaxpipe training method (``FlowGRPO``, ``UnifiedRL``, ``JointMultiExpertRL``, ``SharedMoTRL``,
    ``DiffusionNFT``, ``DMD2``, ``SelfForcing``, ``Finetune`` ...)."""

    roles: Mapping[str, tuple[str, ...]]

    def init(self, key: jax.Array) -> Any:
        """The starting state."""

    def step(self, state: Any, batch: Any, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
        """One jitted training step: ``(new state, metrics)``."""

    def card(self, state: Any) -> Card:
        """The trained card of ``state``."""

    def role_card(self, state: Any, role: str) -> Card:
        """The card with role ``role``'s weights."""


def merged(components: Mapping[str, Any]) -> dict:
    """``components`` with each one's LoRA adapters folded into its base weights (``lora.merge``), the rest as they are.

    A trained card is served, published and saved like the card it was trained from: the same modules
    and parameter paths, whether its denoiser trained whole or through adapters.

    Args:
      components: name -> module.

    Returns:
      Name -> module, without adapters.
    """
    return {name: lora.merge(m) if lora.has_adapters(m) else m for name, m in components.items()}


class Method:
    """The base of jaxpipe's trainers: a card split into trained ``parts``, one optimiser per part.

    A subclass sets up ``self.parts`` (``Parts``), ``self.optimizers`` (part -> optax transformation)
    and ``self.spec`` (the trained card's spec), optionally ``copies(params)`` (the copies ``init``
    makes) and ``roles`` / ``role_params``, then calls ``self._jit(*constructor arguments)``; it writes ``step_fn(state,
    batch, key)`` (pure, unjitted) and may extend ``check_batch``.
    """

    parts: Parts
    optimizers: dict[str, optax.GradientTransformation]
    spec: CardSpec
    reward: Any = None
    roles: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    stacked: tuple[str, ...] = ()
    """Parts whose parameters carry a leading expert axis: their optimiser states are ``vmap``-initialised."""

    jitted: tuple[str, ...] = ("_step",)
    """The attributes ``_jit`` sets: the jitted functions a trainer shares with its twins."""

    def _jit(self, *made_from: Any) -> None:
        """Set ``jitted`` (the jitted ``step_fn``, and a ``RolloutMethod``'s ``rollout`` / ``update``).

        A trainer of the same class built in this process from the same ``made_from`` (the constructor's
        arguments: configs equal by value, cards, rewards and programs the same objects) shares the jitted
        functions of the first such trainer (kept for ``SHARED_TRAINERS`` trainers): it traces and compiles nothing new, as in a sweep
        over seeds. Construction is deterministic in its arguments, so the twin computes the same step.
        """
        key = _share_key(type(self), made_from)
        twin = _TWINS.get(key) if key is not None else None
        if twin is None:
            self._make_jits()
            if key is not None:
                _TWINS[key] = self
                while len(_TWINS) > SHARED_TRAINERS:
                    _TWINS.popitem(last=False)
        else:
            _TWINS.move_to_end(key)
            for name in self.jitted:
                setattr(self, name, getattr(twin, name))

    def _make_jits(self) -> None:
        self._step = jax.jit(self.step_fn)

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The copies ``init`` keeps besides the trained parameters (default: none)."""
        del params
        return {}

    def init(self, key: jax.Array | None = None) -> TrainState:
        """The card's weights, fresh optimiser states and the method's copies (``key`` is unused: nothing random)."""
        del key
        params = copy(self.parts.params)
        opt_state = {
            part: (jax.vmap(tx.init) if part in self.stacked else tx.init)(params[part])
            for part, tx in self.optimizers.items()
        }
        return TrainState(
            params, opt_state, copy(self.parts.frozen), copy(self.copies(self.parts.params)), jnp.zeros((), jnp.int32)
        )

    def components(self, params: Mapping[str, Any], frozen: Any) -> dict:
        """The card's modules from trained ``params`` (part -> state) and ``frozen``."""
        return self.parts.components(params, frozen)

    def card(self, state: TrainState) -> Card:
        """The card with the state's trained weights, LoRA adapters merged into their base weights (``merged``)."""
        return Card(merged(self.components(state.params, state.frozen)), self.spec)

    def rollout_card(self, params: Mapping[str, Any], frozen: Any) -> Card:
        """The card at trained ``params`` (part -> state) and ``frozen``, with no gradient to them: what a
        rollout renders."""
        return Card(self.components(jax.lax.stop_gradient(params), frozen), self.spec)

    def role_params(self, state: TrainState, role: str) -> dict[str, Any]:
        """The parameters role ``role`` serves, by trained part (default: the copy named ``role`` in place of
        the part that trains the same components)."""
        kept = state.copies[role]
        for part, names in self.parts.trained.items():
            if set(kept) == set(names):
                return {part: kept}
        raise KeyError(f"role {role!r} holds components {sorted(kept)}, which no trained part owns")

    def role_model_id(self, role: str) -> str:
        """The model id of the card role ``role`` is served as a role of (``weight_sync.track``): the id of
        ``role_card``'s card, by default the trained card's own."""
        return self.spec.model_id

    def role_card(self, state: TrainState, role: str) -> Card:
        """The card with role ``role``'s weights in place of the trained ones (``roles`` lists the roles)."""
        if role not in self.roles:
            raise KeyError(f"{type(self).__name__} keeps no role {role!r}; its roles: {sorted(self.roles) or 'none'}")
        params = {**state.params, **self.role_params(state, role)}
        return Card(merged(self.components(params, state.frozen)), self.spec)

    def step_fn(self, state: TrainState, batch: Any, key: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        """The pure, unjitted step (for custom ``jit`` or sharding)."""
        raise NotImplementedError

    @property
    def reward_weights(self) -> Any:
        """The reward's weights, passed to the jitted functions as an argument (``None``: it holds none)."""
        return weighted.weights_of(self.reward)

    def reward_at(self, reward_weights: Any) -> Any:
        """The reward computing with ``reward_weights`` (the traced argument), or as it is when ``None``."""
        return weighted.bind(self.reward, reward_weights)

    def _with_reward(self, *arguments: Any) -> tuple:
        """``arguments``, then the reward's weights when it holds some (the jitted functions' extra argument)."""
        weights = self.reward_weights
        return arguments if weights is None else (*arguments, weights)

    def check_batch(self, batch: Any) -> None:
        """A clear error for a batch this method cannot train on (called before the jitted step): by
        default a ``jaxpipe.prompts.Prompts`` of well-formed arrays."""
        prompts.check(batch)

    def step(self, state: TrainState, batch: Any, key: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
        """``step_fn`` as ONE jitted function, after ``check_batch``: ``(state, metrics)``."""
        self.check_batch(batch)
        return self._step(*self._with_reward(state, batch, key))


class RolloutMethod(Method):
    """A method whose step renders a rollout, then updates on it: ``rollout`` and ``update`` are jitted on
    their own too (so C2, recomputed log-probs == captured, can be checked between them).

    A subclass writes ``_rollout(state, batch, key)`` (with ``reward_weights=None`` last when it scores with
    ``self.reward``: ``reward_at(reward_weights)`` is the reward to call), ``_update(state, rollout, key)`` and
    ``rollout_metrics(rollout)``; ``step_fn`` runs the three, the update keyed ``fold_in(key, UPDATE_KEY)``.
    """

    jitted = ("_step", "_rollout_jit", "update")

    def _make_jits(self) -> None:
        super()._make_jits()
        self._rollout_jit = jax.jit(self._rollout)
        self.update = jax.jit(self._update)

    def rollout(self, state: TrainState, batch: Any, key: jax.Array) -> Any:
        """``_rollout`` jitted: the batch rendered and scored (the reward's weights passed as an argument)."""
        return self._rollout_jit(*self._with_reward(state, batch, key))

    def rollout_metrics(self, rollout: Any) -> dict[str, jax.Array]:
        """Metrics of the rollout itself (its rewards); none by default."""
        del rollout
        return {}

    def step_fn(
        self, state: TrainState, batch: Any, key: jax.Array, reward_weights: Any = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """The pure, unjitted step (rollout + its updates), for custom ``jit`` or sharding; ``reward_weights``:
        the reward's weights (``reward_weights`` property) as an argument, ``None`` to use the reward's own."""
        ro = (
            self._rollout(state, batch, key)
            if reward_weights is None
            else self._rollout(state, batch, key, reward_weights)
        )
        state, metrics = self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))
        return state, {**metrics, **self.rollout_metrics(ro)}
