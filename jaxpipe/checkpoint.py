"""Card checkpoints: ``config.json`` (family, model id, the family's build config) + ``weights.safetensors``.

Loading rebuilds the card abstractly from its config (``nnx.eval_shape``: no random init, no
memory for throwaway weights) and fills every variable from the file, checking names and shapes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxpipe.card import Card

__all__ = ["save_card", "load_card", "config_to_dict", "config_from_dict"]

FORMAT = "jaxpipe.card/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.safetensors"


def config_to_dict(config) -> dict:
    """A frozen config dataclass (possibly nested) as plain JSON-able data."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


def _coerce(tp, value):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return config_from_dict(tp, value)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(options[0], value) if len(options) == 1 else value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v) for v in value)
        return tuple(_coerce(a, v) for a, v in zip(args, value)) if args else tuple(value)
    return value


def config_from_dict(cls, data: dict):
    """Rebuild config dataclass ``cls`` from ``config_to_dict`` output (nested dataclasses, tuples)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})


def _flat(state) -> dict[str, Any]:
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


def save_card(card: Card, directory: str | os.PathLike) -> Path:
    """Write ``card`` to ``directory`` (created if needed); returns the directory."""
    from jaxpipe.cards import family_module  # cards sit above checkpoint in the layer order

    family_module(card.spec.family)  # fail before writing anything for a family that cannot be loaded
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {name: np.asarray(value) for name, value in _flat(nnx.state(card.components)).items()}
    save_file(arrays, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    meta = {
        "format": FORMAT,
        "model_id": card.model_id,
        "family": card.spec.family,
        "config": config_to_dict(card.spec.config),
    }
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return directory


def load_card(directory: str | os.PathLike) -> Card:
    """Load a card written by ``save_card``."""
    from jaxpipe.cards import family_module

    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{directory} is not a card checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    meta = json.loads((directory / CONFIG_FILE).read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory}: unsupported checkpoint format {meta.get('format')!r} (expected {FORMAT!r})")
    family = family_module(meta["family"])
    config = config_from_dict(family.Config, meta["config"])
    abstract = nnx.eval_shape(lambda: family.build(config, seed=0, model_id=meta["model_id"]))
    graphdef, state = nnx.split(abstract.components)
    stored = load_file(str(directory / WEIGHTS_FILE))
    expected = _flat(state)
    missing, extra = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    if missing or extra:
        raise ValueError(f"{directory}: weights do not match the {meta['family']} config: missing {missing}, unexpected {extra}")
    leaves = []
    for name, spec in expected.items():
        if tuple(stored[name].shape) != tuple(spec.shape):
            raise ValueError(f"{directory}: {name} has shape {stored[name].shape}, the config expects {spec.shape}")
        leaves.append(jnp.asarray(stored[name], spec.dtype))
    state = jax.tree.unflatten(jax.tree.structure(state), leaves)
    return Card(nnx.merge(graphdef, state), abstract.spec)
