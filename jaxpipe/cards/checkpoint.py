"""Card checkpoints: ``config.json`` (family, model id, the family's build config) + ``weights.safetensors``.

Loading rebuilds the card abstractly from its config (``nnx.eval_shape``: no random init, no
memory for throwaway weights) and fills every variable from the file, checking names and shapes.

A checkpoint may take some components from a **base** card instead of storing them again
(``save_card(card, dir, base="flux-t2i", base_components=("text_encoder", "transformer", "vae"))``):
``config.json`` then records ``base``, ``base_components`` and a digest of those weights, the
weights file holds only the other components, and ``load_card`` fills the named components from
``jaxpipe.cards.load(base)`` (names, shapes and dtypes checked against the config; a changed
digest is warned about, since the base card may have been retrained since).

``config.json`` also records the SHA-256 of every weights file (``"digests"``), which ``load_card``
checks before reading tensors: a damaged file (same size, other bytes) is a ``CardIntegrityError``
naming it, never silently wrong outputs. A folder saved before digests existed loads unchecked;
``write_digests`` adds them to one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import logging
import os
import types
import typing
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxpipe.card import Card
from jaxpipe.cards import registry

__all__ = [
    "CardIntegrityError",
    "save_card",
    "load_card",
    "abstract_card",
    "config_to_dict",
    "config_from_dict",
    "write_digests",
    "FORMAT",
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "DIGESTS_KEY",
    "TYPE_KEY",
]

FORMAT = "jaxpipe.card/1"
"""The checkpoint format ``config.json`` records (``"format"``); ``load_card`` reads only this one."""
CONFIG_FILE = "config.json"
"""The name of a checkpoint's config file: format, family, model id, the family's build config, digests."""
WEIGHTS_FILE = "weights.safetensors"
"""The name of a checkpoint's weights file: every stored variable, by its ``/``-joined state path."""
DIGESTS_KEY = "digests"
"""``config.json`` key: weights file name -> ``"sha256:<hex>"`` of its bytes."""

_log = logging.getLogger(__name__)


class CardIntegrityError(ValueError):
    """A card's weights file does not have the SHA-256 its ``config.json`` records: the file is damaged."""


TYPE_KEY = "__type__"
"""Names the class of a nested config whose field is declared by a protocol (e.g. a loop's router)."""


def _plain(value, declared=None):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        if not (isinstance(declared, type) and type(value) is declared):
            out[TYPE_KEY] = f"{type(value).__module__}:{type(value).__qualname__}"
        return out
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def config_to_dict(config) -> dict:
    """A frozen config dataclass (possibly nested) as plain JSON-able data.

    Nested dataclasses become dicts and tuples become lists; only ``init`` fields are kept. A nested
    config whose class is not its field's declared type (a policy behind a protocol) records its class
    under ``"__type__"``; only jaxpipe's own classes are rebuilt from it (``config_from_dict``).

    Args:
      config: a config dataclass instance (e.g. a family's ``Config``).

    Returns:
      Field name -> value, as ``json.loads(json.dumps(...))`` gives it back.
    """
    hints = typing.get_type_hints(type(config))
    out = {f.name: _plain(getattr(config, f.name), hints.get(f.name)) for f in dataclasses.fields(config) if f.init}
    return json.loads(json.dumps(out))


def _named_class(name: str) -> type:
    module, _, qualname = name.partition(":")
    if not (module == "jaxpipe" or module.startswith("jaxpipe.")) or not qualname:
        raise ValueError(f"a card config may only name jaxpipe's own classes (got {name!r})")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _coerce(tp, value):
    origin = typing.get_origin(tp)
    if isinstance(value, dict) and TYPE_KEY in value:
        data = dict(value)
        return config_from_dict(_named_class(data.pop(TYPE_KEY)), data)
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
    """Rebuild config dataclass ``cls`` from ``config_to_dict`` output (nested dataclasses, tuples).

    Fields missing from ``data`` take their defaults.

    Args:
      cls: the config dataclass to build.
      data: field name -> value, as ``config_to_dict`` wrote it.

    Returns:
      A ``cls`` instance.

    Raises:
      ValueError: if ``data`` names fields ``cls`` does not have (or, nested, a ``"__type__"`` outside jaxpipe).
      TypeError: if ``data`` lacks a field that has no default.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    return cls(**{k: _coerce(hints[k], v) for k, v in data.items()})


def _flat(state) -> dict[str, Any]:
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path, simple=True, separator="/"): leaf for path, leaf in leaves}


def _digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of ``arrays`` (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    """``"sha256:<hex>"`` of the file's bytes, read in chunks (a checkpoint may be many GB)."""
    with open(path, "rb") as f:
        return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


def _remedy(directory: Path, model_id: str) -> str:
    """What to do about a damaged checkpoint: rebuild a bundled card, otherwise fetch or save it again."""
    bundled = [e for e in registry.CARDS.values() if e.bundled and e.path.resolve() == directory.resolve()]
    if bundled:
        rebuild = bundled[0].rebuild
        return "reinstall the package that ships it" + (f", or rebuild the card with `{rebuild}`" if rebuild else "")
    remedy = f"re-download {model_id!r} or save it again (save_card) from where it was trained"
    entry = registry.CARDS.get(model_id)
    if entry is not None and entry.bundled:
        remedy += f" (a copy of the bundled card: copy jaxpipe.cards.path({model_id!r}) again)"
    return remedy


def _verify(directory: Path, meta: dict) -> None:
    """Raise ``CardIntegrityError`` unless every weights file has the digest ``config.json`` records."""
    digests = meta.get(DIGESTS_KEY)
    if not digests:
        _log.debug("%s: no weights digests in %s (saved before digests existed); not verified", directory, CONFIG_FILE)
        return
    if not isinstance(digests, dict) or not all(isinstance(v, str) and Path(k).name == k for k, v in digests.items()):
        raise ValueError(
            f"{directory / CONFIG_FILE}: {DIGESTS_KEY!r} must map file names in the folder to 'sha256:<hex>'"
        )
    for name, expected in digests.items():
        path = directory / name
        found = _file_digest(path)
        if found != expected:
            raise CardIntegrityError(
                f"{path} is damaged: its SHA-256 is {found.removeprefix('sha256:')[:12]}..., {CONFIG_FILE} records "
                f"{expected.removeprefix('sha256:')[:12]}...; {_remedy(directory, meta.get('model_id'))}"
            )


def write_digests(directory: str | os.PathLike) -> Path:
    """Record the SHA-256 of a checkpoint's weights file in its ``config.json`` (the weights are not touched).

    For a folder saved before digests existed, or one whose weights were replaced on purpose. The
    config is rewritten in ``save_card``'s layout, so ``save_card`` of the same card gives the same file.

    Args:
      directory: a ``save_card`` folder.

    Returns:
      The path of the rewritten ``config.json``.

    Raises:
      FileNotFoundError: ``directory`` is not a card checkpoint.
    """
    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{directory} is not a card checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    return _write_config(directory, json.loads((directory / CONFIG_FILE).read_text()))


def _write_config(directory: Path, meta: dict) -> Path:
    """Write ``meta`` as the folder's ``config.json`` with the digest of its weights file as it is now."""
    meta[DIGESTS_KEY] = {WEIGHTS_FILE: _file_digest(directory / WEIGHTS_FILE)}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return directory / CONFIG_FILE


def _arrays(components) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in _flat(nnx.state(dict(components))).items()}


def _load_base(base: str, where) -> Card:
    from jaxpipe import cards

    try:
        return cards.load(base)
    except CardIntegrityError:
        raise  # already names the damaged file and what to do
    except (KeyError, FileNotFoundError, ValueError) as err:
        raise FileNotFoundError(f"{where}: the base card {base!r} cannot be loaded: {err}") from None


def _base_arrays(base_card: Card, names: Sequence[str], base: str, where) -> dict[str, np.ndarray]:
    missing = [n for n in names if n not in base_card.components]
    if missing:
        raise ValueError(
            f"{where}: the base card {base!r} has no component(s) {missing} (it has {sorted(base_card.components)})"
        )
    return _arrays({n: base_card[n] for n in names})


def save_card(
    card: Card,
    directory: str | os.PathLike,
    *,
    base: str | None = None,
    base_components: Sequence[str] = (),
) -> Path:
    """Write ``card`` to ``directory`` as ``config.json`` + ``weights.safetensors``.

    ``config.json`` records the SHA-256 of the weights file, which ``load_card`` verifies.

    Args:
      card: the card to save; its family must be registered (``load_card`` rebuilds it from there).
      directory: the folder to write (created if needed; a checkpoint already there is overwritten).
      base: a card ``jaxpipe.cards.load`` accepts (a bundled id such as ``"flux-t2i"`` is the
        portable choice) whose same-named components ``card`` shares; ``None`` stores everything.
      base_components: the components taken from ``base`` and not stored (required with ``base``).
        Each must be bit-for-bit identical to the base card's, or nothing is written.

    Returns:
      ``directory``, as a ``Path``.

    Raises:
      ValueError: if ``card``'s family is not registered; if ``base_components`` is given without ``base``,
        or does not name distinct components of ``card``; if ``base`` is ``directory`` itself; or if a
        component in ``base_components`` is missing from the base card or differs from its.
      FileNotFoundError: if the base card cannot be loaded.
      CardIntegrityError: if the base card's weights are damaged.
    """
    registry.family(card.spec.family)  # fail before writing anything for a family that cannot be loaded
    directory = Path(directory)
    arrays = _arrays(card.components)
    meta = {
        "format": FORMAT,
        "model_id": card.model_id,
        "family": card.spec.family,
        "config": config_to_dict(card.spec.config),
    }
    if base is None:
        if base_components:
            raise ValueError("base_components needs base= (the card to take them from)")
    else:
        names = tuple(base_components)
        unknown = [n for n in names if n not in card.components]
        if not names or unknown or len(set(names)) != len(names):
            raise ValueError(
                f"base_components must name distinct components of {card.model_id!r} ({sorted(card.components)}); got {list(names)}"
            )
        entry = registry.card_entry(base)
        base_dir = entry.path if entry is not None and entry.bundled else Path(os.fspath(base))
        if base_dir.resolve() == directory.resolve():
            raise ValueError(f"a card cannot be its own base ({base!r} is {directory})")
        shared = _base_arrays(_load_base(base, directory), names, base, directory)
        ours = {k: v for k, v in arrays.items() if k.split("/", 1)[0] in names}
        differ = sorted(
            {k.split("/", 1)[0] for k in set(ours) ^ set(shared)}
            | {
                k.split("/", 1)[0]
                for k in ours.keys() & shared.keys()
                if ours[k].dtype != shared[k].dtype
                or ours[k].shape != shared[k].shape
                or ours[k].tobytes() != shared[k].tobytes()
            }
        )
        if differ:
            raise ValueError(
                f"components {differ} of {card.model_id!r} differ from the base card {base!r}'s; "
                f"save them (leave them out of base_components) or save without base"
            )
        arrays = {k: v for k, v in arrays.items() if k not in ours}
        meta.update(base=base, base_components=list(names), base_digest=_digest(shared))
    directory.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(directory / WEIGHTS_FILE), metadata={"format": FORMAT})
    _write_config(directory, meta)
    return directory


def abstract_card(directory: str | os.PathLike) -> Card:
    """The card a ``save_card`` directory holds, built abstractly from its config alone (no weights read).

    Cheap: gives the card's spec, loops and parameter count without allocating or reading weights.

    Args:
      directory: a ``save_card`` folder.

    Returns:
      The card, its variables' values ``jax.ShapeDtypeStruct`` leaves.

    Raises:
      FileNotFoundError: if ``directory`` is not a card checkpoint.
      ValueError: if its ``config.json`` is damaged, of another format, or does not load for its family
        (also if that family is not registered).
    """
    return _read_config(Path(directory))[2]


def _read_config(directory: Path, *, verify: bool = False):
    """``(meta, family, abstract card)`` of a checkpoint directory, with clear errors for a damaged one;
    ``verify`` checks the weights' digests first (a damaged file fails before any building)."""
    if not (directory / CONFIG_FILE).is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{directory} is not a card checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        meta = json.loads((directory / CONFIG_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{directory / CONFIG_FILE} is not valid JSON ({err}): the checkpoint is damaged") from None
    if not isinstance(meta, dict) or not {"family", "model_id", "config"} <= set(meta):
        raise ValueError(f"{directory / CONFIG_FILE} is not a card config (needs family, model_id and config)")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{directory}: unsupported checkpoint format {meta.get('format')!r} (expected {FORMAT!r})")
    if verify:
        _verify(directory, meta)
    family = registry.family(meta["family"])
    saved = meta["config"]
    if meta["family"] in registry.UPGRADES:
        saved = registry.UPGRADES[meta["family"]](saved)
    try:
        config = config_from_dict(family.config, saved)
        graphdef, state, spec = _abstract_build(family, config, meta["model_id"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{directory / CONFIG_FILE}: its {meta['family']} config does not load: {err}") from None
    return meta, family, Card(nnx.merge(graphdef, state), spec)


@functools.lru_cache(maxsize=64)
def _abstract_build(family: registry.Family, config: Any, model_id: str) -> tuple[Any, Any, Any]:
    """``(graphdef, abstract state, spec)`` of ``family.build(config)``, traced once per process: tracing a
    family's constructor costs about a second (far more than reading its weights), and a process loads the
    same few cards again and again (an engine per test, ``jaxpipe cards``). Callers merge a fresh module graph."""
    abstract = nnx.eval_shape(lambda: family.build(config, seed=0, model_id=model_id))
    graphdef, state = nnx.split(abstract.components)
    return graphdef, state, abstract.spec


def load_card(directory: str | os.PathLike) -> Card:
    """Load a card written by ``save_card`` (taking its base components from its base card, if any).

    Args:
      directory: the folder ``save_card`` wrote (``config.json`` + ``weights.safetensors``).

    Returns:
      The card, its weights verified against the digests ``config.json`` records (a folder saved
      before digests existed is loaded unverified).

    Raises:
      CardIntegrityError: a weights file's SHA-256 is not the one ``config.json`` records.
    """
    directory = Path(directory)
    meta, family, abstract = _read_config(directory, verify=True)
    graphdef, state = nnx.split(abstract.components)
    try:
        stored = load_file(str(directory / WEIGHTS_FILE))
    except Exception as err:  # safetensors raises its own SafetensorError (and OSError) on a damaged file
        raise ValueError(
            f"{directory / WEIGHTS_FILE} cannot be read ({err}): the checkpoint is damaged or truncated"
        ) from None
    expected = _flat(state)
    source = {name: f"{directory / WEIGHTS_FILE}" for name in stored}
    if meta.get("base") is not None:
        base, names = meta["base"], tuple(meta.get("base_components") or ())
        shared = _base_arrays(_load_base(base, directory), names, base, directory)
        overlap = sorted(set(shared) & set(stored))
        if overlap:
            raise ValueError(f"{directory}: {overlap} are stored and also taken from the base card {base!r}")
        if meta.get("base_digest") not in (None, _digest(shared)):
            warnings.warn(
                f"{directory}: the base card {base!r}'s components {list(names)} are not the weights this card was "
                f"saved with (the base was changed since); loading them anyway",
                stacklevel=2,
            )
        stored = {**stored, **shared}
        source.update({name: f"the base card {base!r}" for name in shared})
    missing, extra = sorted(set(expected) - set(stored)), sorted(set(stored) - set(expected))
    if missing or extra:
        raise ValueError(
            f"{directory}: weights do not match the {meta['family']} config: missing {missing}, unexpected {extra}"
        )
    leaves = []
    for name, spec in expected.items():
        if tuple(stored[name].shape) != tuple(spec.shape):
            raise ValueError(
                f"{directory}: {name} (from {source[name]}) has shape {stored[name].shape}, the config expects {spec.shape}"
            )
        leaves.append(jnp.asarray(stored[name], spec.dtype))
    state = jax.tree.unflatten(jax.tree.structure(state), leaves)
    return Card(nnx.merge(graphdef, state), abstract.spec)
