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


def test_the_lazy_training_names_are_visible_to_static_analysis(tmp_path):
    """``jaxpipe.training`` imports its names on first use from the one list its ``TYPE_CHECKING`` block holds (what
    the API reference and type checkers read); ``__all__`` names the same, and ``fit`` is the function."""
    import jaxpipe.training as training
    import jaxpipe.training.fit  # noqa: F401  (a submodule import must not shadow the function)
    from jaxpipe._exports import typed_imports

    assert callable(training.fit) and training.fit.__name__ == "fit"
    assert training._LAZY["FlowGRPO"] == "jaxpipe.training.methods.flow_grpo" and len(training._LAZY) > 30
    assert set(training.__all__) == set(training._LAZY) | {"fit"}
    for name in training.__all__:
        getattr(training, name)
    source = tmp_path / "pkg.py"
    source.write_text(
        "import os\nfrom typing import TYPE_CHECKING\nfrom a import outside\n"
        "if TYPE_CHECKING:\n    from b.c import One, Two as Three\n    import d\n"
    )
    assert typed_imports(str(source)) == {"One": "b.c", "Three": "b.c"}
