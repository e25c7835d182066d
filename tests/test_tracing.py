"""Probing a tracer for ``sharding`` / ``device`` (as Flax NNX does on every Variable write) costs no walk of the trace."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax._src.interpreters import partial_eval

from jaxpipe import tracing


def _never(self):
    raise AssertionError("a probe walked the trace")


def test_probing_a_tracer_does_not_walk_the_trace(monkeypatch):
    monkeypatch.setattr(partial_eval.DynamicJaxprTracer, "_origin_msg", _never)

    def f(x):
        for _ in range(3):
            x = jnp.sin(x) + 1.0
        assert getattr(x, "sharding", None) is None and getattr(x, "device", None) is None
        assert not hasattr(x, "sharding")
        return x

    jax.make_jaxpr(f)(1.0)
    # what made abstract builds quadratic: every RNG draw writes a Variable, which probes its new value
    model = nnx.eval_shape(lambda: nnx.Linear(4, 4, rngs=nnx.Rngs(0)))
    assert model.kernel.shape == (4, 4)


def test_install_is_idempotent_and_errors_that_stop_a_program_keep_their_origin():
    assert tracing.install() is False  # jaxpipe installed it on import already

    def f(x):
        return float(x)  # needs a concrete value

    with pytest.raises(jax.errors.ConcretizationTypeError, match="while tracing the function f"):
        jax.jit(f)(1.0)
