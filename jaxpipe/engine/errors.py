"""The engine's errors."""

from __future__ import annotations

__all__ = ["EngineError", "UnknownComponentError"]


class EngineError(ValueError):
    """A request or registration the engine cannot serve (the message names the problem and what is allowed)."""


class UnknownComponentError(EngineError, KeyError):
    """A publish names a component the card does not have (also a ``KeyError``, as ``Card.replace`` raises)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""
