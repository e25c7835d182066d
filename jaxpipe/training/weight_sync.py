"""Weight sync: publish a trained card's components into a serving engine.

The training side of ``Engine.publish``. A trainer's ``method.card(state)`` is a
whole card; ``publish`` sends the engine only the named components, or by default only those
whose weights differ from what the engine will serve, so each trained component gets its own
new weight version while the untouched ones (typically the text encoder) keep their versions and
their feature-cache entries.

Called while the engine runs ``run_many`` (from an ``on_step`` callback, or another thread),
the engine drains first: requests already started on the card finish on the old weights, and
its requests not yet started run on the new ones (see ``Engine.publish``).

Stacked experts (``Engine.experts``, e.g. the ``multi-expert`` card's ``refiners``) are compared
and published slice by slice under their own names (``refiner_2``), so only the experts that
changed get new versions.

Roles: a trainer that keeps another copy of some components (``DiffusionNFT``'s old policy, an
EMA) declares them as ``method.roles`` (role name -> components) and ``method.role_card(state,
role)``. ``track`` serves each as a role of the card (``Engine.add_role``: ``"flux-t2i@old"``, with
its own versions, scoped to those components) and ``sync`` publishes the trained card and every
role's copy in one call, each only where its weights changed.

The engine never imports this module; it depends only on the engine's public API.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.engine import Engine, EngineError, UnknownComponentError
from jaxpipe.engine.engine import ROLE_SEP

__all__ = ["publish", "changed_components", "track", "sync"]


def publish(
    engine: Engine, card: Card, components: str | Iterable[str] | None = None, *, role: str | None = None
) -> dict[str, int]:
    """Publish ``card``'s ``components`` into ``engine``'s resident card of the same model id.

    Args:
      engine: the serving engine; the card's model id must be registered there.
      card: the trained card (``method.card(state)``).
      components: component names to publish (one name or several; an expert of a stacked
        component by its own name, e.g. ``"refiner_2"``: that slice of the card's stacked
        component). ``None`` (default): every component, and every expert of a stacked one, whose
        weights differ from the engine's (``changed_components``); when nothing differs, nothing
        is published and no version moves.
      role: publish into that role of the card, ``"<model_id>@<role>"`` (added by ``track``); by
        default only the changed components within the role's scope.

    Returns:
      The card's weight versions after the publish (when deferred by a running ``run_many``:
      the versions the swap will produce; ``engine.versions`` reports them once it applies).

    Raises:
      TypeError: if ``card`` is not a ``Card``.
      UnknownComponentError: for a name the card lacks; nothing changes then.
      EngineError: for a role the engine does not serve, or a component whose layout differs from the
        resident one; nothing changes then.
    """
    if not isinstance(card, Card):
        raise TypeError(f"publish takes a trained Card, e.g. method.card(state) (got {type(card).__name__})")
    if role is not None:
        roles = engine.roles(card.model_id)
        if role not in roles:
            raise EngineError(
                f"card {card.model_id!r} has no role {role!r} in this engine (its roles: {sorted(roles)}); add it with track"
            )
        scope = roles[role]
        card = card.with_id(f"{card.model_id}{ROLE_SEP}{role}")
        if components is None:
            stacked = engine.experts(card.model_id)
            inside = {n for c in scope for n in (c, *stacked.get(c, ()))}
            components = [n for n in changed_components(engine, card) if n in inside]
    owners = _owners(engine, card)
    if components is None:
        names = changed_components(engine, card)
    else:
        names = (components,) if isinstance(components, str) else tuple(components)
        unknown = sorted(str(n) for n in names if n not in card.components and n not in owners)
        if unknown:
            experts = f"; experts {sorted(owners)}" if owners else ""
            raise UnknownComponentError(
                f"publish: card {card.model_id!r} has no component(s) {unknown}; it has {sorted(card.components)}{experts}"
            )
    return engine.publish(card.model_id, {name: _part(card, name, owners) for name in names})


def _role_base(method: Any, role: str) -> str:
    """The model id role ``role`` is served under: ``method.role_model_id(role)`` (the card its
    ``role_card`` returns: the method's own, or e.g. the teacher a distillation's critic copies)."""
    role_model_id = getattr(method, "role_model_id", None)
    return method.spec.model_id if role_model_id is None else role_model_id(role)


def track(engine: Engine, method: Any, state: Any | None = None) -> dict[str, str]:
    """Serve each of ``method.roles`` as a role of the card its ``role_card`` is, in ``engine``.

    The card is the method's own, or e.g. DMD2's teacher for its critic (``method.role_model_id``); the
    engine must serve it. Roles already served keep their weights and versions.

    Args:
      engine: the serving engine.
      method: a trainer (its ``roles``: role name -> components, and ``role_card``).
      state: a train state; given, ``sync`` follows.

    Returns:
      Role name -> its served id (``"<model_id>@<role>"``).

    Raises:
      EngineError: if a role is already served with other components.
    """
    served = {}
    for role, components in method.roles.items():
        model_id = _role_base(method, role)
        have = engine.roles(model_id)
        if role in have:
            if tuple(have[role]) != tuple(components):
                raise EngineError(f"role {role!r} of {model_id!r} tracks {list(have[role])}, not {list(components)}")
            served[role] = f"{model_id}{ROLE_SEP}{role}"
        else:
            served[role] = engine.add_role(model_id, role, components)
    if state is not None:
        sync(engine, method, state)
    return served


def sync(engine: Engine, method: Any, state: Any) -> dict[str, dict[str, int]]:
    """Publish ``method.card(state)`` and each role's copy (``method.role_card``) where their weights changed.

    Args:
      engine: the serving engine (its roles added by ``track``).
      method: the trainer.
      state: its train state.

    Returns:
      Served id -> its versions after the publish.
    """
    card = method.card(state)
    out = {card.model_id: publish(engine, card)}
    for role in method.roles:
        role_card = method.role_card(state, role)  # published into the role of its own card's id (track)
        out[f"{role_card.model_id}{ROLE_SEP}{role}"] = publish(engine, role_card, role=role)
    return out


def _owners(engine: Engine, card: Card) -> dict[str, tuple[str, int]]:
    """Expert name -> (stacked component, index) for the engine's resident card of ``card``'s id
    (only stacked components ``card`` has too)."""
    experts = engine.experts(card.model_id)
    return {e: (c, i) for c, names in experts.items() if c in card.components for i, e in enumerate(names)}


def _part(card: Card, name: str, owners: dict[str, tuple[str, int]]):
    """Component ``name`` of ``card``, or expert ``name``: its slice of the stacked component."""
    if name in card.components:
        return card[name]
    component, index = owners[name]
    return jax.tree.map(lambda x: x[index], card[component])


def changed_components(engine: Engine, card: Card) -> tuple[str, ...]:
    """The components of ``card`` whose leaves differ from the engine's resident card of the same id.

    The resident card includes publishes still waiting for the card to drain. A component differs
    when its leaf paths, shapes or dtypes differ (the engine will then refuse it with a clear error; a
    stacked one is then named whole) or when any leaf differs in value (exact comparison; leaves that
    are the same array object are equal without a look). All comparisons run on device and come back
    in one transfer.

    Args:
      engine: the serving engine.
      card: the trained card.

    Returns:
      The changed component names in sorted order; for a stacked component (``Engine.experts``), the
      names of the experts whose slices differ, in axis order.

    Raises:
      UnknownComponentError: if ``card`` has components the resident card lacks.
    """
    resident = engine.card(card.model_id, pending=True)
    unknown = sorted(set(card.components) - set(resident.components))
    if unknown:
        raise UnknownComponentError(
            f"publish: card {card.model_id!r} has component(s) {unknown} the engine's resident card "
            f"lacks; it has {sorted(resident.components)}"
        )
    experts = engine.experts(card.model_id)
    checks: dict[str, list] = {}
    for name in sorted(card.components):
        old = jax.tree_util.tree_flatten_with_path(resident[name])[0]
        new = jax.tree_util.tree_flatten_with_path(card[name])[0]
        if [p for p, _ in old] != [p for p, _ in new]:
            checks[name] = [False]
        elif name in experts and old and all(_signature(a) == _signature(b) for (_, a), (_, b) in zip(old, new)):
            olds, news = [a for _, a in old], [b for _, b in new]
            same = all(a is b for a, b in zip(olds, news))
            checks[name] = [np.ones((len(experts[name]),), bool) if same else _equal_rows(olds, news)]
        else:
            checks[name] = [_equal(a, b) for (_, a), (_, b) in zip(old, new)]
    same = jax.device_get(checks)
    changed = []
    for name, flags in same.items():
        if name in experts and len(flags) == 1 and np.ndim(flags[0]) == 1:
            changed.extend(e for e, equal in zip(experts[name], flags[0]) if not equal)
        elif not all(bool(f) for f in flags):
            changed.append(name)
    return tuple(changed)


def _signature(leaf) -> tuple:
    leaf = leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
    return tuple(leaf.shape), leaf.dtype


@jax.jit
def _equal_rows(olds: list, news: list) -> jax.Array:
    """``(N,)`` booleans: whether expert ``i``'s slices of two lists of stacked leaves (leading axis N,
    pairwise equal shapes and dtypes) are all exactly equal. One compiled call per layout."""
    rows = olds[0].shape[0]
    equal = jnp.ones((rows,), bool)
    for a, b in zip(olds, news):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        equal &= jnp.all((a == b).reshape(rows, -1), axis=1)
    return equal


def _equal(a, b):
    """``True``/``False``, or a device boolean: whether two leaves are the same array exactly."""
    if a is b:
        return True
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    return jnp.array_equal(a, b)
