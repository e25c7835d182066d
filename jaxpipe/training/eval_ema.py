"""Deprecated home of ``EvalEMA``: it lives in ``jaxpipe.training.ema`` beside ``EMA`` (this module goes in the next release)."""

from jaxpipe._exports import deprecated

__all__: list[str] = []  # the names below answer with a DeprecationWarning

__getattr__ = deprecated(__name__, {name: ("jaxpipe.training.ema", name) for name in ("EvalEMA", "ROLE", "follow")})
