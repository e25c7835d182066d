"""Fast checks of the benchmark scripts (their timings are never tests: DESIGN §12)."""

import importlib.util
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def test_denoise_torch_port_matches_jax():
    """The PyTorch DiT the denoise benchmark times against is the same network as jaxpipe's."""
    pytest.importorskip("torch")
    bench = _load("denoise")
    errors = bench.parity_check(tol=1e-4, layer_tol=2e-5)  # raises AssertionError on a mismatch
    assert max(errors["velocity"], errors["trajectory"]) < 1e-4
    assert max(errors["mlp"], errors["norm"], errors["cross"]) < 2e-5
    assert errors["velocity_scale"] > 0.1  # the zero-initialised output layers really were filled
