"""The checks a frozen config's ``__post_init__`` runs on its fields, written once.

Each field check takes the config and the names of its fields and raises a ``ValueError`` (a
``TypeError`` for :func:`instances`) naming the first field that fails, its value and what it must
be. ``optional=True`` lets a field be ``None``; ``prefix`` is put before each name in the message
(``prefix="Request."`` gives ``Request.seed must be ...``). A rule across fields is :func:`rule`::

    def __post_init__(self):
        validate.counts(self, "steps", "batch_size")        # ints >= 1
        validate.fractions(self, "cond_dropout")           # numbers in [0, 1]
        validate.one_of(self, "sampler", ("ode", "sde"))
        validate.rule(self.low < self.high, f"low must be < high (got {self.low}, {self.high})")
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

__all__ = ["counts", "finite", "fractions", "instances", "non_negative", "one_of", "positive", "rule", "within"]


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _fields(config: object, names: tuple[str, ...], optional: bool):
    for name in names:
        value = getattr(config, name)
        if value is None and optional:
            continue
        yield name, value


def _got(value) -> str:
    return f"(got {value!r})"


def counts(
    config: object,
    *names: str,
    minimum: int = 1,
    maximum: int | None = None,
    optional: bool = False,
    prefix: str = "",
) -> None:
    """Checks that each field of ``names`` is an int in ``[minimum, maximum]`` (a bool is not an int here).

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      minimum: the smallest allowed value.
      maximum: the largest allowed value (``None``: no bound).
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name, value in _fields(config, names, optional):
        integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if not integral or value < minimum or (maximum is not None and value > maximum):
            if maximum is not None:
                what = f"an int in [{minimum}, {maximum}]"
            else:
                what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
            raise ValueError(f"{prefix}{name} must be {what} {_got(value)}")


def positive(config: object, *names: str, optional: bool = False, prefix: str = "") -> None:
    """Checks that each field of ``names`` is a finite number ``> 0``.

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name, value in _fields(config, names, optional):
        if not _number(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{prefix}{name} must be a finite number > 0 {_got(value)}")


def non_negative(config: object, *names: str, optional: bool = False, prefix: str = "") -> None:
    """Checks that each field of ``names`` is a finite number ``>= 0``.

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name, value in _fields(config, names, optional):
        if not _number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{prefix}{name} must be a finite number >= 0 {_got(value)}")


def fractions(config: object, *names: str, optional: bool = False, prefix: str = "") -> None:
    """Checks that each field of ``names`` is a number in ``[0, 1]`` (a probability, a share).

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    within(config, *names, low=0.0, high=1.0, optional=optional, prefix=prefix)


def within(
    config: object,
    *names: str,
    low: float,
    high: float,
    open_high: bool = False,
    optional: bool = False,
    prefix: str = "",
) -> None:
    """Checks that each field of ``names`` is a number in ``[low, high]`` (``[low, high)`` with ``open_high``).

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      low: the smallest allowed value.
      high: the largest allowed value (excluded with ``open_high``).
      open_high: exclude ``high``.
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name, value in _fields(config, names, optional):
        if not _number(value) or not (low <= value < high if open_high else low <= value <= high):
            raise ValueError(f"{prefix}{name} must be in [{low}, {high}{')' if open_high else ']'} {_got(value)}")


def finite(config: object, *names: str, optional: bool = False, prefix: str = "") -> None:
    """Checks that each field of ``names`` is a finite number (not NaN or infinite).

    Args:
      config: the config whose fields are checked.
      *names: the field names.
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      ValueError: naming the first field that fails and its value.
    """
    for name, value in _fields(config, names, optional):
        if not _number(value) or not math.isfinite(value):
            raise ValueError(f"{prefix}{name} must be a finite number {_got(value)}")


def one_of(config: object, name: str, choices: Iterable, optional: bool = False, prefix: str = "") -> None:
    """Checks that the field ``name`` is one of ``choices``.

    Args:
      config: the config whose field is checked.
      name: the field name.
      choices: the allowed values.
      optional: let the field be ``None``.
      prefix: put before the name in the message.

    Raises:
      ValueError: naming the field, its value and the choices.
    """
    choices = tuple(choices)
    for _, value in _fields(config, (name,), optional):
        if value not in choices:
            listed = ", ".join(repr(c) for c in choices)
            raise ValueError(f"{prefix}{name} must be one of {listed} {_got(value)}")


def instances(
    config: object, kind: type | tuple[type, ...], *names: str, optional: bool = False, prefix: str = ""
) -> None:
    """Checks that each field of ``names`` is an instance of ``kind``.

    Args:
      config: the config whose fields are checked.
      kind: a type or a tuple of types.
      *names: the field names.
      optional: let a field be ``None``.
      prefix: put before each name in the message.

    Raises:
      TypeError: naming the first field that fails and its type.
    """
    for name, value in _fields(config, names, optional):
        if not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            wanted = " or ".join(k.__name__ for k in kinds)
            article = "an" if wanted[0] in "aeiou" else "a"
            raise TypeError(f"{prefix}{name} must be {article} {wanted} (got {type(value).__name__})")


def rule(ok: bool, message: str, error: type[Exception] = ValueError) -> None:
    """Checks a rule across fields (or any rule a field check cannot say): raises ``error(message)`` unless ``ok``.

    Args:
      ok: whether the rule holds.
      message: the one line the user reads when it does not (name the fields and their values).
      error: the exception type (``ValueError``; ``TypeError`` for a wrong kind of value).

    Raises:
      error: when ``ok`` is false.
    """
    if not ok:
        raise error(message)
