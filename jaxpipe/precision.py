"""The compute-dtype policy of a card: networks in bfloat16, sampler math in float32 (FlowGRPO's recipe).

A card's precision is configuration, not a property of its arrays: every network config of a
family (``DiTConfig``, ``TextEncoderConfig``, ``AutoencoderConfig``, ``LMConfig``, ...) has a
``dtype`` field, the compute dtype of that network. ``with_dtype(card, "bfloat16")`` sets it on
every network config of the card's family config and rebuilds the modules around the card's own
weights (``nnx.eval_shape``: nothing is initialised). Because the dtype lives in
``card.spec.config``, ``save_card`` / ``load_card`` keep it.

What runs in which dtype under ``"bfloat16"``:

- networks: matmuls and convolutions take bfloat16 activations and bfloat16 parameters (each layer
  casts its float32 parameters on the way in); the residual streams are bfloat16;
- inside the networks, float32: LayerNorm statistics, attention logits and softmax, the sinusoidal
  time and position tables; every network returns float32 (velocities, logits, latents, images);
- outside the networks, float32: the sampler (``samplers``: Euler, SDE mean / std / log-prob),
  the denoise loop's state, the losses, log-probs, rewards and advantages.

``networks=("dit",)`` changes only the transformer: a bfloat16 denoiser next to a float32 text
encoder, autoencoder and refiner LM. That matters for joint RL: the denoiser's log-prob recompute
is the rollout's own bfloat16 program (``rollout.generator_stats``: exact, ratio == 1), but an
LM's is not (the rollout decodes token by token with a KV cache, the recompute is one causal
forward), so a bfloat16 LM's token ratio starts ~1e-3 off 1 (measured on the bundled unified: 1.4e-3;
float32: 1e-6).

Parameters: by default they stay float32 (``params=None`` keeps what the card stores). That is the
standard mixed-precision recipe and what ``FlowGRPO`` trains: float32 master weights and Adam
moments, a bfloat16 forward whose gradient flows back through the casts to float32. For serving,
``params="bfloat16"`` also stores the parameters in bfloat16 (half the memory; the matmuls see the
same bfloat16 values, only the norm scales and biases, applied in float32, are rounded).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.nn.layers import compute_dtype

__all__ = ["DTYPES", "cast_params", "check_dtype", "module_dtype", "network_dtypes", "with_dtype"]

DTYPES = ("float32", "bfloat16")
"""The compute dtypes a card's networks accept."""


def check_dtype(name: Any, what: str = "dtype") -> str:
    """``name`` if it is one of ``DTYPES``.

    Args:
      name: a dtype name.
      what: what the error message calls it.

    Returns:
      ``name``.

    Raises:
      ValueError: naming ``what``, if ``name`` is not one of ``DTYPES``.
    """
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"{what} must be one of {DTYPES} (got {name!r})")
    return name


def _is_config(value) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _walk(config, path: str):
    """``(path, network config)`` for every nested dataclass with a ``dtype`` field (tuples included)."""
    if isinstance(config, (tuple, list)):
        for i, item in enumerate(config):
            yield from _walk(item, f"{path}[{i}]")
        return
    if not _is_config(config):
        return
    names = {f.name for f in dataclasses.fields(config) if f.init}
    if "dtype" in names and isinstance(config.dtype, str):
        yield path, config
    for name in sorted(names - {"dtype"}):
        yield from _walk(getattr(config, name), f"{path}.{name}" if path else name)


def network_dtypes(config) -> dict[str, str]:
    """The compute dtype of every network config nested in a family ``config``.

    Args:
      config: a family config dataclass (nested dataclasses and tuples of them are walked).

    Returns:
      ``{field path: dtype}``, e.g. ``{"dit": "bfloat16", "text": "float32", "vae": "float32"}``
      (``"<config>"`` for ``config`` itself when it has a ``dtype``).
    """
    return {path or "<config>": cfg.dtype for path, cfg in _walk(config, "")}


def _replace_dtype(config, dtype: str, selected: frozenset[str] | None, path: str = ""):
    """``config`` with ``dtype`` on the network configs at ``selected`` paths (``None``: all of them)."""
    if isinstance(config, (tuple, list)):
        return type(config)(_replace_dtype(item, dtype, selected, f"{path}[{i}]") for i, item in enumerate(config))
    if not _is_config(config):
        return config
    fields = [f.name for f in dataclasses.fields(config) if f.init]
    changes = {
        name: _replace_dtype(getattr(config, name), dtype, selected, f"{path}.{name}" if path else name)
        for name in fields
        if name != "dtype"
    }
    changes = {k: v for k, v in changes.items() if v is not getattr(config, k)}
    chosen = selected is None or (path or "<config>") in selected
    if "dtype" in fields and isinstance(config.dtype, str) and chosen and config.dtype != dtype:
        changes["dtype"] = dtype
    return dataclasses.replace(config, **changes) if changes else config


def module_dtype(module: Any) -> str:
    """A network's compute dtype name, from its config (the digits networks keep it as ``cfg``, the
    real, reference-named ones as ``config``).

    Args:
      module: a network.

    Returns:
      Its config's ``dtype``; ``"float32"`` for a module without one.
    """
    config = getattr(module, "cfg", None) or getattr(module, "config", None)
    return getattr(config, "dtype", "float32")


def cast_params(card: Card, dtype: str) -> Card:
    """``card`` with every floating ``nnx.Param`` stored in ``dtype``.

    Non-parameter variables, such as an autoencoder's latent statistics, are left alone. The compute
    dtype is unchanged.

    Args:
      card: the card.
      dtype: one of ``DTYPES``.

    Returns:
      A new ``Card`` with the same spec.

    Raises:
      ValueError: if ``dtype`` is not one of ``DTYPES``.
    """
    target = compute_dtype(check_dtype(dtype, "params"))
    graphdef, params, rest = nnx.split(card.components, nnx.Param, ...)
    cast = lambda a: a.astype(target) if jnp.issubdtype(a.dtype, jnp.floating) else a
    return Card(nnx.merge(graphdef, jax.tree.map(cast, params), rest), card.spec)


def with_dtype(card: Card, dtype: str, *, networks: Sequence[str] | None = None, params: str | None = None) -> Card:
    """``card`` with its networks computing in ``dtype`` (``"float32"`` or ``"bfloat16"``), same weights.

    The family config's network configs get ``dtype`` (so checkpoints keep it) and the components
    are rebuilt around the card's own variables; loops, samplers and every network output stay
    float32. ``networks``: the config paths to change (keys of ``network_dtypes``, e.g. ``("dit",)``
    for a bfloat16 transformer next to a float32 text encoder, autoencoder and LM); ``None``: all.
    ``params``: also store every parameter of the card in that dtype (``None``: keep the stored
    dtype, float32 for the bundled cards: the master weights a trainer updates).

    Args:
      card: the card.
      dtype: the compute dtype, one of ``DTYPES``.
      networks: config paths to change, or ``None`` (all).
      params: the stored parameter dtype, or ``None`` (keep).

    Returns:
      A new ``Card`` (``card`` itself when nothing changes).

    Raises:
      ValueError: on an unknown dtype, a config without network dtypes, ``networks`` naming unknown or no
        configs, or components that do not match what the family builds from the config.
    """
    check_dtype(dtype)
    if params is not None:
        check_dtype(params, "params")
    config = card.spec.config
    known = network_dtypes(config)
    if not known:
        raise ValueError(
            f"card {card.model_id!r} ({card.spec.family}): its config has no network config with a dtype field, "
            "so its compute dtype cannot be set"
        )
    if isinstance(networks, str):
        networks = (networks,)
    unknown = sorted(set(networks or ()) - set(known))
    if unknown or (networks is not None and not networks):
        raise ValueError(
            f"networks must name some of card {card.model_id!r}'s network configs {sorted(known)} (got {networks})"
        )
    new_config = _replace_dtype(config, dtype, None if networks is None else frozenset(networks))
    if new_config is not config:
        family = registry.family(card.spec.family)
        abstract = nnx.eval_shape(lambda: family.build(new_config, seed=0, model_id=card.model_id))
        graphdef, expected = nnx.split(abstract.components)
        _, state = nnx.split(card.components)
        paths = lambda tree: [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
        if paths(expected) != paths(state):
            raise ValueError(
                f"card {card.model_id!r}: its components do not match what family {card.spec.family!r} builds from its "
                "config, so they cannot be rebuilt in another dtype"
            )
        card = Card(nnx.merge(graphdef, state), dataclasses.replace(card.spec, config=new_config))
    return card if params is None else cast_params(card, params)
