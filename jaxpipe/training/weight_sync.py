"""Weight sync: publish a trained card's components into a serving engine.

The training side of ``Engine.publish`` (DESIGN §10). A trainer's ``method.card(state)`` is a
whole card; ``publish`` sends the engine only the named components, or by default only those
whose weights differ from what the engine will serve, so each trained component gets its own
new weight version while the untouched ones (typically the text encoder) keep their versions and
their feature-cache entries.

Called while the engine runs ``run_many`` (from an ``on_step`` callback, or another thread),
the engine drains first: requests already started on the card finish on the old weights, and
its requests not yet started run on the new ones (see ``Engine.publish``).

The engine never imports this module (DESIGN §3); it depends only on the engine's public API.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp

from jaxpipe.card import Card
from jaxpipe.engine import Engine, UnknownComponentError

__all__ = ["publish", "changed_components"]


def publish(engine: Engine, card: Card, components: str | Iterable[str] | None = None) -> dict[str, int]:
    """Publish ``card``'s ``components`` into ``engine``'s resident card of the same model id.

    Arguments:
      engine: the serving engine; the card's model id must be registered there.
      card: the trained card (``method.card(state)``).
      components: component names to publish (one name or several). ``None`` (default): every
        component whose weights differ from the engine's (``changed_components``); when nothing
        differs, nothing is published and no version moves.

    Returns:
      The card's weight versions after the publish (when deferred by a running ``run_many``:
      the versions the swap will produce; ``engine.versions`` reports them once it applies).

    Raises ``UnknownComponentError`` for a name the card lacks and ``EngineError`` for a
    component whose layout differs from the resident one; nothing changes then.
    """
    if not isinstance(card, Card):
        raise TypeError(f"publish takes a trained Card, e.g. method.card(state) (got {type(card).__name__})")
    if components is None:
        names = changed_components(engine, card)
    else:
        names = (components,) if isinstance(components, str) else tuple(components)
        unknown = sorted(str(n) for n in names if n not in card.components)
        if unknown:
            raise UnknownComponentError(
                f"publish: card {card.model_id!r} has no component(s) {unknown}; it has {sorted(card.components)}"
            )
    return engine.publish(card.model_id, {name: card[name] for name in names})


def changed_components(engine: Engine, card: Card) -> tuple[str, ...]:
    """The components of ``card`` whose leaves differ from the engine's resident card of the same id,
    including publishes still waiting for the card to drain, in sorted order.

    A component differs when its leaf paths, shapes or dtypes differ (the engine will then
    refuse it with a clear error) or when any leaf differs in value (exact comparison; leaves
    that are the same array object are equal without a look). All comparisons run on device and
    come back in one transfer.
    """
    resident = engine.card(card.model_id, pending=True)
    unknown = sorted(set(card.components) - set(resident.components))
    if unknown:
        raise UnknownComponentError(
            f"publish: card {card.model_id!r} has component(s) {unknown} the engine's resident card "
            f"lacks; it has {sorted(resident.components)}"
        )
    checks: dict[str, list] = {}
    for name in sorted(card.components):
        old = jax.tree_util.tree_flatten_with_path(resident[name])[0]
        new = jax.tree_util.tree_flatten_with_path(card[name])[0]
        if [p for p, _ in old] != [p for p, _ in new]:
            checks[name] = [False]
            continue
        checks[name] = [_equal(a, b) for (_, a), (_, b) in zip(old, new)]
    same = jax.device_get(checks)
    return tuple(name for name, flags in same.items() if not all(bool(f) for f in flags))


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
