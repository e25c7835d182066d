"""The attention implementations agree: chunked (blocks of query rows, rematerialised) == XLA's, values and gradients;
cuDNN off a GPU is refused at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpipe.nn.attention import attention, check_implementation
from jaxpipe.nn.flux import FluxConfig


def test_chunked_attention_equals_xla_values_and_gradients_with_a_ragged_last_block():
    q, k, v = (jax.random.normal(key, (2, 21, 3, 8)) for key in jax.random.split(jax.random.key(0), 3))
    k = k[:, :13]
    v = v[:, :13]
    w = jax.random.normal(jax.random.key(1), q.shape)

    def loss(impl):
        return lambda q, k, v: jnp.sum(attention(q, k, v, implementation=impl, chunk=8) * w)

    want, want_grads = jax.value_and_grad(loss("xla"), argnums=(0, 1, 2))(q, k, v)
    got, got_grads = jax.jit(jax.value_and_grad(loss("chunked"), argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for g, e in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, e, atol=1e-6 * float(jnp.max(jnp.abs(e))))
    assert attention(q, k, v, implementation="chunked", chunk=8).shape == (2, 21, 3, 8)


def test_cudnn_off_a_gpu_and_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        check_implementation("cudnn", backend="cpu")
    assert check_implementation("cudnn", backend="gpu") == "cudnn"
    with pytest.raises(ValueError, match="must be one of"):
        FluxConfig.tiny(attention="flash")


@pytest.mark.slow  # ~5 s: three Wan forwards; the default tier checks the chunked attention itself
def test_wan_with_chunked_attention_equals_xla():
    """The Wan transformer's self- and cross-attention take the setting; chunks smaller than its 48 tokens agree."""
    from flax import nnx

    from jaxpipe.nn import attention as attention_module
    from jaxpipe.nn.wan import WanCond, WanConfig, WanTransformer

    x = jax.random.normal(jax.random.key(0), (1, 3, 8, 8, 4))
    cond = WanCond(jax.random.normal(jax.random.key(1), (1, 5, 32)))
    out = {}
    for impl in ("xla", "chunked"):
        model = WanTransformer(WanConfig.tiny(attention=impl), rngs=nnx.Rngs(0))
        out[impl] = model.velocity(x, jnp.array([0.4]), cond)
    chunk, attention_module.CHUNK = attention_module.CHUNK, 16
    try:
        model = WanTransformer(WanConfig.tiny(attention="chunked"), rngs=nnx.Rngs(0))
        small = model.velocity(x, jnp.array([0.4]), cond)
        program = str(jax.make_jaxpr(lambda x: model.velocity(x, jnp.array([0.4]), cond))(x))
    finally:
        attention_module.CHUNK = chunk
    np.testing.assert_array_equal(out["chunked"], out["xla"])  # one block: the same call
    assert "remat" in program  # the blocks of 16 query rows really ran (each rematerialised)
    np.testing.assert_allclose(small, out["xla"], atol=1e-5 * float(jnp.max(jnp.abs(out["xla"]))))
