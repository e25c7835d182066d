"""Scanned blocks (``nn.stacked``) equal their unrolled twins, outputs and gradients, under every remat policy;
diffusers' per-layer keys load into the stacked layout and save back out of it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxpipe.nn import hf, stacked
from jaxpipe.nn.flux import FluxCond, FluxConfig, FluxTransformer

TOL = 1e-6  # of the largest |value|: float32 reductions reordered by the scan / the recomputation, nothing more


def value_and_grads(module: nnx.Module, loss) -> tuple[float, dict[str, np.ndarray]]:
    """``loss(module)`` and its gradient by parameter, as per-layer PyTorch keys (so stacked and unrolled compare)."""
    graphdef, params = nnx.split(module)
    value, grads = jax.jit(jax.value_and_grad(lambda p: loss(nnx.merge(graphdef, p))))(params)
    return float(value), hf.torch_state(nnx.merge(graphdef, grads))


def assert_same(a: tuple[float, dict], b: tuple[float, dict]) -> None:
    """Values and every gradient equal within ``TOL`` of their scale."""
    (va, ga), (vb, gb) = a, b
    assert abs(va - vb) <= TOL * abs(va), (va, vb)
    assert ga.keys() == gb.keys()
    scale = max(float(np.max(np.abs(g))) for g in ga.values())
    worst = max(float(np.max(np.abs(ga[k] - gb[k]))) for k in ga)
    assert worst <= TOL * scale, f"gradients differ by {worst:.3g} (scale {scale:.3g})"


def assert_scan_matches(make, loss, policies=stacked.REMAT_POLICIES) -> None:
    """``make(scan_layers, remat)`` built scanned under each policy, and unrolled with full remat, all equal the
    unrolled network without remat; both layouts hold the same parameters under the same keys."""
    reference = make(False, "none")
    expected = value_and_grads(reference, loss)
    params = hf.torch_state(reference)
    for scan, remat in [(True, p) for p in policies] + [(False, "full")]:
        module = make(scan, remat)
        if scan:
            assert any(stacked.STACKED in path for path, _ in nnx.to_flat_state(nnx.state(module, nnx.Param)))
        got = hf.torch_state(module)
        assert got.keys() == params.keys() and all(np.array_equal(got[k], params[k]) for k in got)
        assert_same(value_and_grads(module, loss), expected)


def _flux(scan: bool, remat: str) -> FluxTransformer:
    return FluxTransformer(FluxConfig.tiny(num_layers=2, num_single_layers=3, scan_layers=scan, remat=remat), rngs=nnx.Rngs(0))


def _flux_loss(model: FluxTransformer) -> jax.Array:
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (2, 4, 4, 4))
    cond = FluxCond(jax.random.normal(keys[1], (2, 5, 32)), jax.random.normal(keys[2], (2, 32)), jnp.full((2,), 3.5))
    return jnp.sum(model.velocity(x, jnp.array([0.3, 0.7]), cond) * jax.random.normal(keys[3], x.shape))


def test_flux_scanned_equals_unrolled_outputs_and_gradients():
    assert_scan_matches(_flux, _flux_loss, policies=("none", "dots"))


@pytest.mark.slow  # three more compiles of the same network; the default tier covers no-remat and "dots"
def test_flux_scanned_equals_unrolled_under_full_and_offloading_remat():
    assert_scan_matches(_flux, _flux_loss, policies=("full", "offload"))


def test_per_layer_keys_load_into_the_stacked_layout_and_save_back():
    unrolled, scanned = _flux(False, "none"), _flux(True, "none")
    other = FluxTransformer(FluxConfig.tiny(num_layers=2, num_single_layers=3), rngs=nnx.Rngs(7))
    tensors = hf.torch_state(unrolled)
    assert "transformer_blocks.1.attn.to_q.weight" in tensors and tensors["transformer_blocks.1.attn.to_q.weight"].shape == (32, 32)
    hf.load_into(other, tensors)
    assert all(np.array_equal(v, tensors[k]) for k, v in hf.torch_state(other).items())
    kernel = other.transformer_blocks.stacked.attn.to_q.kernel[...]
    assert kernel.shape == (2, 32, 32) and np.array_equal(kernel[1], tensors["transformer_blocks.1.attn.to_q.weight"].T)
    assert np.array_equal(scanned.single_transformer_blocks.layer(2).proj_out.kernel[...],
                          unrolled.single_transformer_blocks[2].proj_out.kernel[...])
    # a missing layer is named by its own key, not the stacked one
    with pytest.raises(hf.KeyMappingError, match=r"single_transformer_blocks\.2\.proj_mlp\.weight"):
        hf.load_into(other, {k: v for k, v in tensors.items() if k != "single_transformer_blocks.2.proj_mlp.weight"})


def test_stacked_blocks_shard_like_their_layers():
    from jaxpipe import distributed
    from jaxpipe.nn.flux import LOGICAL_AXES

    axes = distributed.logical_axes(nnx.eval_shape(lambda: _flux(True, "none")), LOGICAL_AXES)
    assert axes["transformer_blocks"]["stacked"]["attn"]["to_q"]["kernel"] == jax.sharding.PartitionSpec(None, "embed", "heads")
    assert axes["single_transformer_blocks"]["stacked"]["proj_mlp"]["kernel"] == jax.sharding.PartitionSpec(None, "embed", "mlp")


def test_a_bad_remat_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="remat must be one of"):
        FluxConfig.tiny(remat="some")
