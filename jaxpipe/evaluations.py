"""World evaluations: how ``jaxpipe evaluate --world W`` judges cards, registered by each world.

An ``Evaluation`` names the cards it judges (an image card and a video card, each with its default id and the
capability it needs) and ``judge(image_card, video_card, *, samples, seed, num_steps, guidance, progress,
should_stop) -> report`` (nested dicts of numbers). The command line asks this registry and imports no world.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

__all__ = ["Evaluation", "evaluation", "evaluations", "register_evaluation"]


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """How world ``world`` judges an image card and a video card.

    Attributes:
      world: the world's name.
      image: ``(default card id, capability)`` of the image card (``--model``), e.g. ``("flux-t2i", "t2i")``.
      video: ``(default card id, capability)`` of the video card (``--video-model``).
      judge: ``(image_card, video_card, *, samples, seed, num_steps, guidance, progress, should_stop) -> report``.
      samples: the default of ``samples`` (its unit is the world's: prompts, or prompts per category).
      description: one line on what it measures.
    """

    world: str
    image: tuple[str, str]
    video: tuple[str, str]
    judge: Callable[..., dict]
    samples: int
    description: str = ""


_EVALUATIONS: dict[str, Evaluation] = {}


def register_evaluation(new: Evaluation) -> Evaluation:
    """Add ``new`` under its world's name; a second one for the same world replaces the first.

    Args:
      new: the evaluation.

    Returns:
      ``new``.

    Raises:
      TypeError: if ``new`` is not an ``Evaluation``.
    """
    if not isinstance(new, Evaluation):
        raise TypeError(f"register_evaluation takes an Evaluation (got {type(new).__name__})")
    _EVALUATIONS[new.world] = new
    return new


def evaluations() -> dict[str, Evaluation]:
    """Every registered evaluation by world, after the bundled and installed worlds register theirs.

    Returns:
      ``{world: Evaluation}``.
    """
    from jaxpipe import worlds  # the worlds sit above this module and register into it

    worlds.load()
    return dict(_EVALUATIONS)


def evaluation(world: str) -> Evaluation:
    """The evaluation of ``world``.

    Args:
      world: a world name.

    Returns:
      Its ``Evaluation``.

    Raises:
      ValueError: naming the worlds that have one.
    """
    found = evaluations().get(world)
    if found is None:
        raise ValueError(f"--world must be one of {', '.join(sorted(evaluations()))} (got {world!r})")
    return found
