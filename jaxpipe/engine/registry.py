"""The engine's resident registry: cards, their roles and weight versions, and the workflows, as values.

A registry state (``Cards``) is a value: resident cards by id and each card's roles. Every change to it
is a value too (``Install``: a card registered or replaced, ``Update``: a checked publish, ``Remove``: an
unregister), whose ``apply(state)`` gives the next state and the feature-cache entries it retires. While
the engine has work in flight a change to a resident card is kept pending and applied between ticks,
once no scheduler has a started request of that card (``Registry.apply``); until then the card's new
requests wait (``held``). Registering a new id, a role or a workflow applies at once.

The scheduler reads a ``Registry`` only through its read-only part (``scheduler.Served``: ``serves``,
``workflow``, ``resident``, ``bind``, ``held``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from jaxpipe.cache import FeatureCache
from jaxpipe.card import Card
from jaxpipe.engine.errors import EngineError, UnknownComponentError
from jaxpipe.engine.publish import Publish, Resident, checked, stacked
from jaxpipe.program import Bound, Program
from jaxpipe.request import Request
from jaxpipe.workflow import Workflow, WorkflowRegistry

__all__ = ["Cards", "Change", "Install", "ROLE_SEP", "Registry", "Remove", "Update"]

ROLE_SEP = "@"
"""Separates a card's id from a role's name in the role's served id (``"flux-t2i@old"``)."""

Drops = tuple[tuple[str, Any], ...]
"""Feature-cache entries a change retires: ``(model id, components or None for all)`` pairs."""


@dataclasses.dataclass(frozen=True)
class Cards:
    """One registry state: resident card id -> ``Resident``, and card id -> {role name: the role's served id}."""

    residents: Mapping[str, Resident] = dataclasses.field(default_factory=dict)
    roles: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)


class Change(Protocol):
    """A change to the resident cards, as a value: applied to a state, it gives the next one."""

    model_id: str
    removes: bool

    def apply(self, state: Cards) -> tuple[Cards, Drops]:
        """The state after the change, and the feature-cache entries it retires."""

    def card_after(self, card: Card) -> Card:
        """The card as the change leaves it."""

    def versions_after(self, versions: dict[str, int]) -> dict[str, int]:
        """The card's versions as the change leaves them."""


def _without_roles(residents: dict, roles: dict, model_id: str) -> Drops:
    """Drop the roles of ``model_id`` from ``residents`` / ``roles`` (in place: the next state's copies)."""
    dropped = tuple(roles.pop(model_id, {}).values())
    for role_id in dropped:
        del residents[role_id]
    return tuple((role_id, None) for role_id in dropped)


@dataclasses.dataclass(frozen=True, eq=False)
class Install:
    """A card registered under its id (new, or replacing the resident one: every version moves, its roles go)."""

    card: Card
    program: Program
    experts: Mapping[str, tuple[str, ...]]
    removes = False

    @property
    def model_id(self) -> str:
        """The card's id."""
        return self.card.model_id

    def apply(self, state: Cards) -> tuple[Cards, Drops]:
        """The state with the card resident, and the entries it retires (a replaced card's, its roles')."""
        old = state.residents.get(self.model_id)
        names = [n for c in self.card.components for n in self.experts.get(c, (c,))]
        versions = {name: (old.versions.get(name, -1) + 1 if old else 0) for name in names}
        residents, roles, drops = dict(state.residents), dict(state.roles), ()
        if old is not None:
            drops = ((self.model_id, None), *_without_roles(residents, roles, self.model_id))
        residents[self.model_id] = Resident.of(self.card, self.program, versions, dict(self.experts))
        return Cards(residents, roles), drops

    def card_after(self, card: Card) -> Card:
        """The new card (whatever ``card`` was)."""
        return self.card

    def versions_after(self, versions: dict[str, int]) -> dict[str, int]:
        """Every one of ``versions`` one up."""
        return {n: v + 1 for n, v in versions.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class Update:
    """A checked publish (``publish.checked``) to the resident card ``model_id``."""

    model_id: str
    publish: Publish
    removes = False

    def apply(self, state: Cards) -> tuple[Cards, Drops]:
        """The state with the components swapped in (their versions up), and the entries it retires (theirs)."""
        resident = state.residents.get(self.model_id)
        if resident is None:  # gone with an earlier change (a role whose card was replaced)
            return state, ()
        card = self.publish.apply(resident.card)
        versions = self.versions_after(resident.versions)
        new = Resident.of(card, resident.program, versions, resident.experts, resident.base, resident.scope)
        return Cards({**state.residents, self.model_id: new}, state.roles), ((self.model_id, self.publish.touched),)

    def card_after(self, card: Card) -> Card:
        """``card`` with the publish applied."""
        return self.publish.apply(card)

    def versions_after(self, versions: dict[str, int]) -> dict[str, int]:
        """``versions`` with the published names' one up."""
        return {n: v + (n in self.publish.bumps) for n, v in versions.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class Remove:
    """The resident card ``model_id`` unregistered (with its roles; a role leaves its card's list)."""

    model_id: str
    removes = True

    def apply(self, state: Cards) -> tuple[Cards, Drops]:
        """The state without the card, and the entries it retires (the card's, its roles')."""
        if self.model_id not in state.residents:
            return state, ()
        residents, roles = dict(state.residents), dict(state.roles)
        resident = residents.pop(self.model_id)
        if resident.base is not None:
            roles[resident.base] = {r: i for r, i in roles[resident.base].items() if i != self.model_id}
        return Cards(residents, roles), ((self.model_id, None), *_without_roles(residents, roles, self.model_id))

    def card_after(self, card: Card) -> Card:
        """``card``: it stays until it leaves."""
        return card

    def versions_after(self, versions: dict[str, int]) -> dict[str, int]:
        """``versions``, unchanged."""
        return versions


class Registry:
    """Resident cards (a ``Cards`` state), workflows, and the changes pending until their card drains.

    Arguments:
      cache: the engine's feature cache (a change drops the entries it retires).

    The mutating methods take ``busy``: whether the engine has work in flight (then a change to a resident
    card is kept pending). The engine holds its lock around every call.
    """

    def __init__(self, cache: FeatureCache):
        self.cache = cache
        self._state = Cards()
        self.workflow_registry = WorkflowRegistry()
        self._pending: tuple[Change, ...] = ()

    @property
    def state(self) -> Cards:
        """The current state (a value: a change makes a new one)."""
        return self._state

    # ---- what the scheduler reads (``scheduler.Served``) ----------------------------------------

    def serves(self, model_id: str) -> bool:
        """Whether ``model_id`` names a registered card or workflow.

        Args:
          model_id: an id.
        """
        return model_id in self.state.residents or model_id in self.workflow_registry

    def workflow(self, model_id: str) -> Workflow | None:
        """The workflow ``model_id``, or ``None`` when it is none.

        Args:
          model_id: an id.
        """
        return self.workflow_registry[model_id] if model_id in self.workflow_registry else None

    def resident(self, model_id: str) -> Resident:
        """The resident card ``model_id``.

        Args:
          model_id: a card id.

        Raises:
          EngineError: for an id not served, or a workflow's.
        """
        self.lookup(model_id)
        if model_id not in self.state.residents:
            raise EngineError(f"{model_id!r} is a workflow, not a card")
        return self.state.residents[model_id]

    def bind(self, request: Request) -> Bound | None:
        """``request`` validated (a clear error) and bound to its card's program; ``None`` for a workflow
        request (checked by the workflow's own ``check``).

        Args:
          request: the request.
        """
        if not isinstance(request, Request):
            raise TypeError(f"expected a jaxpipe Request (got {type(request).__name__})")
        self.lookup(request.model)
        workflow = self.workflow(request.model)
        if workflow is not None:
            if workflow.check is not None:
                workflow.check(request)
            return None
        resident = self.state.residents[request.model]
        return resident.program.bind(resident.card, request)

    def held(self) -> frozenset[str]:
        """Cards with a pending change: their requests must not start yet."""
        return frozenset(change.model_id for change in self._pending)

    # ---- reading ------------------------------------------------------------------------------

    def lookup(self, model_id: str) -> None:
        """Raise ``EngineError`` (listing what is served) unless ``model_id`` is served.

        Args:
          model_id: an id.
        """
        if not self.serves(model_id):
            raise EngineError(f"unknown model {model_id!r}; this engine serves {self.models()}")

    def leaving(self) -> set[str]:
        """Cards whose unregistering waits for them to drain."""
        return {change.model_id for change in self._pending if change.removes}

    def models(self) -> list[str]:
        """Every served id, cards and workflows, sorted (a card being unregistered left out)."""
        leaving = self.leaving()
        return sorted(m for m in [*self.state.residents, *self.workflow_registry.ids()] if m not in leaving)

    def roles(self, model_id: str) -> dict[str, tuple[str, ...]]:
        """Role name -> the components it tracks, of resident card ``model_id``.

        Args:
          model_id: a card id.
        """
        self.resident(model_id)
        residents = self.state.residents
        return {role: residents[rid].scope for role, rid in self.state.roles.get(model_id, {}).items()}

    def card(self, model_id: str, pending: bool = False) -> Card:
        """The resident card (``pending``: as it will be after its pending changes).

        Args:
          model_id: a card id.
          pending: apply the pending changes.
        """
        card = self.resident(model_id).card
        for change in self._pending if pending else ():
            if change.model_id == model_id:
                card = change.card_after(card)
        return card

    def projected(self, model_id: str) -> dict[str, int]:
        """The card's versions once its pending changes apply.

        Args:
          model_id: a card id.
        """
        versions = dict(self.state.residents[model_id].versions)
        for change in self._pending:
            if change.model_id == model_id:
                versions = change.versions_after(versions)
        return versions

    def pending(self) -> dict[str, dict[str, int]]:
        """Card id -> its versions once its pending publishes (and replacements) apply; a card whose last
        pending change removes it is left out."""
        last = {change.model_id: change for change in self._pending}
        return {m: self.projected(m) for m, change in last.items() if not change.removes}

    # ---- changing -----------------------------------------------------------------------------

    def register(self, card: Card, program: Program | None, model_id: str | None, replace: bool, busy: bool) -> None:
        """``Engine.register``: check, then install (a replacement while ``busy``: pending).

        Args:
          card: the card.
          program: its program (``None``: its family's).
          model_id: the id to serve it under (``None``: its own).
          replace: allow replacing a resident card.
          busy: whether work is in flight.
        """
        if not isinstance(card, Card):
            raise TypeError(f"register takes a Card (got {type(card).__name__})")
        if model_id is not None:
            card = card.with_id(model_id)
        model_id = card.model_id
        if model_id in self.workflow_registry:
            raise EngineError(f"card id {model_id!r} collides with a registered workflow of the same id")
        if model_id in self.state.residents and not replace:
            raise EngineError(f"card {model_id!r} is already registered (pass replace=True to replace it)")
        program = _default_program(card) if program is None else program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a Program (got {type(program).__name__})")
        program.check(card)
        old = self.state.residents.get(model_id)
        if old is not None and old.base is not None:
            raise EngineError(f"{model_id!r} is a role of {old.base!r}: publish to it, or remove it with unregister")
        self._change(Install(card, program, stacked(card)), busy=old is not None and busy)

    def add_role(self, model_id: str, role: str, components: str | Sequence[str]) -> str:
        """``Engine.add_role``: the role's served id.

        Args:
          model_id: the card.
          role: the role's name.
          components: the components it tracks.
        """
        base = self.resident(model_id)
        if base.base is not None:
            raise EngineError(f"{model_id!r} is itself a role of {base.base!r}; add the role to {base.base!r}")
        if not isinstance(role, str) or not role or ROLE_SEP in role:
            raise ValueError(f"a role is a non-empty name without {ROLE_SEP!r} (got {role!r})")
        names = (components,) if isinstance(components, str) else tuple(components)
        unknown = sorted(str(n) for n in names if n not in base.card.components)
        if not names or unknown:
            raise UnknownComponentError(
                f"add_role: card {model_id!r} has no component(s) {unknown or '(none given)'}; it has {sorted(base.card.components)}"
            )
        role_id = f"{model_id}{ROLE_SEP}{role}"
        if self.serves(role_id):
            raise EngineError(f"{role_id!r} is already served (remove it with unregister first)")
        scope = tuple(dict.fromkeys(names))
        owned = {n for c in scope for n in base.experts.get(c, (c,))}
        versions = {n: 0 if n in owned else v for n, v in base.versions.items()}
        resident = Resident.of(base.card.with_id(role_id), base.program, versions, base.experts, model_id, scope)
        roles = {**self.state.roles, model_id: {**self.state.roles.get(model_id, {}), role: role_id}}
        self._state = Cards({**self._state.residents, role_id: resident}, roles)
        return role_id

    def register_workflow(self, workflow: Workflow, replace: bool) -> None:
        """``Engine.register_workflow``.

        Args:
          workflow: the workflow.
          replace: allow replacing one of the same id.
        """
        self.workflow_registry.add(workflow, self.state.residents, replace=replace)

    def unregister(self, model_id: str, busy: bool) -> None:
        """``Engine.unregister`` (a card while ``busy``: pending).

        Args:
          model_id: a served id.
          busy: whether work is in flight.
        """
        self.lookup(model_id)
        if model_id in self.leaving():
            return
        ids = (model_id, *self.state.roles.get(model_id, {}).values())
        users = [u for m in ids for u in self.workflow_registry.dependents(m)]
        if users:
            raise EngineError(f"cannot unregister {model_id!r}: workflows {users} require it")
        if model_id in self.state.residents:
            self._change(Remove(model_id), busy)
        else:
            self.workflow_registry.remove(model_id)

    def publish(self, model_id: str, components: Mapping[str, Any], busy: bool) -> dict[str, int]:
        """``Engine.publish``: the card's versions after it (projected while ``busy``).

        Args:
          model_id: a card (or role) id.
          components: name -> module.
          busy: whether work is in flight.
        """
        resident = self.resident(model_id)
        update = checked(resident, components)
        if resident.base is not None:
            outside = sorted(set(update.bumps) - resident.scoped(update.bumps))
            if outside:
                raise EngineError(
                    f"publish: {outside} are outside role {model_id!r}'s scope {list(resident.scope)}; "
                    f"publish them to {resident.base!r} (its roles follow)"
                )
        changes = [Update(model_id, update)] if update.bumps else []
        for role_id in self.state.roles.get(model_id, {}).values():
            role = self.state.residents[role_id]
            mirrored = {n: m for n, m in components.items() if not role.scoped((n,))}
            if mirrored:
                changes.append(Update(role_id, checked(role, mirrored)))
        for change in changes:
            self._change(change, busy)
        return self.projected(model_id) if busy else dict(self.state.residents[model_id].versions)

    def apply(self, drained: Callable[[str], bool]) -> None:
        """Apply the pending changes, in order, of every card ``drained`` says has no started request.

        Args:
          drained: card id -> whether no scheduler has a started, unfinished request of it.
        """
        keep: list[Change] = []
        for change in self._pending:
            if not drained(change.model_id) or any(k.model_id == change.model_id for k in keep):
                keep.append(change)
            else:
                self._commit(change)
        self._pending = tuple(keep)

    def _change(self, change: Change, busy: bool) -> None:
        if busy:
            self._pending = (*self._pending, change)
        else:
            self._commit(change)

    def _commit(self, change: Change) -> None:
        self._state, drops = change.apply(self._state)
        for model_id, components in drops:
            self.cache.invalidate(model_id, components)


def _default_program(card: Card) -> Program:
    from jaxpipe.cards.registry import default_program  # the engine sits above the cards

    return default_program(card)
