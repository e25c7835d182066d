"""jaxpipe: multi-model generative pipelines and their joint RL post-training, in JAX.

Names and submodules are imported on first use (``jp.cards``, ``jp.Engine``, ``from jaxpipe import
Request``), so ``import jaxpipe`` does not load JAX: the ``jaxpipe`` command installs its Ctrl-C
handler before it does.
"""

import sys
import types
from importlib import import_module
from importlib.util import find_spec
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "Card": "jaxpipe.card",
    "CardSpec": "jaxpipe.card",
    "CardValidationError": "jaxpipe.card",
    "LoopSpec": "jaxpipe.card",
    "Output": "jaxpipe.request",
    "Request": "jaxpipe.request",
    "Program": "jaxpipe.program",
    "Stage": "jaxpipe.workflow",
    "Workflow": "jaxpipe.workflow",
    "Engine": "jaxpipe.engine",
}

if TYPE_CHECKING:  # the same names, for type checkers and the API reference (static analysis sees no __getattr__)
    from jaxpipe import cache, cards, loops, nn, parity, samplers
    from jaxpipe.card import Card, CardSpec, CardValidationError, LoopSpec
    from jaxpipe.engine import Engine
    from jaxpipe.generate import generate
    from jaxpipe.program import Program
    from jaxpipe.request import Output, Request
    from jaxpipe.workflow import Stage, Workflow


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and find_spec(f"jaxpipe.{name}") is not None:  # a submodule: jp.cards, jp.engine ...
        return import_module(f"jaxpipe.{name}")
    raise AttributeError(f"module 'jaxpipe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    # ``generate`` names the function and its submodule: importing ``jaxpipe.generate`` (as
    # ``jaxpipe.digits.quality`` does) binds the submodule on the package, which would shadow the
    # function; as a property of the package's class the name stays the function.
    @property
    def generate(self):
        return import_module("jaxpipe.generate").generate

    @generate.setter
    def generate(self, value) -> None:  # the import system binding the submodule: ignored
        pass


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Card",
    "CardSpec",
    "CardValidationError",
    "LoopSpec",
    "cards",
    "loops",
    "nn",
    "samplers",
    "Engine",
    "Output",
    "Program",
    "Request",
    "Stage",
    "Workflow",
    "cache",
    "generate",
    "parity",
]
