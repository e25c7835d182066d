"""Every Python code block of the README and the docs pages runs, so the documentation cannot drift from the code.

A page's blocks run in order in one namespace (a later block may use an earlier one's names), in a fresh
working folder. An HTML comment on the line before a block (invisible on the rendered page) changes how
it runs:

- ``<!-- docs-test: skip REASON -->``: not run (only for blocks that need what no test machine has, e.g. a
  real 24 GB checkpoint; the reason says so);
- ``<!-- docs-test: tiny-flux NAME -->``: first writes a tiny random diffusers ``FluxPipeline`` folder
  at ``NAME`` (needs the parity extra; skipped with the reason without it), so the block loads a real
  folder of the real layout;
- ``<!-- docs-test: tiny-wan-i2v NAME -->``: likewise a tiny random Wan 2.1 ``WanImageToVideoPipeline`` folder.

``<!-- docs-test: slow -->`` anywhere on a page runs that page in the slow tier (long training loops).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
DIRECTIVE = re.compile(r"<!-- docs-test: (\S+) ?(.*?) -->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced Python block: its page, first line, source and the directive above it (if any)."""

    page: Path
    line: int
    source: str
    directive: tuple[str, str] | None


def blocks(page: Path) -> list[Block]:
    """The ``python`` blocks of a Markdown page, in order, each with the ``docs-test`` directive above it."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directive = DIRECTIVE.search(before)
        found.append(
            Block(
                page,
                text.count("\n", 0, match.start()) + 2,
                match.group(1),
                (directive.group(1), directive.group(2)) if directive else None,
            )
        )
    return found


def _param(page: Path):
    slow = "<!-- docs-test: slow -->" in page.read_text()
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.slow] if slow else [])


def _tiny_flux(folder: Path) -> None:
    pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
    from test_real_pipelines import flux_pipeline

    flux_pipeline().save_pretrained(folder)


def _tiny_wan_i2v(folder: Path) -> None:
    pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
    from test_real_wan_i2v import i2v_pipeline

    i2v_pipeline().save_pretrained(folder)


@pytest.mark.parametrize("page", [_param(p) for p in PAGES if blocks(p)])
def test_the_pages_code_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in blocks(page):
        kind, arg = block.directive or ("", "")
        if kind == "skip":
            assert arg, f"{page.name}:{block.line}: a skipped block must say why"
            continue
        if kind == "tiny-flux":
            _tiny_flux(tmp_path / arg)
        elif kind == "tiny-wan-i2v":
            _tiny_wan_i2v(tmp_path / arg)
        elif kind and kind != "slow":  # the page's tier marker may sit right above its first block
            raise AssertionError(f"{page.name}:{block.line}: unknown docs-test directive {kind!r}")
        code = compile(block.source, f"{os.path.relpath(page, ROOT)}:{block.line}", "exec")
        try:
            exec(code, namespace)
        except Exception as err:
            raise AssertionError(f"the block at {page.relative_to(ROOT)}:{block.line} fails: {err!r}") from err


def test_the_collector_reads_directives(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip needs a GPU -->\n```python\nboom()\n```\n")
    found = blocks(page)
    assert [b.source for b in found] == ["x = 1\n", "boom()\n"] and [b.line for b in found] == [4, 9]
    assert found[0].directive is None and found[1].directive == ("skip", "needs a GPU")
