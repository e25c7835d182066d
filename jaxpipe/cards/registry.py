"""The family registry (family name -> ``Family``) and the card registry (card id -> ``CardEntry``).

Adding a card family to jaxpipe is one folder (``jaxpipe/cards/<family>/``, defining ``FAMILY``)
plus one line in ``BUNDLED`` below; from outside the package, ``register(family)``. Everything
that needs to know a family — checkpoints, the engine's default program, per-expert versions,
``Finetune``, ``jp.cards.build`` — looks it up here.

Card ids (``"flux-t2i"``) belong to worlds: a world (``jaxpipe.digits``) registers the cards it
ships with ``register_card`` — the family that builds each, the config ``jp.cards.build(id)``
uses, and the folder ``jp.cards.load(id)`` reads. The bundled worlds register on first use
(``jaxpipe.worlds``); the core never imports a world.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxpipe.card import Card
from jaxpipe.cards import (
    flux,
    toy_causal,
    toy_i2v,
    toy_mot,
    toy_mot_video,
    toy_multi_expert,
    toy_sigma_moe,
    toy_t2i,
    toy_t2v,
    toy_two_stage,
    toy_unified,
    wan,
)
from jaxpipe.cards.family import Family
from jaxpipe.program import Program

__all__ = [
    "BUNDLED",
    "FAMILIES",
    "CARDS",
    "RENAMED",
    "UPGRADES",
    "CardEntry",
    "register",
    "register_upgrade",
    "unregister",
    "register_card",
    "unregister_card",
    "family",
    "family_of",
    "by_model_id",
    "buildable",
    "by_pipeline",
    "card_entry",
    "default_program",
    "stacked_components",
]

BUNDLED: tuple[Family, ...] = (
    toy_t2i.FAMILY,
    toy_i2v.FAMILY,
    toy_t2v.FAMILY,
    toy_two_stage.FAMILY,
    toy_sigma_moe.FAMILY,
    toy_causal.FAMILY,
    toy_unified.FAMILY,
    toy_multi_expert.FAMILY,
    toy_mot.FAMILY,
    toy_mot_video.FAMILY,
    flux.FAMILY,
    wan.FAMILY,
)
"""The families jaxpipe's core ships, one line each (a world registers its own)."""

FAMILIES: dict[str, Family] = {f.name: f for f in BUNDLED}
"""Family name -> ``Family``: the bundled families, then those added with ``register`` (a world's, a user's)."""

RENAMED: dict[str, str] = {
    "flux_t2i": "toy_t2i",
    "wan_i2v": "toy_i2v",
    "wan_t2v": "toy_t2v",
    "ltx2_two_stage": "toy_two_stage",
    "wan22_moe": "toy_sigma_moe",
    "wan_causal": "toy_causal",
    "unified": "toy_unified",
    "multi_expert": "toy_multi_expert",
    "bagel_mot": "toy_mot",
    "cosmos3": "toy_mot_video",
}
"""Family names of jaxpipe 0.1's toy families (named after the real models they mimic) -> their names now;
checkpoints saved under an old name still load, with a ``DeprecationWarning`` (until the next release)."""

UPGRADES: dict[str, Callable[[dict], dict]] = {}
"""Old family name -> a function from a checkpoint's saved config (the JSON dict) to the config its new family
reads, for fields whose format changed with the rename; a world registers the ones its cards need
(``register_upgrade``)."""


def register_upgrade(old_family: str, upgrade: Callable[[dict], dict]) -> None:
    """Read checkpoints saved under family ``old_family`` (a ``RENAMED`` key) through ``upgrade(config_dict)``.

    Args:
      old_family: a family's old name (a key of ``RENAMED``), as old checkpoints record it.
      upgrade: ``(saved config dict) -> config dict`` in the format the renamed family's ``Config`` reads;
        applied when a checkpoint saved under ``old_family`` is loaded.

    Raises:
      KeyError: if ``old_family`` is not a key of ``RENAMED``.
    """
    if old_family not in RENAMED:
        raise KeyError(f"{old_family!r} is not a renamed family; renamed: {sorted(RENAMED)}")
    UPGRADES[old_family] = upgrade


@dataclasses.dataclass(frozen=True)
class CardEntry:
    """A card id a world ships or builds.

    Attributes:
      model_id: the card's id.
      family: the name of the family that builds it.
      config: ``() -> Config``, the family config ``jp.cards.build(model_id)`` builds (``None``: not buildable).
      path: the folder of its pretrained checkpoint (``save_card``'s layout), if it is bundled.
      rebuild: the command that re-creates that checkpoint (a damaged one's error tells it), if any.
      description: one line saying what this card does (``jaxpipe cards`` prints it whole).
    """

    model_id: str
    family: str
    config: Callable[[], Any] | None = None
    path: Path | None = None
    rebuild: str | None = None
    description: str = ""

    @property
    def bundled(self) -> bool:
        """Whether a pretrained checkpoint ships with it (``jp.cards.load(model_id)`` works)."""
        return self.path is not None and (self.path / "config.json").is_file()


CARDS: dict[str, CardEntry] = {}
"""Card id -> ``CardEntry``, filled by the worlds (``register_card``)."""


def _worlds() -> None:
    from jaxpipe import worlds  # the registry sits below the worlds: they register into it on first use

    worlds.load()


def register(new: Family, *, replace: bool = False) -> Family:
    """Add a family to the registry (``replace=True`` to change one); its ``model_id`` must be unique.

    Args:
      new: the family to add.
      replace: replace a registered family of the same name instead of failing.

    Returns:
      ``new``.

    Raises:
      TypeError: if ``new`` is not a ``Family``.
      ValueError: if a family named ``new.name`` is already registered (and not ``replace``), or if
        ``new.model_id`` is already the model id of another family or a card id registered by another family.
    """
    if not isinstance(new, Family):
        raise TypeError(f"register takes a jaxpipe.cards.Family (got {type(new).__name__})")
    if new.name in FAMILIES and not replace:
        raise ValueError(f"family {new.name!r} is already registered (pass replace=True)")
    clash = [f.name for f in FAMILIES.values() if f.name != new.name and new.model_id and f.model_id == new.model_id]
    if new.model_id and not clash:
        entry = card_entry(new.model_id)
        clash = [entry.family] if entry is not None and entry.family != new.name else []
    if clash:
        raise ValueError(f"family {new.name!r}: model id {new.model_id!r} is already built by family {clash[0]!r}")
    FAMILIES[new.name] = new
    return new


def unregister(name: str) -> None:
    """Remove family ``name`` from the registry.

    Args:
      name: the registered family's name.

    Raises:
      ValueError: if no family ``name`` is registered.
    """
    family(name)
    del FAMILIES[name]


def register_card(
    model_id: str,
    family_name: str,
    *,
    config: Callable[[], Any] | None = None,
    path: str | os.PathLike | None = None,
    rebuild: str | None = None,
    description: str = "",
    replace: bool = False,
) -> CardEntry:
    """Register card id ``model_id``, built by a family from a config and/or loaded from a checkpoint folder.

    A second registration of the same id is an error unless it is identical or ``replace=True``.

    Args:
      model_id: the card id (non-empty), as ``jp.cards.build`` / ``jp.cards.load`` take it.
      family_name: the name of the family that builds the card.
      config: ``() -> Config``, the family config ``jp.cards.build(model_id)`` builds (``None``: not buildable).
      path: the folder of the card's pretrained checkpoint (``save_card``'s layout), if it ships one.
      rebuild: the command that re-creates that checkpoint (named when it is found damaged), if any.
      description: one line saying what the card does.
      replace: replace a different entry already registered under ``model_id`` instead of failing.

    Returns:
      The registered ``CardEntry``.

    Raises:
      ValueError: if ``model_id`` is empty or not a string, if neither ``config`` nor ``path`` is given,
        if ``description`` is not one line of text, or if ``model_id`` is already registered with a
        different entry (and not ``replace``).
    """
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"a card id must be a non-empty string (got {model_id!r})")
    if config is None and path is None:
        raise ValueError(f"card {model_id!r}: give a config to build it from, a checkpoint path, or both")
    if not isinstance(description, str) or "\n" in description:
        raise ValueError(f"card {model_id!r}: description must be one line of text (got {description!r})")
    entry = CardEntry(model_id, family_name, config, None if path is None else Path(path), rebuild, description)
    old = CARDS.get(model_id)
    if old is not None and old != entry and not replace:
        raise ValueError(f"card id {model_id!r} is already registered (family {old.family!r}); pass replace=True")
    CARDS[model_id] = entry
    return entry


def unregister_card(model_id: str) -> None:
    """Remove card id ``model_id`` from the registry.

    Args:
      model_id: a registered card id.

    Raises:
      KeyError: if no card ``model_id`` is registered.
    """
    if model_id not in CARDS:
        raise KeyError(f"no card {model_id!r} is registered; registered: {sorted(CARDS)}")
    del CARDS[model_id]


def card_entry(model_id: str) -> CardEntry | None:
    """The registered entry of card id ``model_id`` (after the bundled worlds register), or ``None``.

    Args:
      model_id: a card id.

    Returns:
      Its ``CardEntry``, or ``None`` if no card ``model_id`` is registered.
    """
    _worlds()
    return CARDS.get(model_id)


def family(name: str) -> Family:
    """The registered family ``name``.

    An old family name (a ``RENAMED`` key) resolves to its new family, with a ``DeprecationWarning``.

    Args:
      name: a family name (``card.spec.family``, a checkpoint's ``family`` field).

    Returns:
      The ``Family``.

    Raises:
      ValueError: if no family ``name`` is registered (the message lists the known ones).
    """
    if name in RENAMED and name not in FAMILIES:
        _worlds()  # a world may register an upgrade of the old checkpoints (``UPGRADES``)
        warnings.warn(
            f"card family {name!r} is now {RENAMED[name]!r}; re-save the checkpoint to use the new name",
            DeprecationWarning,
            stacklevel=2,
        )
        name = RENAMED[name]
    if name not in FAMILIES:
        _worlds()
    if name not in FAMILIES:
        raise ValueError(f"unknown card family {name!r}; known families: {sorted(FAMILIES)}")
    return FAMILIES[name]


def family_of(card: Card) -> Family:
    """The family that built ``card``.

    Args:
      card: a card.

    Returns:
      The ``Family`` named by ``card.spec.family``.

    Raises:
      ValueError: if that family is not registered.
    """
    return family(card.spec.family)


def by_model_id(model_id: str) -> Family:
    """The family whose ``build`` gives card ``model_id``.

    Args:
      model_id: a registered card id, or a family's own ``model_id``.

    Returns:
      The ``Family`` that builds it.

    Raises:
      KeyError: if no card or family has that id (the message lists the buildable ids).
      ValueError: if the card is registered under a family that is not.
    """
    entry = card_entry(model_id)
    if entry is not None:
        return family(entry.family)
    for f in FAMILIES.values():
        if f.model_id == model_id:
            return f
    raise KeyError(f"unknown card {model_id!r}; buildable cards: {buildable()}")


def buildable() -> list[str]:
    """Ids of the cards that can be built from scratch (registered with a config, or a family's own id).

    Returns:
      The ids, sorted.
    """
    _worlds()
    ids = {e.model_id for e in CARDS.values() if e.config is not None}
    return sorted(ids | {f.model_id for f in FAMILIES.values() if f.model_id})


def by_pipeline(class_name: str) -> Family:
    """The family that loads diffusers pipeline ``class_name``.

    Args:
      class_name: a diffusers pipeline class name (``model_index.json``'s ``_class_name``).

    Returns:
      The first registered ``Family`` whose ``pipelines`` has a loader for it.

    Raises:
      KeyError: if no family loads it (the message lists the loadable class names).
    """
    for f in FAMILIES.values():
        if class_name in f.pipelines:
            return f
    known = sorted(name for f in FAMILIES.values() for name in f.pipelines)
    raise KeyError(f"no card family loads a diffusers {class_name or 'unnamed'} pipeline; loadable: {known}")


def default_program(card: Card) -> Program:
    """The program the engine serves ``card`` with by default: its family's first (or the one the
    family's ``program_for`` names for this card).

    Args:
      card: a card of a registered family.

    Returns:
      The built ``Program``.

    Raises:
      ValueError: if ``card``'s family is not registered.
    """
    return family_of(card).default_program(card)


def stacked_components(card: Card) -> dict[str, tuple[str, ...]]:
    """The components of ``card`` stored stacked on a leading expert axis, with their experts' names.

    Args:
      card: a card.

    Returns:
      Stacked component name -> its experts' names in axis order (``{"refiners": ("refiner_0", ...)}``
      for ``multi-expert``); ``{}`` when none, or when the card's family is not registered.
    """
    if card.spec.family not in FAMILIES:
        _worlds()
    f = FAMILIES.get(card.spec.family)
    if f is None or f.stacked is None:
        return {}
    return {name: tuple(experts) for name, experts in f.stacked(card).items()}
