"""Rewards that hold weights pass them to the compiled step as arguments, never as constants.

A reward model closed over by a jitted step is traced with its weights as constants: they are embedded in
the compiled program (a PickScore ViT-H is 3.9 GB) and a second copy stays on the device. A reward that
holds weights says so by two members, and the trainers pass its weights to their jitted step instead:

- ``reward.weights``: a pytree of its arrays;
- ``reward.bind(weights)``: the same reward computing with ``weights`` (tracers, inside the step).

``weights_of(reward)`` is ``None`` for a reward without weights (a plain function, a host reward);
``bind(reward, weights)`` returns the reward itself then. ``jaxpipe.rewards.clip``'s CLIPScore / PickScore,
``jaxpipe.rewards.aesthetic``'s AestheticScore, ``combine`` of such rewards and the digits world's
scorer reward hold weights this way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["weights_of", "bind"]


def weights_of(reward: Any) -> Any:
    """The pytree of arrays ``reward`` computes with, or ``None`` if it holds none.

    Args:
      reward: any reward.

    Returns:
      ``reward.weights`` for a reward that holds weights, else ``None``.
    """
    return getattr(reward, "weights", None) if callable(getattr(reward, "bind", None)) else None


def bind(reward: Any, weights: Any) -> Any:
    """``reward`` computing with ``weights`` in place of its own (``None``: ``reward`` as it is).

    Args:
      reward: a reward.
      weights: a pytree shaped as ``weights_of(reward)`` (arrays or tracers), or ``None``.

    Returns:
      The bound reward.

    Raises:
      ValueError: if ``weights`` is given for a reward that holds none.
    """
    if weights is None:
        return reward
    if weights_of(reward) is None:
        raise ValueError(f"reward {reward!r} holds no weights to bind")
    return reward.bind(weights)
