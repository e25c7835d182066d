"""Resident cards and their weights: per-component (and per-expert) versions, and publish.

A ``Resident`` is a served card with its program, its flat leaves and its weight versions. A
publish is checked against the resident layout first (``checked``: names, tree structure, leaf
shapes and dtypes, static settings; an expert of a stacked component against one slice), so a
bad publish raises ``EngineError`` before anything changes; ``Publish.apply`` then swaps the
components in (writing expert slices into their stacked component).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.engine.errors import EngineError, UnknownComponentError
from jaxpipe.program import Program

__all__ = ["Resident", "Publish", "checked", "stacked"]


@dataclasses.dataclass(eq=False)
class Resident:
    """A served card: its program, its flat leaves, and its weight versions.

    Attributes:
      card: the card.
      program: the program it is served with.
      treedef: the card's pytree structure.
      leaves: the card's flat leaves (what the jitted batch operations take).
      versions: weight version by versioned name: a component's name, or, for a component in
        ``experts``, each expert's name.
      experts: stacked component -> its expert names.
      base: for a role (``Engine.add_role``), the card it is a role of.
      scope: for a role, the components it tracks on its own.
    """

    card: Card
    program: Program
    treedef: Any
    leaves: list
    versions: dict[str, int]
    experts: dict[str, tuple[str, ...]]
    base: str | None = None
    scope: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        card: Card,
        program: Program,
        versions: dict[str, int],
        experts: dict[str, tuple[str, ...]],
        base: str | None = None,
        scope: tuple[str, ...] = (),
    ) -> Resident:
        """A resident card; ``base`` / ``scope``: for a role (``Engine.add_role``), the card it is a
        role of and the components it tracks on its own.

        Args:
          card: the card.
          program: its program.
          versions: the initial weight versions.
          experts: stacked component -> expert names.
          base: the card a role belongs to, or ``None``.
          scope: the role's own components.

        Returns:
          The ``Resident``.
        """
        leaves, treedef = jax.tree.flatten(card)
        return cls(card, program, treedef, leaves, versions, experts, base, scope)

    def scoped(self, names) -> set[str]:
        """The versioned names among ``names`` (components or experts) inside this role's scope."""
        owners = self.owners()
        return {n for n in names if n in self.scope or (n in owners and owners[n][0] in self.scope)}

    def version(self, component: str) -> int:
        """The weight version keying ``component``'s cache entries (a stacked one: its experts' sum,
        which every expert publish raises)."""
        if component in self.experts:
            return sum(self.versions[e] for e in self.experts[component])
        return self.versions[component]

    def owners(self) -> dict[str, tuple[str, int]]:
        """Expert name -> (its stacked component, its index on the expert axis)."""
        return {e: (c, i) for c, names in self.experts.items() for i, e in enumerate(names)}


@dataclasses.dataclass(frozen=True, eq=False)
class Publish:
    """A checked publish (``checked``).

    Attributes:
      components: whole components, name -> module.
      slices: expert slices, stacked component -> {index: module of one expert}.
      bumps: the versioned names it raises.
    """

    components: dict[str, Any]
    slices: dict[str, dict[int, Any]]
    bumps: tuple[str, ...]

    @property
    def touched(self) -> set[str]:
        """The components whose weights (hence cache entries) it changes."""
        return set(self.components) | set(self.slices)

    def apply(self, card: Card) -> Card:
        """``card`` with the publish applied (slices written into the stacked components of ``card``)."""
        new = dict(self.components)
        for name, slices in self.slices.items():
            rows = sorted(slices)
            new[name] = _set_rows(card[name], jnp.asarray(rows, jnp.int32), tuple(slices[i] for i in rows))
        return card.replace(**new) if new else card


@jax.jit
def _set_rows(stacked, rows, experts):
    """``stacked`` with expert rows ``rows`` replaced by the one-expert modules ``experts`` (in that order)."""
    values = jax.tree.map(lambda *xs: jnp.stack(xs), *experts)
    return jax.tree.map(lambda s, v: s.at[rows].set(v), stacked, values)


def checked(resident: Resident, components: Mapping[str, Any]) -> Publish:
    """``components`` checked against the resident card's (names, then each one's layout; an expert
    against one slice of its stacked component), as a snapshot: a shallow pytree copy, so later
    in-place changes to the caller's modules cannot leak into a deferred swap.

    Args:
      resident: the served card.
      components: name -> module; a name is a component or an expert of a stacked component.

    Returns:
      The ``Publish``.

    Raises:
      TypeError: if ``components`` is not a mapping.
      UnknownComponentError: if a name is neither a component nor an expert.
      EngineError: naming the first layout problem, or a component published both whole and by expert.
      ProgramError: if the program no longer checks against the published card.
    """
    model_id = resident.card.model_id
    if not isinstance(components, Mapping):
        raise TypeError(f"publish takes a mapping component name -> module (got {type(components).__name__})")
    have, owners = resident.card.components, resident.owners()
    unknown = sorted(str(n) for n in components if n not in have and n not in owners)
    if unknown:
        experts = "".join(f"; stacked {c!r} has experts {list(e)}" for c, e in resident.experts.items())
        raise UnknownComponentError(
            f"publish: card {model_id!r} has no component(s) {unknown}; it has {sorted(have)}{experts}"
        )
    whole, slices, bumps = {}, {}, []
    for name, new in components.items():
        if name in have:
            _check_layout(f"publish: card {model_id!r}, component {name!r}", have[name], new)
            whole[name] = jax.tree.map(lambda x: x, new)
            bumps.extend(resident.experts.get(name, (name,)))
        else:
            stacked, index = owners[name]
            where = f"publish: card {model_id!r}, expert {name!r} (slice {index} of stacked {stacked!r})"
            _check_layout(where, _expert_layout(have[stacked]), new)
            slices.setdefault(stacked, {})[index] = jax.tree.map(lambda x: x, new)
            bumps.append(name)
    both = sorted(set(whole) & set(slices))
    if both:
        raise EngineError(
            f"publish: card {model_id!r}: {both[0]!r} is published both whole and by expert "
            f"({sorted(n for n in components if n in owners and owners[n][0] == both[0])}); publish one or the other"
        )
    resident.program.check(resident.card.replace(**whole))
    return Publish(whole, slices, tuple(bumps))


def _expert_layout(stacked: Any) -> Any:
    """One expert of a stacked module, abstractly (leaves ``ShapeDtypeStruct`` without the expert axis)."""

    def row(x):
        x = x if hasattr(x, "dtype") else np.asarray(x)
        return jax.ShapeDtypeStruct(tuple(x.shape)[1:], x.dtype)

    return jax.tree.map(row, stacked)


def stacked(card: Card) -> dict[str, tuple[str, ...]]:
    """``jaxpipe.cards.stacked_components(card)``, checked: expert names unique and clashing with no
    component, every leaf of a stacked component with a leading axis of one row per expert.

    Args:
      card: the card.

    Returns:
      Stacked component -> its expert names (empty for a card without stacked components).

    Raises:
      EngineError: on repeated or clashing expert names, a missing stacked component, or a leaf without
        the expert axis.
    """
    from jaxpipe.cards.registry import stacked_components  # the engine sits above the cards

    experts = stacked_components(card)
    names = [e for es in experts.values() for e in es]
    clash = sorted({e for e in names if names.count(e) > 1 or e in card.components})
    if clash:
        raise EngineError(f"card {card.model_id!r}: expert names {clash} are repeated or name a component")
    for component, es in experts.items():
        if component not in card.components:
            raise EngineError(f"card {card.model_id!r}: stacked component {component!r} is missing")
        bad = [np.shape(x) for x in jax.tree.leaves(card[component]) if np.shape(x)[:1] != (len(es),)]
        if bad:
            raise EngineError(
                f"card {card.model_id!r}: stacked component {component!r} has {len(es)} experts, but leaves "
                f"of shape {bad[0]} have no leading expert axis of that size"
            )
    return experts


def _check_layout(where: str, old: Any, new: Any) -> None:
    """Raise ``EngineError`` unless ``new`` has ``old``'s type, leaf paths, shapes, dtypes and static settings."""
    if type(new) is not type(old):
        raise EngineError(f"{where}: expected a {type(old).__name__} like the resident one (got {type(new).__name__})")
    old_leaves, old_def = jax.tree_util.tree_flatten_with_path(old)
    new_leaves, new_def = jax.tree_util.tree_flatten_with_path(new)
    old_paths = [jax.tree_util.keystr(p) for p, _ in old_leaves]
    new_paths = [jax.tree_util.keystr(p) for p, _ in new_leaves]
    if old_paths != new_paths:
        missing = sorted(set(old_paths) - set(new_paths))[:3]
        extra = sorted(set(new_paths) - set(old_paths))[:3]
        raise EngineError(
            f"{where}: tree structure differs from the resident one (missing leaves {missing}, extra leaves {extra})"
        )
    for path, (_, a), (_, b) in zip(old_paths, old_leaves, new_leaves):
        old_sig, new_sig = _signature(a), _signature(b)
        if old_sig != new_sig:
            raise EngineError(
                f"{where}: leaf {path} has shape {new_sig[0]} and dtype {new_sig[1]}; "
                f"the resident one has shape {old_sig[0]} and dtype {old_sig[1]}"
            )
    if old_def != new_def:
        raise EngineError(f"{where}: static settings (module configuration) differ from the resident one's")


def _signature(leaf: Any) -> tuple[tuple[int, ...], str]:
    if not hasattr(leaf, "dtype"):
        leaf = np.asarray(leaf)
    return tuple(leaf.shape), str(leaf.dtype)
