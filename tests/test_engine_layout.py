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


_CHANGES = {"register", "register_workflow", "unregister", "publish", "add_role"}


def _engine_changes(source: str) -> list[tuple[str, int]]:
    """Where ``source`` assigns to an engine's attribute or calls an engine method that changes what it serves:
    ``(enclosing function, line)``; an engine is a name or attribute called ``engine``."""

    def is_engine(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == "engine") or (
            isinstance(node, ast.Attribute) and node.attr == "engine"
        )

    found = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            targets = child.targets if isinstance(child, ast.Assign) else [getattr(child, "target", None)]
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                found.extend(
                    (where, child.lineno) for t in targets if isinstance(t, ast.Attribute) and is_engine(t.value)
                )
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                if child.func.attr in _CHANGES and is_engine(child.func.value):
                    found.append((where, child.lineno))
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_serve_never_changes_its_engine():
    """The app, its front and routes only read the engine and submit to it; serving a card's image-reading text
    programs next to it is the one change, made by whoever builds the engine (``register_text_programs``)."""
    changes = {
        path.name: [where for where, _ in _engine_changes(path.read_text())]
        for path in sorted((ROOT / "serve").glob("*.py"))
    }
    assert {name: found for name, found in changes.items() if found} == {"chat_models.py": ["_register_variant"]}
    assert _engine_changes("def f(front):\n    front.engine.mode = 'x'\n    engine.publish('a', {})\n") == [
        ("f", 2),
        ("f", 3),
    ]


def test_an_engine_s_settings_are_read_only():
    import jaxpipe as jp

    engine = jp.Engine(max_batch=4, mode="interleaved")
    for name, value in (("mode", "batched"), ("max_batch", 8)):
        with pytest.raises(AttributeError):
            setattr(engine, name, value)
    assert (engine.mode, engine.max_batch) == ("interleaved", 4)


def test_a_registry_change_is_a_new_state_applied_when_its_card_drains(t2i_card):
    from conftest import perturbed

    from jaxpipe.cache import FeatureCache
    from jaxpipe.engine.registry import Registry, Remove, Update

    registry = Registry(FeatureCache())
    registry.register(t2i_card, None, None, False, busy=False)
    registry.add_role("flux-t2i", "old", "transformer")
    first = registry.state
    new = perturbed(t2i_card["transformer"], seed=3)
    # while busy, a publish is a pending change value: the state is the same object, the card is held
    assert registry.publish("flux-t2i", {"transformer": new}, busy=True)["transformer"] == 1
    assert registry.state is first and registry.held() == {"flux-t2i"}
    assert registry.pending() == {"flux-t2i": {**first.residents["flux-t2i"].versions, "transformer": 1}}
    registry.apply(lambda model_id: False)  # not drained: nothing applies
    assert registry.state is first
    registry.apply(lambda model_id: True)
    assert registry.state is not first and registry.held() == frozenset()
    assert first.residents["flux-t2i"].versions["transformer"] == 0  # the old state is untouched
    assert registry.state.residents["flux-t2i"].versions["transformer"] == 1
    assert registry.state.residents["flux-t2i@old"].versions["transformer"] == 0  # in the role's scope: its own
    # a change applied to a state by hand gives the same next state, without the registry
    state, drops = Update("flux-t2i", _publish(registry, new)).apply(first)
    assert state.residents["flux-t2i"].versions["transformer"] == 1 and drops == (("flux-t2i", {"transformer"}),)
    state, drops = Remove("flux-t2i").apply(state)
    assert set(state.residents) == set() and drops == (("flux-t2i", None), ("flux-t2i@old", None))


def _publish(registry, transformer):
    from jaxpipe.engine.publish import checked

    return checked(registry.state.residents["flux-t2i"], {"transformer": transformer})
