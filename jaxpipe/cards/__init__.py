"""Cards and card families. ``load(id)`` gives a pretrained card; ``build(id)`` a freshly initialised one.

A family is one folder (``jaxpipe/cards/<family>/``: its ``Config``, ``build`` and program) plus
one line in ``jaxpipe.cards.registry``; ``register_family`` adds one from outside the package.
Card ids belong to worlds, which register them (``register_card``: family, config, bundled
checkpoint folder); the bundled world ``jaxpipe.digits`` ships ``flux-t2i``, ``wan-i2v``, ...
Checkpoints (``save_card`` / ``load_card``) live here too: they rebuild a card through its family.

The toy families (``toy_t2i``, ``toy_i2v``, ...) are small networks of every topology jaxpipe
runs, sized by their configs and speaking a world's vocabulary; ``flux`` and ``wan`` are the real
FLUX.1 and Wan architectures, loaded from diffusers folders.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxpipe.card import Card
from jaxpipe.cards import (
    flux,
    generator,
    registry,
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
from jaxpipe.cards.checkpoint import CardIntegrityError, load_card, save_card
from jaxpipe.cards.family import Family, FlowData
from jaxpipe.cards.registry import (
    CardEntry,
    buildable,
    card_entry,
    family,
    family_of,
    register_card,
    stacked_components,
    unregister_card,
)
from jaxpipe.cards.registry import register as register_family
from jaxpipe.cards.registry import unregister as unregister_family


def available() -> list[str]:
    """Ids of the bundled pretrained cards (``load(id)`` works for each)."""
    registry.card_entry("")  # the bundled worlds register their cards on first use
    return sorted(e.model_id for e in registry.CARDS.values() if e.bundled)


def build(model_id: str, *, seed: int = 0, config=None) -> Card:
    """A freshly initialised card ``model_id`` (deterministic in ``seed``).

    Args:
      model_id: a buildable card id (``buildable()``).
      seed: the initialisation seed.
      config: the family ``Config`` to build from (default: the registered card's, else the family's
        default ``Config()``).

    Returns:
      The ``Card``.

    Raises:
      KeyError: if no family builds ``model_id``.
      ValueError: if the card is registered without a config and none is given.
    """
    entry = registry.card_entry(model_id)
    f = registry.by_model_id(model_id)
    if config is None:
        if entry is not None and entry.config is None:
            raise ValueError(f"card {model_id!r} is registered without a config to build it from; pass config=")
        config = entry.config() if entry is not None else f.config()
    return f.build(config, seed=seed, model_id=model_id)


def load(model_id_or_path: str | os.PathLike, **kwargs) -> Card:
    """A pretrained card: a bundled id (see ``available()``), a directory written by ``save_card``, or
    a diffusers pipeline folder (``model_index.json``: ``FLUX.1-dev/``, ``Wan2.1-T2V-1.3B-Diffusers/``),
    loaded by the family that reads its pipeline class.

    Args:
      model_id_or_path: a bundled card id, a ``save_card`` directory, or a diffusers pipeline folder.
      **kwargs: for a diffusers folder only: the family loader's options (e.g. ``dtype="bfloat16"``,
        ``height=512``).

    Returns:
      The loaded ``Card``.

    Raises:
      FileNotFoundError: if the name is a path (it has a ``/`` or starts with ``.``) to no directory.
      KeyError: if the name is neither a bundled card nor a directory, or no family loads the folder's
        pipeline class.
      TypeError: if ``kwargs`` are given for something other than a diffusers folder.
    """
    name = os.fspath(model_id_or_path)
    entry = registry.card_entry(name)
    if entry is not None and entry.bundled:
        return load_card(entry.path)
    if (Path(name) / "model_index.json").is_file():
        from jaxpipe.cards.diffusers_pipeline import read_pipeline

        pipeline = read_pipeline(name).pipeline
        return registry.by_pipeline(pipeline).pipelines[pipeline](name, **kwargs)
    if kwargs:
        raise TypeError(
            f"load({name!r}) takes keyword arguments only for diffusers pipeline folders (got {sorted(kwargs)})"
        )
    if Path(name).is_dir():
        return load_card(name)
    if os.sep in name or name.startswith(".") or Path(name).exists():  # meant as a folder: say which is missing
        raise FileNotFoundError(f"no such card folder: {name!r} (neither a directory nor a bundled card id)")
    raise KeyError(
        f"unknown card {name!r}: not a bundled card ({available() or 'none bundled yet'}) nor a checkpoint directory"
    )


def path(model_id: str) -> Path:
    """The checkpoint folder of bundled card ``model_id``.

    Args:
      model_id: a bundled card id.

    Returns:
      The folder (``config.json`` + ``*.safetensors``).

    Raises:
      KeyError: if ``model_id`` is not bundled (listing the bundled ids).
    """
    entry = registry.card_entry(model_id)
    if entry is None or not entry.bundled:
        raise KeyError(f"{model_id!r} is not a bundled card; bundled: {available()}")
    return entry.path


__all__ = [
    "Card",
    "CardEntry",
    "CardIntegrityError",
    "Family",
    "FlowData",
    "available",
    "build",
    "buildable",
    "card_entry",
    "family",
    "family_of",
    "flux",
    "generator",
    "load",
    "load_card",
    "path",
    "register_card",
    "register_family",
    "registry",
    "save_card",
    "stacked_components",
    "toy_causal",
    "toy_i2v",
    "toy_mot",
    "toy_mot_video",
    "toy_multi_expert",
    "toy_sigma_moe",
    "toy_t2i",
    "toy_t2v",
    "toy_two_stage",
    "toy_unified",
    "unregister_card",
    "unregister_family",
    "wan",
]
