"""Writes the API reference (and the results page) at build time: one page per jaxpipe module (``::: module``), so every module and
every name in its ``__all__`` is in the reference without a hand-kept list (mkdocs-gen-files)."""

import pkgutil
from pathlib import Path

import mkdocs_gen_files

import jaxpipe

nav = mkdocs_gen_files.Nav()
modules = ["jaxpipe"] + sorted(
    m.name for m in pkgutil.walk_packages(jaxpipe.__path__, "jaxpipe.") if not m.name.endswith("__main__")
)
for name in modules:
    parts = tuple(name.split("."))
    page = "/".join(parts) + ".md"
    nav[parts] = page
    with mkdocs_gen_files.open(f"api/{page}", "w") as f:
        f.write(f"::: {name}\n")
with mkdocs_gen_files.open("api/SUMMARY.md", "w") as f:
    f.writelines(nav.build_literate_nav())

# benchmarks/RESULTS.md, as a page: its figure links point next to it or into docs/img/, the site keeps figures in img/
results = (Path(__file__).parents[1] / "benchmarks" / "RESULTS.md").read_text().replace("](../docs/img/", "](img/")
with mkdocs_gen_files.open("results.md", "w") as f:
    f.write(
        "# Benchmark results\n\nEvery measurement behind the numbers in these pages, as the benchmarks in "
        "`benchmarks/` wrote them (`benchmarks/RESULTS.md`).\n\n"
        + results.replace("](nft_vs_grpo.png)", "](img/nft_vs_grpo.png)")
    )
