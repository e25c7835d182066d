"""The dependency rule, checked on the source: imports point down the layers; the core never imports a world.

A world (``jaxpipe.digits``, ``jaxpipe.shapes``) is a plug-in: only the world itself and ``jaxpipe.worlds``
(the one place that registers the bundled worlds) may import it — the command line and the server reach a
world through the registries — and one world never imports another. The engine never imports training. Checked
statically (every import statement of every module, including the ones inside functions) and by
importing the whole core with both worlds blocked. The house rules beside them: no module over 500 lines, and
every ``__post_init__`` checks its fields through ``jaxpipe.validate``.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "jaxpipe"
WORLD = "jaxpipe.digits"
WORLDS = ("jaxpipe.digits", "jaxpipe.shapes")
ALLOWED_TO_IMPORT_THE_WORLD = ("jaxpipe/digits/", "jaxpipe/shapes/", "jaxpipe/worlds.py")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module an ``import`` / ``from ... import`` of ``path`` names (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


SOURCES = sorted(ROOT.rglob("*.py"))


def _core():
    for path in SOURCES:
        rel = path.relative_to(ROOT.parent).as_posix()
        if not rel.startswith(ALLOWED_TO_IMPORT_THE_WORLD):
            yield rel, path


def _names_a_world(module: str, worlds=WORLDS) -> bool:
    return any(module == w or module.startswith(w + ".") for w in worlds)


def test_no_core_module_imports_a_world():
    offenders = {rel: sorted(m for m in _imports(path) if _names_a_world(m)) for rel, path in _core()}
    offenders = {rel: mods for rel, mods in offenders.items() if mods}
    assert not offenders, f"core modules import a world: {offenders}"
    assert len(list(_core())) > 80  # the check saw the core


def test_no_world_imports_another():
    for world in WORLDS:
        others = tuple(w for w in WORLDS if w != world)
        paths = sorted((ROOT / world.split(".")[1]).rglob("*.py"))
        offenders = {p.name: sorted(m for m in _imports(p) if _names_a_world(m, others)) for p in paths}
        assert len(paths) > 5 and not {k: v for k, v in offenders.items() if v}, (world, offenders)


def test_the_engine_never_imports_training_and_samplers_import_only_jax():
    engine = {p.relative_to(ROOT.parent).as_posix(): _imports(p) for p in (ROOT / "engine").rglob("*.py")}
    assert engine and not {rel: m for rel, mods in engine.items() for m in mods if m.startswith("jaxpipe.training")}
    own = {m for m in _imports(ROOT / "samplers.py") if m.startswith("jaxpipe")}
    assert own == set(), own


def test_the_core_imports_and_builds_with_the_world_blocked():
    """Every core module imports with both worlds unimportable; the registries then know no bundled
    card, and a toy card with a vocabulary of its own builds (``test_own_reward`` trains one)."""
    script = r"""
import importlib, pkgutil, sys
sys.modules["jaxpipe.digits"] = None          # any import of a world now fails
sys.modules["jaxpipe.shapes"] = None
import jaxpipe as jp
import jaxpipe.training
skipped = ("jaxpipe.digits", "jaxpipe.shapes", "jaxpipe.cli", "jaxpipe.worlds")
names = [m.name for m in pkgutil.walk_packages(jaxpipe.__path__, "jaxpipe.") if not m.name.startswith(skipped)]
for name in names:
    if not name.endswith("__main__"):
        importlib.import_module(name)
assert jp.cards.available() == [], jp.cards.available()
from jaxpipe.cards import toy_t2i
card = toy_t2i.build(toy_t2i.Config(vocabulary=("red", "blue", "circle", "square")), model_id="shapes-t2i")
assert card.model_id == "shapes-t2i" and card.num_params() > 0
print("ok", len(names))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout


def test_the_world_is_registered_lazily():
    """Importing the registries (or jaxpipe) does not import the world; asking for a bundled card does."""
    script = """
import sys
import jaxpipe.worlds
import jaxpipe.cards.registry
assert "jaxpipe.digits" not in sys.modules and "jaxpipe.shapes" not in sys.modules
import jaxpipe as jp
assert "jaxpipe.digits" not in sys.modules and "jaxpipe.shapes" not in sys.modules
assert "flux-t2i" in jp.cards.available() and "jaxpipe.digits" in sys.modules
assert "shapes-t2i" in jp.cards.available() and "jaxpipe.shapes" in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow  # ~12 s: a compatibility path; by default every bundled card loads
def test_a_checkpoint_saved_under_an_old_family_name_loads_with_a_warning(tmp_path):
    """jaxpipe 0.1 saved ``multi_expert`` cards with slots named by attribute; they load as ``toy_multi_expert``."""
    import json

    import jax
    import numpy as np

    import jaxpipe as jp
    from jaxpipe.digits import cards as digit_cards

    card = digit_cards.multi_expert(jp.cards.build("unified"), 3)
    jp.cards.save_card(card, tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["family"], meta["config"]["slots"] = "multi_expert", ["stroke", "position", "brightness"]
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.warns(DeprecationWarning, match="'multi_expert' is now 'toy_multi_expert'"):
        loaded = jp.cards.load(tmp_path)
    assert loaded.spec.family == "toy_multi_expert" and loaded.spec.config == card.spec.config
    for a, b in zip(jax.tree.leaves(card.components), jax.tree.leaves(loaded.components)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


MAX_LINES = 500


def test_no_module_is_over_500_lines():
    """One concept per file: a module that outgrows 500 lines is split by responsibility."""
    long = {
        p.relative_to(ROOT.parent).as_posix(): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_post_init_checks_through_validate():
    """A config's field rules are written once, in ``jaxpipe.validate``: no ``__post_init__`` raises by hand."""
    seen, bare = 0, []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "__post_init__":
                seen += 1
                rel = path.relative_to(ROOT.parent).as_posix()
                bare += [f"{rel}:{n.lineno}" for n in ast.walk(node) if isinstance(n, ast.Raise)]
    assert seen > 60 and not bare, f"__post_init__ raising by hand (use jaxpipe.validate): {bare}"


def test_the_cli_and_serve_import_no_world():
    """Worlds plug into the product layer through ``jaxpipe.worlds`` and the registries, never by import."""
    paths = sorted((ROOT / "cli").rglob("*.py")) + sorted((ROOT / "serve").rglob("*.py"))
    offenders = {p.name: sorted(m for m in _imports(p) if _names_a_world(m)) for p in paths}
    assert len(paths) > 15 and not {k: v for k, v in offenders.items() if v}, offenders
