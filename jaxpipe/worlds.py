"""Worlds: plug-in packages of data, prompts, rewards, evaluators and small bundled cards.

A world is a Python package with a ``register()`` function that registers what it ships into the
core's registries: its card families (``jaxpipe.cards.register_family``), its card ids and bundled
checkpoints (``jaxpipe.cards.register_card``) and its workflows
(``jaxpipe.workflow.register_bundled``). The core never imports a world: this module is the one
place that loads them, lazily, the first time a registry is asked for something it does not know.

``BUNDLED`` lists the worlds that ship inside jaxpipe (``jaxpipe.digits``, ``jaxpipe.shapes``); other packages add
theirs through the ``jaxpipe.worlds`` entry-point group (``name = "package.module"``) or by calling
``load("package.module")``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable

__all__ = ["BUNDLED", "ENTRY_POINTS", "load", "loaded"]

BUNDLED: tuple[str, ...] = ("jaxpipe.digits", "jaxpipe.shapes")
"""The worlds shipped inside jaxpipe, registered on first use."""

ENTRY_POINTS = "jaxpipe.worlds"
"""The entry-point group other packages declare their worlds under."""

_LOADED: list[str] = []
_LOADING: set[str] = set()


def loaded() -> tuple[str, ...]:
    """The worlds registered so far, in order."""
    return tuple(_LOADED)


def _installed() -> tuple[str, ...]:
    return tuple(ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINTS))


def load(names: Iterable[str] | None = None) -> tuple[str, ...]:
    """Register each world of ``names`` (default: the bundled ones, then the installed entry points) once:
    import its package and call its ``register()``. Returns the worlds registered so far.

    A bundled world that is not importable at all (the package is absent, or its import is blocked)
    is left out; any other import error, and every error of ``register()``, propagates.

    Args:
      names: world package names to register (``None``: the bundled worlds, then every installed
        ``ENTRY_POINTS`` entry point).

    Returns:
      The names of the worlds registered so far, in order.

    Raises:
      ModuleNotFoundError: if an explicitly named world cannot be imported.
      TypeError: if a world has no callable ``register``.
    """
    explicit = names is not None
    for name in tuple(names) if explicit else BUNDLED + _installed():
        if name in _LOADED or name in _LOADING:
            continue
        _LOADING.add(name)
        try:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as err:
                if explicit or err.name is None or not name.startswith(err.name):
                    raise
                continue  # the world itself is missing: the core works without it
            register = getattr(module, "register", None)
            if not callable(register):
                raise TypeError(f"world {name!r} has no register() function")
            register()
            _LOADED.append(name)
        finally:
            _LOADING.discard(name)
    return loaded()
