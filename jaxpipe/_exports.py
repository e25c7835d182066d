"""One source for a package's lazy exports: the names its ``if TYPE_CHECKING:`` block imports.

A package that imports its public names on first use (``__getattr__``) lists each once, as the static import a
type checker and the API reference read; ``typed_imports(__file__)`` turns that block into the name -> module
table the package's ``__getattr__`` imports from; ``deprecated`` answers the names renamed in this release
(for one release, with a ``DeprecationWarning``).
"""

from __future__ import annotations

import ast
import warnings
from importlib import import_module
from pathlib import Path

__all__ = ["deprecated", "typed_imports"]


def typed_imports(source_file: str) -> dict[str, str]:
    """``{name: module}`` of every ``from MODULE import NAME`` inside the module's top-level ``if TYPE_CHECKING:``.

    Args:
      source_file: the module's own file (its ``__file__``).

    Returns:
      The table, in the block's order.
    """
    tree = ast.parse(Path(source_file).read_text())
    table: dict[str, str] = {}
    for block in tree.body:
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING":
            for node in block.body:
                if isinstance(node, ast.ImportFrom) and node.module:
                    table.update({alias.asname or alias.name: node.module for alias in node.names})
    return table


def deprecated(module: str, renamed: dict[str, tuple[str, str]]):
    """A module ``__getattr__`` that still answers names renamed in this release, with a ``DeprecationWarning``.

    Args:
      module: the module's ``__name__`` (named in the warning and in the AttributeError of other names).
      renamed: ``{old name: (module of the new name, new name)}``.

    Returns:
      ``__getattr__(name)``: the new object under its old name, after warning; AttributeError for other names.
    """

    def __getattr__(name: str):
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, new = renamed[name]
        warnings.warn(
            f"{module}.{name} is deprecated: use {home}.{new} (the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(home), new)

    return __getattr__
