"""``jp.generate``: the one pipeline call. A card, card id or workflow id plus prompts -> artifacts.

Every family renders through its program (``jaxpipe.cards.<family>/program.py``): the same nodes,
keys and loops the engine serves and the RL rollouts capture. For a card, ``generate`` runs the
program's **fused path** (one jitted function; each loop one ``lax.scan``; all prompts one batch).
A workflow id runs through an engine (``Engine.default()`` unless one is given), one request per
prompt. Either way the result has one shape for every family: a mapping from artifact name to
a batched array ``(B, ...)`` (``"text"``-like artifacts: a list of ``B`` strings).

The fused path agrees with the engine's step-driven modes within the C3 tolerance
(``jaxpipe.parity.TOLERANCE``), not bit for bit (XLA compiles a fused scan differently from a
standalone step); the same call with the same seeds gives the same bits (C1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxpipe import cards
from jaxpipe.card import Card
from jaxpipe.program import Program
from jaxpipe.request import Request

__all__ = ["generate"]


def _prompts(prompts: str | Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Sequence) or not all(isinstance(p, str) for p in prompts):
        raise TypeError(f"prompts must be a str or a list of str (got {prompts!r})")
    if not prompts:
        raise ValueError("prompts must name at least one prompt")
    return list(prompts)


def _seeds(seed: int | Sequence[int], n: int) -> list[int]:
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(n)]
    if isinstance(seed, (str, bytes)) or not isinstance(seed, (Sequence, np.ndarray)):
        raise TypeError(f"seed must be an int or one int per prompt (got {seed!r})")
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"seed: got {len(seeds)} seeds for {n} prompts")
    return seeds


def _images(image: Any, n: int) -> list[Any]:
    if image is None:
        return [None] * n
    if np.ndim(image) == 3:
        return [image] * n
    if np.ndim(image) != 4 or np.shape(image)[0] != n:
        raise ValueError(
            f"image: give one (H, W, C) image or one per prompt (B={n}, H, W, C); got shape {np.shape(image)}"
        )
    return [image[i] for i in range(n)]


def _stack(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out = {}
    for name in rows[0]:
        values = [row[name] for row in rows]
        out[name] = list(values) if isinstance(values[0], str) else jnp.stack([jnp.asarray(v) for v in values])
    return out


def generate(
    model: Card | str | os.PathLike,
    prompts: str | Sequence[str],
    *,
    seed: int | Sequence[int] = 0,
    num_steps: int | None = None,
    guidance: float | None = None,
    image: Any = None,
    inputs: Mapping[str, Any] | None = None,
    program: Program | None = None,
    engine: Any = None,
) -> dict[str, Any]:
    """Render ``prompts`` with ``model``: artifacts ``{name: (B, ...)}`` (e.g. ``"image"`` ``(B, H, W, C)``).

    Args:
      model: a ``Card``, a card id or checkpoint directory (``jp.cards.load``), or a workflow id
        (run by ``engine``).
      prompts: one prompt or several (``B``).
      seed: one int (prompt ``b`` uses ``seed + b``) or one seed per prompt.
      num_steps: the denoise steps (``None``: the card's default).
      guidance: the guidance scale (``None``: the card's default).
      image: a conditioning image ``(H, W, C)`` for every prompt, or ``(B, H, W, C)``.
      inputs: further request inputs (``{"temperature": 0}``, ``{"refine": False}``, ...).
      program: the card program to run (default: its family's).
      engine: the engine that serves a workflow id (default: ``Engine.default()``).

    Returns:
      ``{artifact name: (B, ...)}``; text-like artifacts (``"text"``, decoded ids) are lists of B strings.

    Raises:
      ValueError: on no prompts, a seed list of the wrong length, a badly shaped ``image``, or the
        request's own errors (unknown words, bad steps, wrong image shape ...), before anything runs;
        an ``EngineError`` (a ``ValueError``) if ``model`` names no card, checkpoint or served workflow.
    """
    prompts = _prompts(prompts)
    seeds, images = _seeds(seed, len(prompts)), _images(image, len(prompts))
    card = model if isinstance(model, Card) else None
    if card is None and engine is None:
        name = os.fspath(model)
        if name in cards.available() or os.path.isdir(name):
            card = cards.load(name)
    model_id = card.model_id if card is not None else os.fspath(model)
    requests = [
        Request(model_id, prompt=p, seed=s, num_steps=num_steps, guidance=guidance, image=im, inputs=dict(inputs or {}))
        for p, s, im in zip(prompts, seeds, images)
    ]
    if card is None:
        if engine is None:
            from jaxpipe.engine import Engine  # workflows run on an engine, which sits above this call

            engine = Engine.default()
        return _stack(engine.run_many(requests, mode="serial"))
    program = cards.registry.default_program(card) if program is None else program
    program.check(card)
    bounds = [program.bind(card, r) for r in requests]
    batched = program.run(card, bounds)
    host = _stack([dict(b.artifacts) for b in bounds]) if bounds[0].artifacts else {}
    return {**batched, **program.texts_of(card, batched), **host}
