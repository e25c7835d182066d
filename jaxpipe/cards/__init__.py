"""Cards and card families. ``load(id)`` gives a bundled pretrained card; ``build(id)`` a freshly initialised one.

A family is one folder (``jaxpipe/cards/<family>/``: its ``Config``, ``build`` and program) plus
one line in ``jaxpipe.cards.registry``; ``register_family`` adds one from outside the package.
Checkpoints (``save_card`` / ``load_card``) live here too: they rebuild a card through its family.
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxpipe.card import Card
from jaxpipe.cards import digit_scorer, flux, flux_t2i, generator, multi_expert, registry, unified, wan, wan_i2v, wan_t2v
from jaxpipe.cards import ltx2_two_stage  # noqa: F401  (the two-stage one-DiT family)
from jaxpipe.cards import wan22_moe  # noqa: F401  (the σ-routed two-expert family)
from jaxpipe.cards import wan_causal  # noqa: F401  (the chunked causal video family)
from jaxpipe.cards.checkpoint import load_card, save_card
from jaxpipe.cards.family import Family, FlowData
from jaxpipe.cards.registry import family, family_of, stacked_components
from jaxpipe.cards.registry import register as register_family
from jaxpipe.cards.registry import unregister as unregister_family

ASSETS = Path(__file__).resolve().parent.parent / "assets"
"""Where the bundled pretrained cards live (one folder per card id)."""


def buildable() -> list[str]:
    """Ids of the cards jaxpipe can build from scratch (each registered family's ``model_id``)."""
    return sorted(f.model_id for f in registry.FAMILIES.values() if f.model_id)


def available() -> list[str]:
    """Ids of the bundled pretrained cards (``load(id)`` works for each)."""
    if not ASSETS.is_dir():
        return []
    return sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file())


def build(model_id: str, *, seed: int = 0, config=None) -> Card:
    """A freshly initialised card ``model_id`` (deterministic in ``seed``), with an optional family ``Config``."""
    f = registry.by_model_id(model_id)
    return f.build(f.config() if config is None else config, seed=seed, model_id=model_id)


def load(model_id_or_path: str | os.PathLike, **kwargs) -> Card:
    """A pretrained card: a bundled id (see ``available()``), a directory written by ``save_card``, or
    a diffusers pipeline folder (``model_index.json``: ``FLUX.1-dev/``, ``Wan2.1-T2V-1.3B-Diffusers/``),
    loaded by the family that reads its pipeline class (``kwargs`` go to that loader, e.g.
    ``dtype="bfloat16"``, ``height=512``)."""
    name = os.fspath(model_id_or_path)
    if name in available():
        return load_card(ASSETS / name)
    if (Path(name) / "model_index.json").is_file():
        from jaxpipe.cards.diffusers_pipeline import read_pipeline

        pipeline = read_pipeline(name).pipeline
        return registry.by_pipeline(pipeline).pipelines[pipeline](name, **kwargs)
    if kwargs:
        raise TypeError(f"load({name!r}) takes keyword arguments only for diffusers pipeline folders (got {sorted(kwargs)})")
    if Path(name).is_dir():
        return load_card(name)
    raise KeyError(
        f"unknown card {name!r}: not a bundled card ({available() or 'none bundled yet'}) nor a checkpoint directory"
    )


__all__ = [
    "ASSETS", "Family", "FlowData", "available", "build", "buildable", "digit_scorer", "family", "family_of", "flux", "flux_t2i",
    "generator", "load", "load_card", "multi_expert", "register_family", "registry", "save_card", "stacked_components",
    "unified", "unregister_family", "wan", "wan_i2v", "wan_t2v",
]
