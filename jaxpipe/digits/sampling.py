"""What the digits world's quality measures share: rendering in batches, the seeds, the card's defaults.

Every measure renders item ``i`` with seed ``seed * 100_003 + i`` (``seeds``), in batches polled for a stop
between them (``in_batches``), and reports the steps and guidance it sampled with (``header``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.stopping import Stopped

__all__ = [
    "Rendering",
    "check_samples",
    "denoise_defaults",
    "header",
    "in_batches",
    "item_seeds",
    "parsed",
    "rendering",
]


class Rendering(NamedTuple):
    """How a measure renders its items: the keywords ``t2i_quality``, ``thinking_quality``, ``i2v_quality`` and
    ``t2v_quality`` take as ``**render``.

    Attributes:
      seed: the seed of the prompts (or picks) and of the generation seeds (``seed * 100_003 + i`` for item ``i``).
      num_steps: sampling steps (``None``: the card's default).
      guidance: guidance scale (``None``: the card's default).
      batch: items generated per call (each measure has its default).
      progress: show a progress bar.
      should_stop: polled between batches; once it returns True, ``Stopped`` is raised.
    """

    seed: int = 0
    num_steps: int | None = None
    guidance: float | None = None
    batch: int = 100
    progress: bool = False
    should_stop: Callable[[], bool] | None = None


def rendering(render: Mapping[str, object], *, batch: int) -> Rendering:
    """The ``Rendering`` a measure's ``**render`` keywords ask for.

    Args:
      render: the keywords (fields of ``Rendering``).
      batch: the measure's default batch.

    Returns:
      The ``Rendering``.

    Raises:
      TypeError: naming a keyword that is not a field of ``Rendering``.
    """
    unknown = sorted(set(render) - set(Rendering._fields))
    if unknown:
        fields = ", ".join(Rendering._fields)
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)} (a measure takes {fields})")
    return Rendering(**{"batch": batch, **render})


def check_samples(samples: int) -> None:
    """Raises ``ValueError`` unless ``samples`` > 0.

    Args:
      samples: how many items a measure renders.

    Raises:
      ValueError: naming ``samples``.
    """
    if samples <= 0:
        raise ValueError(f"samples must be > 0 (got {samples})")


def item_seeds(seed: int, start: int, stop: int) -> list[int]:
    """The generation seeds of items ``start..stop - 1`` of a measure seeded ``seed``: ``seed * 100_003 + i``.

    Args:
      seed: the measure's seed.
      start: the first item.
      stop: one past the last item.

    Returns:
      The seeds, one per item.
    """
    return [seed * 100_003 + i for i in range(start, stop)]


def in_batches(fn, n: int, batch: int, bar=None, should_stop: Callable[[], bool] | None = None) -> np.ndarray:
    """``fn(slice)`` over ``n`` items in batches of ``batch``, concatenated.

    Args:
      fn: ``slice -> array`` of the items in the slice.
      n: the items.
      batch: items per call.
      bar: a progress bar advanced by each batch (``None``: none).
      should_stop: polled between batches; once it returns True, ``Stopped`` is raised.

    Returns:
      The concatenated results, ``(n, ...)``.

    Raises:
      Stopped: once ``should_stop()`` is true.
    """
    parts = []
    for i in range(0, n, batch):
        if should_stop is not None and should_stop():
            raise Stopped()
        parts.append(np.asarray(fn(slice(i, min(i + batch, n)))))
        if bar is not None:
            bar.update(min(i + batch, n) - i)
    return np.concatenate(parts)


def denoise_defaults(card: Card):
    """The settings of the card's first sampling loop (``denoise``, ``chunk_rollout``, ...): what
    ``num_steps=None`` / ``guidance=None`` mean.

    Args:
      card: a card with a sampling loop.

    Returns:
      That loop's config (it has ``num_steps`` and ``guidance``).
    """
    return next(
        card.spec.loop(lp).config
        for lp in card.spec.recipe
        if hasattr(card.spec.loop(lp).config, "num_steps") and hasattr(card.spec.loop(lp).config, "guidance")
    )


def header(card: Card, samples: int, num_steps: int | None, guidance: float | None) -> dict:
    """The head of a measure's report: how many items, at which steps and guidance (``None``: the card's).

    Args:
      card: the card measured.
      samples: the items rendered.
      num_steps: the sampling steps asked for.
      guidance: the guidance scale asked for.

    Returns:
      ``{"samples", "num_steps", "guidance"}``.
    """
    defaults = None if num_steps and guidance else denoise_defaults(card)  # a card's loops are read only when needed
    return {"samples": samples, "num_steps": num_steps or defaults.num_steps, "guidance": guidance or defaults.guidance}


def parsed(texts) -> dict[str, np.ndarray]:
    """The labels caption ``texts`` name.

    Args:
      texts: captions (or thoughts) the card wrote.

    Returns:
      ``{"digit", *ATTRIBUTES: (N,) int}`` (-1: not named, or the text does not parse).
    """
    keys = ("digit",) + digits.ATTRIBUTES
    out = {k: np.full(len(texts), -1) for k in keys}
    for i, text in enumerate(texts):
        try:
            labels = digits.parse_caption(text)
        except ValueError:
            continue
        for k in keys:
            if labels[k] is not None:
                out[k][i] = labels[k]
    return out
