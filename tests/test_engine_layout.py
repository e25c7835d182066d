"""The engine's layout: the scheduler reaches no engine private, a mode is a strategy object, and no module of the
engine or the server is over 500 lines."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "jaxpipe"
SCHEDULER = ROOT / "engine" / "scheduler.py"


def _privates_touched(source: str) -> list[str]:
    """``x._name`` attribute uses where ``x`` is not ``self``, and imports of ``_name``s from other modules."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id == "self"):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
        if isinstance(node, ast.ImportFrom):
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
    return sorted(found)


def test_the_scheduler_touches_no_engine_private():
    source = SCHEDULER.read_text()
    assert _privates_touched(source) == []
    # the same rule by text: no `name._private` on anything but self
    assert [m.group(0) for m in re.finditer(r"\b(?!self\b)\w+\._[a-z]\w*", source)] == []
    assert "jaxpipe.engine.engine" not in source  # it never imports the engine, it sees only the Served protocol


def test_the_check_would_catch_a_private():
    assert _privates_touched("engine._cards\nfrom jaxpipe.engine.engine import _Host\nself._ok\n") == [
        "engine._cards (line 1)",
        "from jaxpipe.engine.engine import _Host",
    ]


def test_modes_are_strategies_not_strings():
    from jaxpipe.engine import strategies

    for mode in strategies.MODES:
        assert strategies.make(mode, 4).name == mode
    for path in (SCHEDULER, ROOT / "engine" / "engine.py"):
        source = path.read_text()
        assert not re.search(r"mode\s*[!=]=", source), path.name  # no branch on a mode string


@pytest.mark.parametrize("path", sorted([*(ROOT / "engine").glob("*.py"), *(ROOT / "serve").glob("*.py")]), ids=str)
def test_no_module_over_500_lines(path):
    assert len(path.read_text().splitlines()) <= 500, path.name
