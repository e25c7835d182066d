"""The tour notebook (``examples/tour.ipynb``) runs headless, top to bottom, in a fresh kernel, and shows
what it says: images and the GIF inline, curves of both RL runs, the trained card served; no errors,
no warnings from the progress bars."""

import base64
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat, nbclient and ipykernel")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbformat, nbclient and ipykernel")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "tour.ipynb"


@pytest.mark.slow  # ~40 s; the docs build (`mkdocs build --strict`, in .ci/run) executes the notebook as well
def test_the_tour_notebook_runs_and_shows_its_results(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    scratch = tmp_path / "tmp"  # the kernel's temporary folder: the tour must leave nothing in it
    scratch.mkdir()
    client.execute(env={**os.environ, "TMPDIR": str(scratch)})
    assert not [p for p in scratch.iterdir() if p.name.startswith("jaxpipe-tour-")]
    assert "<your" not in notebook.cells[1].source  # the install cell works as written, no placeholder
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "IProgress" not in stderr and "Warning" not in stderr, stderr[-2000:]
    pngs = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    gifs = [o for o in outputs if o.output_type == "display_data" and "image/gif" in o.data]
    assert len(pngs) == 4  # the prompts, the FlowGRPO curves, the per-expert curves, the trained card next to its base
    assert len(gifs) == 1 and base64.b64decode(gifs[0].data["image/gif"])[:6] == b"GIF89a"
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "seven thick left -> seven moving right (8, 16, 16, 1)" in text
    assert "done 24 steps" in text
    assert "'flow_grpo'" in text and "'flux-t2i'" in text  # the trained card served next to its base


def test_progress_bars_in_a_kernel_without_ipywidgets_warn_nothing():
    """``tqdm.auto`` warns "IProgress not found" in a kernel without ipywidgets; jaxpipe's bars do not."""
    code = [
        "import sys; sys.modules['ipywidgets'] = None  # as if ipywidgets were not installed",
        "import warnings; warnings.simplefilter('always')\n"
        "import jax.numpy as jnp, jax\n"
        "from jaxpipe.training.fit import fit\n"
        "def step(state, batch, key):\n"
        "    return state + batch, {'loss': state}\n"
        "def batches():\n"
        "    while True:\n"
        "        yield jnp.ones(())\n"
        "state, rows = fit(step, jnp.zeros(()), batches(), steps=3, key=jax.random.key(0), desc='bar')\n"
        "print(len(rows), float(state))",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in code])
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute(env={**os.environ})
    outputs = [out for cell in notebook.cells for out in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    assert "IProgress" not in stderr and "Warning" not in stderr, stderr
    assert "bar: 100%" in stderr  # the text bar was drawn
    assert "3 3.0" in "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
