"""The checks a frozen config's ``__post_init__`` runs on its fields, written once.

Each takes the config and the names of its fields to check and raises a ``ValueError`` naming the
first field that fails, its value and what it must be::

    def __post_init__(self):
        validate.counts(self, "steps", "batch_size")        # ints >= 1
        validate.fractions(self, "cond_dropout")           # numbers in [0, 1]
"""

from __future__ import annotations

import math
import numbers

__all__ = ["counts", "fractions", "non_negative", "positive", "within"]


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def counts(config: object, *names: str, minimum: int = 1) -> None:
    """Checks that each field of ``names`` is an int ``>= minimum`` (a bool is not an int here).

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      minimum: the smallest allowed value.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
            what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            raise ValueError(f"{name} must be {what} (got {value!r})")


def positive(config: object, *names: str) -> None:
    """Checks that each field of ``names`` is a finite number ``> 0``.

    Args:
      config: the config whose fields are checked.
      *names: the field names.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name in names:
        value = getattr(config, name)
        if not _number(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0 (got {value!r})")


def non_negative(config: object, *names: str) -> None:
    """Checks that each field of ``names`` is a finite number ``>= 0``.

    Args:
      config: the config whose fields are checked.
      *names: the field names.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name in names:
        value = getattr(config, name)
        if not _number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0 (got {value!r})")


def fractions(config: object, *names: str) -> None:
    """Checks that each field of ``names`` is a number in ``[0, 1]`` (a probability, a share).

    Args:
      config: the config whose fields are checked.
      *names: the field names.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name in names:
        value = getattr(config, name)
        if not _number(value) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1] (got {value!r})")


def within(config: object, *names: str, low: float, high: float, open_high: bool = False) -> None:
    """Checks that each field of ``names`` is a number in ``[low, high]`` (``[low, high)`` with ``open_high``).

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      low: the smallest allowed value.
      high: the largest allowed value (excluded with ``open_high``).
      open_high: exclude ``high``.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name in names:
        value = getattr(config, name)
        if not _number(value) or not (low <= value < high if open_high else low <= value <= high):
            raise ValueError(f"{name} must be in [{low}, {high}{')' if open_high else ']'} (got {value!r})")
