"""The API reference has no empty entries: every module says what it is and lists its public names in
``__all__``; every public function, class and method defined in jaxpipe has a docstring with a summary
line, and functions that take arguments document them (Google style: ``Args:``).

The docs site's reference (``docs/api/``) is generated from exactly these names, so this test is what
keeps it complete.
"""

import importlib
import inspect
import pkgutil

import pytest

import jaxpipe

MODULES = sorted(m.name for m in pkgutil.walk_packages(jaxpipe.__path__, "jaxpipe.") if not m.name.endswith("__main__"))


def _own(module, obj) -> bool:
    return getattr(obj, "__module__", None) == module.__name__


def _public_members(cls):
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            yield name, member


def _takes_arguments(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return any(
        p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()
    )


def _problems(module) -> list[str]:
    problems = []
    if not (module.__doc__ or "").strip():
        problems.append("no module docstring")
    names = getattr(module, "__all__", None)
    if names is None:
        return [*problems, "no __all__"]
    for name in names:
        if not hasattr(module, name):
            problems.append(f"__all__ names {name!r}, which it does not define")
            continue
        obj = getattr(module, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not _own(module, obj):
            continue  # constants, re-exports (documented where they are defined)
        doc = inspect.getdoc(obj) or ""
        if not doc.strip():
            problems.append(f"{name}: no docstring")
        elif inspect.isfunction(obj) and _takes_arguments(obj) and "Args:" not in doc:
            problems.append(f"{name}: no Args: section")
        if inspect.isclass(obj):
            for member_name, member in _public_members(obj):
                if not (inspect.getdoc(member) or "").strip():
                    problems.append(f"{name}.{member_name}: no docstring")
    return problems


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_is_documented(module_name):
    module = importlib.import_module(module_name)
    assert _problems(module) == []


def test_the_lazy_training_names_are_visible_to_static_analysis():
    """``jaxpipe.training`` imports its names on first use; its ``TYPE_CHECKING`` imports (what the API
    reference and type checkers read) name the same objects from the same modules, and ``fit`` is the function."""
    import ast

    import jaxpipe.training as training
    import jaxpipe.training.fit  # noqa: F401  (a submodule import must not shadow the function)

    assert callable(training.fit) and training.fit.__name__ == "fit"
    tree = ast.parse(inspect.getsource(training))
    static = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert static == training._LAZY
    assert set(training.__all__) == set(training._LAZY) | {"fit"}
    for name in training.__all__:
        getattr(training, name)
