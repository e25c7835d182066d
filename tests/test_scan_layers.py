"""Scanned blocks (``nn.stacked``) equal their unrolled twins, outputs and gradients, under every remat policy;
diffusers' per-layer keys load into the stacked layout and save back out of it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxpipe.nn import hf, stacked
from jaxpipe.nn.causal_dit import CausalDiT, ChunkCond, init_cache
from jaxpipe.nn.clip import CLIPTextEncoder, CLIPTextEncoderConfig
from jaxpipe.nn.dit import DiT, DiTCond, DiTConfig
from jaxpipe.nn.flux import FluxCond, FluxConfig, FluxTransformer
from jaxpipe.nn.lm import LMConfig, RefinerLM
from jaxpipe.nn.mot import MoT, MoTConfig, Routing
from jaxpipe.nn.t5 import RENAMES as T5_RENAMES
from jaxpipe.nn.t5 import T5Encoder, T5EncoderConfig
from jaxpipe.nn.wan import WanCond, WanConfig, WanTransformer

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
    return FluxTransformer(
        FluxConfig.tiny(num_layers=2, num_single_layers=3, scan_layers=scan, remat=remat), rngs=nnx.Rngs(0)
    )


def _flux_loss(model: FluxTransformer) -> jax.Array:
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (2, 4, 4, 4))
    cond = FluxCond(jax.random.normal(keys[1], (2, 5, 32)), jax.random.normal(keys[2], (2, 32)), jnp.full((2,), 3.5))
    return jnp.sum(model.velocity(x, jnp.array([0.3, 0.7]), cond) * jax.random.normal(keys[3], x.shape))


def test_flux_scanned_equals_unrolled_outputs():
    """The default tier's check (two forward compiles, no gradients): the same parameters, the same velocity."""
    unrolled, scanned = _flux(False, "none"), _flux(True, "none")
    assert isinstance(scanned.transformer_blocks, stacked.Stacked) and not isinstance(
        unrolled.transformer_blocks, stacked.Stacked
    )

    def loss(module):
        graphdef, state = nnx.split(module)
        return float(jax.jit(lambda s: _flux_loss(nnx.merge(graphdef, s)))(state))

    want, got = loss(unrolled), loss(scanned)
    assert abs(got - want) <= TOL * abs(want), (got, want)


@pytest.mark.slow  # five gradient compiles (~20 s); the default tier checks the scanned forward
def test_flux_scanned_equals_unrolled_outputs_and_gradients_under_every_remat_policy():
    assert_scan_matches(_flux, _flux_loss)


def test_per_layer_keys_load_into_the_stacked_layout_and_save_back():
    unrolled, scanned = _flux(False, "none"), _flux(True, "none")
    other = FluxTransformer(FluxConfig.tiny(num_layers=2, num_single_layers=3), rngs=nnx.Rngs(7))
    tensors = hf.torch_state(unrolled)
    assert "transformer_blocks.1.attn.to_q.weight" in tensors and tensors[
        "transformer_blocks.1.attn.to_q.weight"
    ].shape == (32, 32)
    hf.load_into(other, tensors)
    assert all(np.array_equal(v, tensors[k]) for k, v in hf.torch_state(other).items())
    kernel = other.transformer_blocks.stacked.attn.to_q.kernel[...]
    assert kernel.shape == (2, 32, 32) and np.array_equal(kernel[1], tensors["transformer_blocks.1.attn.to_q.weight"].T)
    assert np.array_equal(
        scanned.single_transformer_blocks.layer(2).proj_out.kernel[...],
        unrolled.single_transformer_blocks[2].proj_out.kernel[...],
    )
    # a missing layer is named by its own key, not the stacked one
    with pytest.raises(hf.KeyMappingError, match=r"single_transformer_blocks\.2\.proj_mlp\.weight"):
        hf.load_into(other, {k: v for k, v in tensors.items() if k != "single_transformer_blocks.2.proj_mlp.weight"})


def test_stacked_blocks_shard_like_their_layers():
    from jaxpipe import distributed
    from jaxpipe.nn.flux import LOGICAL_AXES

    axes = distributed.logical_axes(nnx.eval_shape(lambda: _flux(True, "none")), LOGICAL_AXES)
    assert axes["transformer_blocks"]["stacked"]["attn"]["to_q"]["kernel"] == jax.sharding.PartitionSpec(
        None, "embed", "heads"
    )
    assert axes["single_transformer_blocks"]["stacked"]["proj_mlp"]["kernel"] == jax.sharding.PartitionSpec(
        None, "embed", "mlp"
    )


def test_a_bad_remat_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="remat must be one of"):
        FluxConfig.tiny(remat="some")


def _wan(scan: bool, remat: str) -> WanTransformer:
    config = WanConfig.tiny(num_layers=2, image_dim=16, added_kv_proj_dim=32, scan_layers=scan, remat=remat)
    return WanTransformer(config, rngs=nnx.Rngs(0))


def _wan_loss(model: WanTransformer) -> jax.Array:
    keys = jax.random.split(jax.random.key(2), 4)
    x = jax.random.normal(keys[0], (2, 2, 4, 4, 4))
    cond = WanCond(jax.random.normal(keys[1], (2, 5, 32)), jax.random.normal(keys[2], (2, 3, 16)))
    return jnp.sum(model.velocity(x, jnp.array([0.3, 0.7]), cond) * jax.random.normal(keys[3], x.shape))


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
def test_wan_scanned_equals_unrolled_outputs_and_gradients():
    assert_scan_matches(_wan, _wan_loss, policies=("none", "dots"))


def test_wan_abstract_build_is_stacked_like_the_real_one():
    config = WanConfig.tiny(num_layers=3)
    fast, real = WanTransformer.abstract(config), nnx.eval_shape(lambda: WanTransformer(config, rngs=nnx.Rngs(0)))
    assert isinstance(fast.blocks, stacked.Stacked) and len(fast.blocks) == 3
    assert nnx.graphdef(fast) == nnx.graphdef(real)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), nnx.state(fast)) == jax.tree.map(
        lambda a: (a.shape, a.dtype), nnx.state(real)
    )


_IDS = np.array([[5, 7, 9, 11, 3, 1, 0, 0], [4, 8, 15, 16, 23, 42, 2, 13]], np.int32)
_MASK = (np.arange(8) < np.array([[6], [8]])).astype(np.int32)


def _t5(umt5: bool):
    def make(scan: bool, remat: str) -> T5Encoder:
        return T5Encoder(T5EncoderConfig.tiny(num_layers=2, umt5=umt5, scan_layers=scan, remat=remat), rngs=nnx.Rngs(0))

    return make


def _t5_loss(model: T5Encoder) -> jax.Array:
    out = model(_IDS, _MASK)
    return jnp.sum(out * jax.random.normal(jax.random.key(3), out.shape))


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
@pytest.mark.parametrize("umt5", [False, True], ids=["t5", "umt5"])
def test_t5_scanned_equals_unrolled_outputs_and_gradients(umt5):
    assert_scan_matches(_t5(umt5), _t5_loss, policies=("none", "dots"))


def test_t5_keeps_one_shared_position_bias_saved_under_block_0s_key():
    # T5's one table sits in the stack (so every block has one structure); transformers keeps it in block 0
    tensors = hf.torch_state(_t5(False)(True, "none"), renames=T5_RENAMES)
    tables = sorted(k for k in tensors if "relative_attention_bias" in k)
    assert tables == ["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    umt5 = hf.torch_state(_t5(True)(True, "none"), renames=T5_RENAMES)
    assert sorted(k for k in umt5 if "relative_attention_bias" in k) == [
        f"encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight" for i in range(2)
    ]
    other = T5Encoder(T5EncoderConfig.tiny(num_layers=2), rngs=nnx.Rngs(5))
    hf.load_into(other, tensors, renames=T5_RENAMES)
    assert np.array_equal(
        other.encoder.relative_attention_bias.embedding[...],
        tensors["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
    )


def _clip(scan: bool, remat: str) -> CLIPTextEncoder:
    return CLIPTextEncoder(
        CLIPTextEncoderConfig.tiny(num_hidden_layers=2, scan_layers=scan, remat=remat), rngs=nnx.Rngs(0)
    )


def _clip_loss(model: CLIPTextEncoder) -> jax.Array:
    hidden, pooled = model(_IDS, _MASK)
    keys = jax.random.split(jax.random.key(4))
    return jnp.sum(hidden * jax.random.normal(keys[0], hidden.shape)) + jnp.sum(
        pooled * jax.random.normal(keys[1], pooled.shape)
    )


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
def test_clip_text_scanned_equals_unrolled_outputs_and_gradients():
    assert_scan_matches(_clip, _clip_loss, policies=("none", "dots"))


@pytest.mark.slow  # four more compiles of each network; the default tier covers no-remat and "dots"
@pytest.mark.parametrize(
    "make, loss",
    [(_wan, _wan_loss), (_t5(False), _t5_loss), (_t5(True), _t5_loss), (_clip, _clip_loss)],
    ids=["wan", "t5", "umt5", "clip"],
)
def test_wan_and_text_encoders_scanned_equal_unrolled_under_full_and_offloading_remat(make, loss):
    assert_scan_matches(make, loss, policies=("full", "offload"))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: WanConfig.tiny(remat="some"), "remat must be one of"),
        (lambda: T5EncoderConfig.tiny(remat="some"), "remat must be one of"),
        (lambda: CLIPTextEncoderConfig.tiny(remat="some"), "remat must be one of"),
        (lambda: WanConfig.tiny(scan_layers=1), "scan_layers must be a bool"),
        (lambda: T5EncoderConfig.tiny(scan_layers="yes"), "scan_layers must be a bool"),
    ],
    ids=["wan", "t5", "clip", "wan-scan-flag", "t5-scan-flag"],
)
def test_wan_and_text_encoder_configs_refuse_a_bad_remat_policy_or_scan_flag(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ------------------------------------------------------------------ jaxpipe's own networks (unrolled by default)


def _perturbed(module: nnx.Module, seed: int = 0, scale: float = 0.05) -> nnx.Module:
    """``module`` with Gaussian noise on every parameter, drawn by per-layer key (the same in either layout):
    the adaLN-zero / zero-initialised output layers start at 0 and would hide most blocks' gradients."""
    tensors = hf.torch_state(module)
    rng = np.random.default_rng(seed)
    return hf.load_into(
        module, {k: tensors[k] + scale * rng.standard_normal(tensors[k].shape) for k in sorted(tensors)}
    )


def _dit(scan: bool, remat: str):
    cfg = DiTConfig.tiny(dim=32, depth=2, heads=2, text_dim=16, time_embed_dim=32, scan_layers=scan, remat=remat)
    return _perturbed(DiT(cfg, rngs=nnx.Rngs(0)))


def _dit_loss(model) -> jax.Array:
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (2, 1, 4, 4, 4))
    # per-row skipped blocks (STG's perturbed forward): each block's own index must reach it through the scan
    cond = DiTCond(
        jax.random.normal(keys[1], (2, 3, 16)),
        jnp.array([[1, 1, 0], [1, 1, 1]], bool),
        skip_blocks=jnp.array([[1, -1], [-1, -1]], jnp.int32),
    )
    return jnp.sum(model.velocity(x, jnp.array([0.3, 0.7]), cond) * jax.random.normal(keys[2], x.shape))


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
def test_dit_scanned_equals_unrolled_outputs_and_gradients():
    assert_scan_matches(_dit, _dit_loss, policies=("none", "dots"))


def _causal(scan: bool, remat: str):
    cfg = DiTConfig.tiny(dim=32, depth=2, heads=2, text_dim=16, time_embed_dim=32, scan_layers=scan, remat=remat)
    return _perturbed(CausalDiT(cfg, rngs=nnx.Rngs(0)))


def _causal_loss(model) -> jax.Array:
    """The cached path: a chunk attending to a 1-chunk cache (each block its own slab, different ones), and the
    chunk's per-block K/V that ``write`` stores (weighted by block, so one landing in another block's slot shows)."""
    keys = jax.random.split(jax.random.key(2), 4)
    x = jax.random.normal(keys[0], (1, 2, 4, 4, 4))  # one chunk of 2 frames, 8 tokens
    context, mask = jax.random.normal(keys[1], (1, 3, 16)), jnp.array([[1, 1, 0]], bool)
    empty = init_cache(model.cfg, 1, 1, 8)
    slabs = [jax.random.normal(k, empty.k[0].shape) for k in jax.random.split(keys[2], 2 * model.cfg.depth)]
    cache = empty._replace(
        k=tuple(slabs[::2]), v=tuple(slabs[1::2]), valid=jnp.ones((1, 1), bool), written=jnp.ones((1,), jnp.int32)
    )
    velocity, kvs = model.chunk_forward(x, jnp.array([0.6]), ChunkCond(context, mask, cache))
    own = sum(jnp.sum(k * (i + 1)) - jnp.sum(v * (i + 2)) for i, (k, v) in enumerate(kvs))
    return jnp.sum(velocity * jax.random.normal(keys[3], velocity.shape)) + 0.1 * own


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
def test_causal_dit_scanned_equals_unrolled_cached_and_full():
    assert_scan_matches(_causal, _causal_loss, policies=("none", "dots"))
    # the full block-causal forward (no cache) too, its value only: its gradients are the DiT's blocks' above
    keys = jax.random.split(jax.random.key(5), 2)
    x, context = jax.random.normal(keys[0], (1, 4, 4, 4, 4)), jax.random.normal(keys[1], (1, 3, 16))
    full = jax.jit(lambda m: m(x, jnp.array([[0.0, 0.6]]), context, chunk_frames=2, window=1))
    unrolled, scanned = full(_causal(False, "none")), full(_causal(True, "none"))
    assert float(jnp.max(jnp.abs(scanned - unrolled))) <= TOL * float(jnp.max(jnp.abs(unrolled)))


def _mot(scan: bool, remat: str):
    cfg = MoTConfig(
        vocab_size=11,
        max_text=6,
        latent_size=4,
        dim=32,
        depth=2,
        heads=2,
        time_embed_dim=16,
        routing="modality",
        scan_layers=scan,
        remat=remat,
    )
    return _perturbed(MoT(cfg, rngs=nnx.Rngs(0)))


def _mot_loss(model) -> jax.Array:
    """Both modalities' experts in one uncached pass (``forward``), and a ``decode_step`` reading and writing
    a cache whose layers hold different K/V and an image (each layer's slab in the loss)."""
    keys = jax.random.split(jax.random.key(3), 5)
    ids = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]], jnp.int32)
    lengths = jnp.array([3, 2], jnp.int32)
    x = jax.random.normal(keys[0], (2, 1, 4, 4, 4))
    logits, velocity = model.forward(ids, jnp.arange(4)[None] < lengths[:, None], x, jnp.array([0.4, 0.8]))
    empty = model.init_cache(2)
    slabs = [jax.random.normal(k, empty.k[0].shape) for k in jax.random.split(keys[1], 2 * model.cfg.depth)]
    step, cache = model.decode_step(
        jnp.array([8, 9], jnp.int32),
        lengths,
        empty._replace(k=tuple(slabs[::2]), v=tuple(slabs[1::2]), image=jnp.ones((2,), bool)),
    )
    own = sum(jnp.sum(k * (i + 1)) - jnp.sum(v * (i + 2)) for i, (k, v) in enumerate(zip(cache.k, cache.v)))
    r = lambda a, k: jnp.sum(a * jax.random.normal(k, a.shape))
    return r(logits, keys[2]) + r(velocity, keys[3]) + r(step, keys[4]) + 0.1 * own


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
def test_mot_scanned_equals_unrolled_uncached_and_cached():
    assert_scan_matches(_mot, _mot_loss, policies=("none", "dots"))


def _lm(scan: bool, remat: str):
    return _perturbed(
        RefinerLM(
            LMConfig.tiny(13, dim=32, depth=2, heads=2, max_len=6, scan_layers=scan, remat=remat), rngs=nnx.Rngs(0)
        )
    )


def _lm_loss(model) -> jax.Array:
    """The KV cache: ``prefill`` (the teacher-forced forward, writing every layer's slab) then a ``decode_step``
    reading and writing them (each layer's slab in the loss)."""
    ids = jnp.array([[3, 4, 5, 0], [6, 7, 0, 0]], jnp.int32)
    lengths = jnp.array([3, 2], jnp.int32)
    first, cache = model.prefill(ids, lengths, model.init_cache(2))
    step, cache = model.decode_step(jnp.array([8, 9], jnp.int32), lengths, cache)
    slabs = sum(jnp.sum(k * (i + 1)) - jnp.sum(v * (i + 2)) for i, (k, v) in enumerate(zip(cache.k, cache.v)))
    logits = jnp.stack([first, step])
    return jnp.sum(logits * jax.random.normal(jax.random.key(4), logits.shape)) + 0.1 * slabs


@pytest.mark.slow  # ~20 s of compiles cold; the default tier checks the stacking machinery on FLUX
def test_lm_scanned_equals_unrolled_uncached_and_cached():
    assert_scan_matches(_lm, _lm_loss, policies=("none", "dots"))


@pytest.mark.slow  # six more compiles of the same four networks; the default tier covers no-remat and "dots"
@pytest.mark.parametrize(
    "make, loss",
    [(_dit, _dit_loss), (_causal, _causal_loss), (_mot, _mot_loss), (_lm, _lm_loss)],
    ids=["dit", "causal_dit", "mot", "lm"],
)
def test_own_networks_scanned_equal_unrolled_under_full_and_offloading_remat(make, loss):
    assert_scan_matches(make, loss, policies=("full", "offload"))


def test_own_networks_stay_unrolled_by_default_and_refuse_what_cannot_stack():
    dit = nnx.eval_shape(lambda: DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0)))
    assert isinstance(dit.blocks, nnx.List) and dit.blocks[1].attn.q.kernel.shape == (
        64,
        64,
    )  # blocks/1/...: the cards' keys
    assert not LMConfig(vocab_size=5).scan_layers and not MoTConfig(vocab_size=5).scan_layers
    for make in (
        lambda r: DiTConfig.tiny(remat=r),
        lambda r: LMConfig(vocab_size=5, remat=r),
        lambda r: MoTConfig(vocab_size=5, remat=r),
    ):
        with pytest.raises(ValueError, match="remat must be one of"):
            make("some")
    with pytest.raises(ValueError, match="scan_layers must be a bool"):
        DiTConfig.tiny(scan_layers="yes")
    with pytest.raises(ValueError, match="routes layers differently"):
        MoTConfig(vocab_size=5, depth=3, routing=Routing.first_shared(3, 1), scan_layers=True)
    assert MoTConfig(vocab_size=5, depth=3, routing=Routing.ffn_only(3), scan_layers=True).scan_layers  # alike: stacks
