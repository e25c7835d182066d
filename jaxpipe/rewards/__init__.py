"""Bring your own reward: ``reward(artifacts, prompts) -> (B,)``, scored inside the RL trainers' jitted step.

``artifacts`` maps the program's rendered outputs to arrays with B rows (``{"image": (B, H, W, C)}``
in [0, 1], ``{"video": (B, T, H, W, C)}``, maybe ``"latents"``); ``prompts`` is the batch's
``jaxpipe.prompts.Prompts``, already repeated to the same B rows (row ``p·K + j`` is sample ``j``
of prompt ``p``). A reward is one of two kinds.

A **JAX reward** is a plain function, traced inside the step (``prompts`` holds arrays there). It
returns ``(B,)`` or named parts ``{name: (B,)}`` whose sum is the reward (trainers log each part)::

    def brightness(artifacts, prompts):
        return jnp.mean(artifacts["image"], axis=(1, 2, 3))

A **host reward** is plain Python (a PyTorch reward model, an OCR library, an HTTP reward server),
marked with ``@host``: it gets NumPy artifacts and the prompts as a ``list[str]`` with
``.metadata``, returns B numbers, and runs through ``jax.pure_callback``, so the step stays one
``jax.jit``::

    @jaxpipe.rewards.host
    def says_the_word(artifacts, prompts):
        words = ocr(artifacts["image"])                 # NumPy (B, H, W, C)
        return [float(p in w) for p, w in zip(prompts, words)]

A reward model holds its weights as a pytree (``weights`` / ``bind``: ``jaxpipe.rewards.weighted``), so the
trainers pass them to their jitted step as arguments instead of baking them into it.
``combine`` weighs several rewards into named parts, ``score`` calls a reward once and checks it,
and ``load("module:function")`` / ``load("path/to/file.py:function")`` finds one for a
``--reward`` flag. Reward models ship too, as JAX rewards loaded from a folder
(``load("pickscore:DIR")``, ``"clipscore:DIR"``, ``"aesthetic:DIR"``; ``jaxpipe.rewards.clip``,
``jaxpipe.rewards.aesthetic``); ``text_prompts`` gives the prompts to call one on outside a trainer.
A reward can also be another server's: ``load("http://HOST:PORT/v1/rewards?model=digit-scorer")`` is a
host reward that POSTs each batch there (``jaxpipe.rewards.remote``; ``jaxpipe serve`` serves them).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.prompts import Prompts, check, encode_text, text_width
from jaxpipe.rewards.hosted import VMAP_METHODS, HostPrompts, HostReward, host
from jaxpipe.rewards.weighted import bind, weights_of

__all__ = [
    "Reward",
    "HostPrompts",
    "HostReward",
    "VMAP_METHODS",
    "MODEL_KINDS",
    "MODEL_LOADERS",
    "register_model_kind",
    "host",
    "combine",
    "Combined",
    "weights_of",
    "bind",
    "score",
    "load",
    "spec_name",
    "text_prompts",
]

Reward = Callable[[Mapping[str, Any], Prompts], jax.Array | Mapping[str, jax.Array]]
"""``reward(artifacts, prompts) -> (B,)`` or ``{part: (B,)}``."""


def _name(reward: Any) -> str:
    return getattr(reward, "__qualname__", None) or getattr(reward, "__name__", None) or repr(reward)


def _rows(artifacts: Mapping[str, Any], prompts: Prompts | None) -> int:
    """B: the rows every artifact (and the prompts) share (ValueError naming the mismatch)."""
    rows = {
        jax.tree_util.keystr(path): np.shape(leaf)[0] if np.ndim(leaf) else None
        for path, leaf in jax.tree_util.tree_flatten_with_path(dict(artifacts))[0]
    }
    if prompts is not None:
        rows["prompts"] = len(prompts)
    if not rows:
        raise ValueError("score needs artifacts (or prompts) to know the batch size B")
    if len(set(rows.values())) != 1 or None in rows.values():
        hint = " (repeat the prompts to the rendered rows: prompts.repeat(K))" if "prompts" in rows else ""
        raise ValueError(f"the artifacts and prompts must share one leading batch axis B; got rows {rows}{hint}")
    return next(iter(rows.values()))


def _checked(value: Any, rows: int, what: str) -> jax.Array:
    value = jnp.asarray(value, jnp.float32)
    try:
        chex.assert_shape(value, (rows,))
    except AssertionError:
        raise ValueError(
            f"{what} returned shape {tuple(value.shape)}; a reward gives one value per rendered row, ({rows},)"
        ) from None
    return value


def score(
    reward: Reward, artifacts: Mapping[str, Any], prompts: Prompts | None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Call ``reward`` once and check it: ``(total (B,) float32, parts {name: (B,) float32})``.

    A reward returning ``(B,)`` has ``parts == {}``; one returning parts has ``total =
    sum(parts.values())`` in the reward's own order (the sum the trainers take, bit for bit).

    Args:
      reward: a JAX or host reward, ``reward(artifacts, prompts) -> (B,)`` or ``{part: (B,)}``.
      artifacts: the generated artifacts, ``{name: (B, ...)}``.
      prompts: the B prompts the artifacts were generated from, or ``None``.

    Returns:
      ``(total, parts)``: ``(B,)`` float32 and ``{name: (B,) float32}``.

    Raises:
      ValueError: naming the reward (and part) when it returns another shape, no parts, or when
        the artifacts' and prompts' rows differ.
    """
    rows = _rows(artifacts, prompts)
    out = reward(artifacts, prompts)
    if isinstance(out, Mapping):
        if not out:
            raise ValueError(f"reward {_name(reward)} returned no parts")
        parts = {name: _checked(value, rows, f"reward {_name(reward)} part {name!r}") for name, value in out.items()}
        return sum(parts.values()), parts
    return _checked(out, rows, f"reward {_name(reward)}"), {}


def combine(rewards: Mapping[str, Reward], weights: Mapping[str, float] | None = None) -> Reward:
    """One reward from several: it returns the weighted parts ``{name: weight · reward_name(...)}``.

    A reward that itself returns parts contributes each as ``"<name>/<part>"`` (times its weight).
    ``score`` of the result sums the parts; trainers log each separately.

    Args:
      rewards: ``{name: reward}`` (JAX or host rewards), in the order the parts are returned.
      weights: ``{name: weight}`` finite numbers; a name left out weighs 1.

    Raises:
      ValueError: no rewards, a name that is not a non-empty string, a weight for an unknown
        name, a non-finite weight, a reward that is not callable.
    """
    rewards = dict(rewards)
    if not rewards:
        raise ValueError("combine needs at least one reward")
    for name, reward in rewards.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"reward names must be non-empty strings (got {name!r})")
        if not callable(reward):
            raise ValueError(f"reward {name!r} is not callable (got {type(reward).__name__})")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(rewards), key=str)
    if unknown:
        raise ValueError(f"weights name unknown reward(s) {unknown}; the rewards are {list(rewards)}")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ValueError(f"weight of {name!r} must be a finite number (got {weight!r})")
    return Combined(rewards, {name: float(weights.get(name, 1.0)) for name in rewards})


class Combined:
    """``combine``'s reward: ``{name: weight · reward_name(...)}`` (a reward's own parts as ``"<name>/<part>"``).

    It holds the weights its rewards hold (``jaxpipe.rewards.weighted``): ``weights`` is ``{name: weights}``
    of those that hold some (``None`` when none does), ``bind`` binds each.
    """

    def __init__(self, rewards: Mapping[str, Reward], scale: Mapping[str, float]):
        self.rewards, self.scale = dict(rewards), dict(scale)
        self.__name__ = self.__qualname__ = (
            "combine(" + ", ".join(f"{name}={self.scale[name]:g}" for name in self.rewards) + ")"
        )

    def __repr__(self) -> str:
        return self.__name__

    @property
    def weights(self) -> dict[str, Any] | None:
        """``{name: weights}`` of the rewards that hold weights, or ``None``."""
        held = {name: weights_of(r) for name, r in self.rewards.items()}
        held = {name: w for name, w in held.items() if w is not None}
        return held or None

    def bind(self, weights: Mapping[str, Any]) -> Combined:
        """This reward with each named reward bound to ``weights[name]``."""
        return Combined({name: bind(r, weights.get(name)) for name, r in self.rewards.items()}, self.scale)

    def __call__(self, artifacts: Mapping[str, Any], prompts: Prompts) -> dict[str, jax.Array]:
        """The weighted parts ``{name: (B,)}``."""
        parts = {}
        for name, reward in self.rewards.items():
            out = reward(artifacts, prompts)
            named = {f"{name}/{part}": v for part, v in out.items()} if isinstance(out, Mapping) else {name: out}
            for key, value in named.items():
                if key in parts:
                    raise ValueError(f"combine: two rewards give a part named {key!r}; rename one")
                parts[key] = self.scale[name] * jnp.asarray(value, jnp.float32)
        return parts


def _import_file(path: Path, spec: str):
    if not path.is_file():
        raise ValueError(f"--reward {spec!r}: no reward file {path}")
    path = path.resolve()
    name = f"_jaxpipe_reward_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"--reward {spec!r}: cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(target: str, spec: str):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as err:
        if err.name and (target == err.name or target.startswith(err.name + ".")):
            raise ValueError(
                f"--reward {spec!r}: no module named {err.name!r} (is it on PYTHONPATH, or did you mean a .py file?)"
            ) from None
        raise


def _clip_model(kind: str):
    def load_clip(folder: Path, loaded: Mapping[tuple[str, str], Reward]) -> Reward:
        from jaxpipe.rewards import clip

        # clipscore:DIR and pickscore:DIR of one folder share its CLIPModel: read once
        other = loaded.get(("pickscore" if kind == "clipscore" else "clipscore", str(folder.resolve())))
        return getattr(clip, kind)(folder, model=None if other is None else other.model)

    return load_clip


def _aesthetic_model(folder: Path, loaded: Mapping[tuple[str, str], Reward]) -> Reward:
    from jaxpipe.rewards import aesthetic

    return aesthetic.load(folder)


MODEL_LOADERS: dict[str, Callable[[Path, Mapping[tuple[str, str], Reward]], Reward]] = {
    "clipscore": _clip_model("clipscore"),
    "pickscore": _clip_model("pickscore"),
    "aesthetic": _aesthetic_model,
}
"""Reward model kind -> ``(folder, the models loaded so far by (kind, folder)) -> Reward``: what ``load("KIND:DIR")``
loads (``jaxpipe.rewards.clip``, ``jaxpipe.rewards.aesthetic``); ``register_model_kind`` adds one."""
MODEL_KINDS = tuple(MODEL_LOADERS)
"""The reward model kinds ``load("KIND:DIR")`` knows, in registration order."""


def register_model_kind(kind: str, loader: Callable[[Path, Mapping[tuple[str, str], Reward]], Reward]) -> None:
    """Teach ``load`` (and ``--reward KIND:DIR``) a reward model kind.

    Args:
      kind: the name before the colon (no colon or path separator in it).
      loader: ``(folder, loaded) -> Reward``; ``loaded`` maps ``(kind, resolved folder)`` to the models already
        loaded, so kinds that share weights can reuse them.

    Raises:
      ValueError: if ``kind`` is empty, holds ``:`` or a path separator, or is registered already.
    """
    global MODEL_KINDS
    if not kind or ":" in kind or _is_path(kind):
        raise ValueError(f"a reward model kind is a plain name (got {kind!r})")
    if kind in MODEL_LOADERS:
        raise ValueError(f"reward model kind {kind!r} is registered already")
    MODEL_LOADERS[kind] = loader
    MODEL_KINDS = tuple(MODEL_LOADERS)


def _spec_forms() -> str:
    return (
        "'package.module:function', 'path/to/file.py:function', 'KIND:DIR' (KIND one of "
        + ", ".join(MODEL_KINDS)
        + ") or a reward server's URL 'http://HOST:PORT/v1/rewards?model=M'"
    )


_LOADED: dict[tuple[str, str], Reward] = {}


def _is_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.startswith((".", "~"))


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _model_spec(spec: str) -> tuple[str, str] | None:
    """``(kind, directory)`` when ``spec`` names a reward model (``KIND:DIR``), else ``None`` (a function spec).

    ``KIND:X`` is a model spec when ``X`` is a directory or a path, or no module ``KIND`` exists (so a
    module of yours named ``aesthetic`` with a function still loads as ``aesthetic:function``).
    """
    kind, _, where = spec.partition(":")
    if (
        kind in MODEL_LOADERS
        and where
        and (Path(where).expanduser().is_dir() or _is_path(where) or not _module_exists(kind))
    ):
        return kind, where
    return None


def _load_model(kind: str, where: str, spec: str) -> Reward:
    folder = Path(where).expanduser()
    if not folder.is_dir():
        raise ValueError(f"--reward {spec!r}: no {kind} model directory {folder}")
    key = (kind, str(folder.resolve()))
    if key in _LOADED:
        return _LOADED[key]
    try:
        reward = MODEL_LOADERS[kind](folder, _LOADED)
    except (FileNotFoundError, ValueError) as err:
        raise ValueError(f"--reward {spec!r}: {err}") from None
    _LOADED[key] = reward
    return reward


def spec_name(spec: str) -> str:
    """The name a ``--reward`` spec's reward is logged under: the kind of a ``KIND:DIR`` reward model
    (``"pickscore"``), the model of a reward server's URL (``"digit-scorer"`` for
    ``"http://HOST:PORT/v1/rewards?model=digit-scorer"``), else the function (``"brightness"`` for
    ``"my_rewards.py:brightness"``).

    Args:
      spec: a spec ``load`` takes.

    Returns:
      The name.

    Raises:
      ValueError: for a URL that names no model.
    """
    from jaxpipe.rewards.remote import is_url, url_model

    if is_url(spec):
        return url_model(spec)
    model = _model_spec(spec) if isinstance(spec, str) else None
    return model[0] if model else str(spec).rpartition(":")[2]


def text_prompts(texts: list[str] | tuple[str, ...], metadata: Mapping[str, Any] | None = None) -> Prompts:
    """``Prompts`` to call a reward on outside a trainer, without a card: the texts' bytes, no token ids.

    ``ids`` is ``(P, 0)`` (a reward model tokenises the text itself); for a card's ids use
    ``Prompts.from_texts(card, texts)``, which rewards take the same way.

    Args:
      texts: P prompt strings.
      metadata: optional ``{name: (P, ...)}`` numeric arrays.

    Returns:
      The checked ``Prompts``.

    Raises:
      TypeError, ValueError: as ``jaxpipe.prompts.encode_text`` and ``check``.
    """
    texts = list(texts)
    meta = {k: np.asarray(v) for k, v in (metadata or {}).items()}
    return check(Prompts(np.zeros((len(texts), 0), np.int32), encode_text(texts, text_width(texts)), meta))


def load(spec: str) -> Reward:
    """The reward named by ``spec``: ``"package.module:function"``, ``"path/to/file.py:function"``, a
    reward model ``"KIND:DIR"`` or a reward server's URL ``"http://HOST:PORT/v1/rewards?model=M"``.

    A ``.py`` path (or one with a path separator) is imported as a module of its own, once per
    file; ``function`` may be dotted (``"module:Class.method"``). It is returned as is: a JAX
    reward, or a host reward marked with ``@host``. ``KIND:DIR``, ``KIND`` one of ``MODEL_KINDS``,
    loads that reward model from the directory (``jaxpipe.rewards.clip.pickscore`` / ``clipscore``,
    ``jaxpipe.rewards.aesthetic.load``), once per kind and directory. An ``http://`` or ``https://``
    URL is a host reward asking that server's ``POST /v1/rewards`` for reward model ``M``
    (``jaxpipe.rewards.remote.remote``; nothing is sent until it is called).

    Args:
      spec: ``"package.module:function"``, ``"path/to/file.py:function"``, ``"pickscore:DIR"`` or a URL.

    Returns:
      The reward callable.

    Raises:
      ValueError: a spec without ``":"``, a module or file that is not found, a missing
        attribute, or one that is not callable; a reward model directory that does not exist or does
        not load (the reason named); an unknown reward model kind before a directory; a URL that is not
        http(s) or names no model.
    """
    from jaxpipe.rewards.remote import is_url, remote

    if is_url(spec):
        return remote(spec)
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"a reward is named {_spec_forms()} (got {spec!r})")
    model = _model_spec(spec)
    if model is not None:
        return _load_model(*model, spec)
    target, _, attribute = spec.rpartition(":")
    if not target or not attribute:
        raise ValueError(f"a reward is named {_spec_forms()} (got {spec!r})")
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    if not is_file and not _module_exists(target) and (_is_path(attribute) or Path(attribute).expanduser().is_dir()):
        raise ValueError(
            f"--reward {spec!r}: unknown reward model kind {target!r}; the kinds are {', '.join(MODEL_KINDS)} "
            f"(or name a function: 'package.module:function', 'path/to/file.py:function')"
        )
    module = _import_file(Path(target), spec) if is_file else _import_module(target, spec)
    value = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ValueError(f"--reward {spec!r}: {target} has no attribute {attribute!r}")
        value = getattr(value, part)
    if not callable(value):
        raise ValueError(f"--reward {spec!r}: {attribute!r} is a {type(value).__name__}, not a reward function")
    return value
