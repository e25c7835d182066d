"""The Wan 2.x transformer (``jaxpipe.nn.wan``) against diffusers' ``WanTransformer3DModel``.

Tiny random-weight references (every parameter perturbed, so zero-initialised tables and the
FLF2V position embedding matter) are saved as sharded diffusers folders, loaded, and run once
each: T2V through the channels-first ``__call__`` (float32 and bfloat16), I2V through the
channels-last ``velocity``. Full sizes are checked abstractly against diffusers on the meta device.
"""

import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")

from jaxpipe.loops.denoise import Denoiser
from jaxpipe.nn import hf, wan

# 2 heads × head_dim 16: the RoPE splits 16 into t=8, h=4, w=4 (h = w = 2·(16 // 6)).
TINY = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "out_channels": 4,
    "text_dim": 32,
    "freq_dim": 32,
    "ffn_dim": 64,
}
VARIANTS = {
    "t2v": {"num_layers": 2, "in_channels": 4},
    # I2V in the FLF2V form (the superset): 4 latent + 4 mask + 4 condition channels, CLIP-like image tokens
    # embedded with a position table over two frames' tokens, added K/V projections in cross-attention.
    "i2v": {"num_layers": 1, "in_channels": 12, "image_dim": 24, "added_kv_proj_dim": 32, "pos_embed_seq_len": 10},
}
B, F, H, W, C = 2, 3, 4, 4, 4
TIMESTEPS = np.array([750.0, 250.0], np.float32)  # = 1000·σ exactly, σ = 0.75, 0.25


def _jit_call(model, *args):
    return model(*args)


def _reference(tmp_path_factory, name):
    """Save a random tiny diffusers model (sharded) and run it once: (folder, inputs, channels-first output)."""
    torch.manual_seed(0 if name == "t2v" else 1)
    config = {**TINY, **VARIANTS[name]}
    model = diffusers.WanTransformer3DModel(**config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(f"wan-{name}")
    model.save_pretrained(folder, max_shard_size="40KB")
    # diffusers' I2V processor takes the last 512 context tokens as text (its pipelines pad prompts to 512).
    inputs = {
        "hidden_states": torch.randn(B, config["in_channels"], F, H, W),
        "timestep": torch.from_numpy(TIMESTEPS),
        "encoder_hidden_states": torch.randn(B, 512 if name == "i2v" else 7, TINY["text_dim"]),
        "encoder_hidden_states_image": torch.randn(2 * B, 5, 24) if name == "i2v" else None,
    }
    with torch.no_grad():
        out = model(**inputs, return_dict=False)[0].numpy()
    numpy_inputs = {k: None if v is None else v.numpy() for k, v in inputs.items()}
    return folder, numpy_inputs, out


@pytest.fixture(scope="module")
def t2v(tmp_path_factory):
    return _reference(tmp_path_factory, "t2v")


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    return _reference(tmp_path_factory, "i2v")


def test_t2v_matches_diffusers_in_float32_and_bfloat16_is_close(t2v):
    folder, inputs, ref = t2v
    assert (folder / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1
    args = [jnp.asarray(inputs[k]) for k in ("hidden_states", "timestep", "encoder_hidden_states")]
    model = wan.load(folder)
    assert model.config == wan.WanConfig.tiny(num_layers=2)
    out = np.asarray(jax.jit(_jit_call)(model, *args))
    assert out.shape == ref.shape == (B, C, F, H, W)
    assert np.abs(out - ref).max() <= 1e-4

    low = wan.load(folder, dtype="bfloat16")
    assert low.blocks.layer(0).attn1.to_q.kernel.dtype == jnp.bfloat16
    assert low.blocks.layer(0).scale_shift_table.dtype == jnp.float32  # diffusers keeps modulation tables in float32
    unrolled, scanned = (
        hf.torch_state(wan.load(folder, scan_layers=False)),
        hf.torch_state(model),
    )  # diffusers' own layout
    assert unrolled.keys() == scanned.keys() and all(np.array_equal(v, scanned[k]) for k, v in unrolled.items())
    out16 = np.asarray(jax.jit(_jit_call)(low, *args))
    assert out16.dtype == np.float32
    assert np.abs(out16 - ref).max() <= 0.02 * np.abs(ref).max()  # measured 0.6%


def test_i2v_velocity_on_channels_last_latents_matches_diffusers(i2v):
    folder, inputs, ref = i2v
    model = wan.load(folder)
    assert isinstance(model, Denoiser)
    latents = np.moveaxis(inputs["hidden_states"], 1, -1)  # (B, F, H, W, 12)
    cond = wan.WanCond(
        context=jnp.asarray(inputs["encoder_hidden_states"]),
        image_embeds=jnp.asarray(
            inputs["encoder_hidden_states_image"].reshape(B, 10, 24)
        ),  # two frames' tokens per sample
        condition=jnp.asarray(
            latents[..., C:]
        ),  # mask + first-frame latent, concatenated after x like WanImageToVideoPipeline
    )
    v = np.asarray(
        jax.jit(lambda m, x, s, c: m.velocity(x, s, c))(model, jnp.asarray(latents[..., :C]), TIMESTEPS / 1000, cond)
    )
    assert v.shape == (B, F, H, W, C) and v.dtype == np.float32
    assert np.abs(v - np.moveaxis(ref, 1, -1)).max() <= 1e-4


def test_key_errors_name_missing_unexpected_and_misshaped_keys(t2v, tmp_path):
    folder = t2v[0]
    tensors = hf.read_tensors(folder)
    del tensors["proj_out.bias"]
    tensors["blocks.0.attn1.extra.weight"] = np.zeros(3, np.float32)
    tensors["blocks.1.ffn.net.2.weight"] = np.zeros((32, 63), np.float32)
    tensors["blocks.0.attn2.norm_added_q.weight"] = np.zeros(32, np.float32)  # diffusers ignores it, so does load
    from safetensors.numpy import save_file

    shutil.copy(folder / "config.json", tmp_path / "config.json")
    save_file(tensors, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(hf.KeyMappingError) as info:
        wan.load(tmp_path)
    err = info.value
    assert err.missing == ["proj_out.bias"]
    assert err.unexpected == ["blocks.0.attn1.extra.weight"]
    assert len(err.misshaped) == 1 and err.misshaped[0].startswith("blocks.1.ffn.net.2.weight (32, 63)")
    assert re.search(r"1 missing key.*proj_out\.bias.*1 unexpected key.*extra.*1 mis-shaped", str(err))


# Exact parameter counts of the published configs (diffusers' WanTransformer3DModel on the meta device agrees):
FULL_SIZES = {
    # Wan2.1-T2V-1.3B: 12 heads × 128 = 1536 wide, 30 layers, FFN 8960, text 4096 (umT5-XXL), 16 latent channels.
    "t2v_1_3b": ({"num_attention_heads": 12, "num_layers": 30, "ffn_dim": 8960}, 1_418_996_800),
    # Wan2.1-T2V-14B (also each Wan2.2-T2V-A14B expert): 40 heads × 128 = 5120 wide, 40 layers, FFN 13824.
    "t2v_14b": ({}, 14_288_491_584),
    # Wan2.1-I2V-14B: + 20 condition channels (36 in), CLIP ViT-H image tokens (1280) and added K/V (5120) per layer.
    "i2v_14b": ({"in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120}, 16_394_878_784),
}


def test_full_sizes_abstractly_match_diffusers_and_logical_axes_cover_them():
    for name, (kwargs, count) in FULL_SIZES.items():
        model = wan.WanTransformer.abstract(getattr(wan.WanConfig, name)())
        assert model.param_count() == count, name
        with torch.device("meta"):
            reference = diffusers.WanTransformer3DModel(**kwargs)
        assert sum(p.numel() for p in reference.parameters()) == count, name
    assert len(model.blocks) == 40 and model.blocks.stacked.attn2.add_k_proj.kernel.shape == (40, 5120, 5120)

    # The layer-copying abstract build is the plain nnx.eval_shape build.
    cfg = wan.WanConfig.tiny(num_layers=3, **{k: v for k, v in VARIANTS["i2v"].items() if k != "num_layers"})
    fast, slow = wan.WanTransformer.abstract(cfg), nnx.eval_shape(lambda: wan.WanTransformer(cfg, rngs=nnx.Rngs(0)))
    assert nnx.graphdef(fast) == nnx.graphdef(slow)
    shapes = lambda m: jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(m, nnx.Param))
    assert shapes(fast) == shapes(slow)

    # Every LOGICAL_AXES rule names params of its rank, and every matrix of the 14B I2V as wide as the model is covered
    # (a stacked block's param by its layer's path and shape, as distributed.logical_axes matches it).
    flat = {}
    for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        path, shape = "/".join(map(str, p)), v.shape
        flat[path.replace("/stacked/", "/0/")] = shape[1:] if "/stacked/" in path else shape
    for pattern, axes in wan.LOGICAL_AXES:
        ranks = {len(s) for k, s in flat.items() if re.fullmatch(pattern, k)}
        assert ranks == {len(axes)}, pattern
    big = [k for k, s in flat.items() if len(s) >= 2 and np.prod(s) >= 5120 * 1280]
    assert all(any(re.fullmatch(p, k) for p, _ in wan.LOGICAL_AXES) for k in big)


def test_bad_configs_and_inputs_are_named():
    with pytest.raises(ValueError, match="unknown WanTransformer3DModel config key.*window_size"):
        wan.WanConfig.from_json({"_class_name": "WanTransformer3DModel", "num_layers": 2, "window_size": [-1, -1]})
    assert (
        wan.WanConfig.from_json(
            {"_diffusers_version": "0.33", "patch_size": [1, 2, 2], "out_channels": None}
        ).out_channels
        == 16
    )
    bad = {
        "qk_norm": {"qk_norm": "layer_norm"},
        "added_kv_proj_dim must equal": {"image_dim": 24, "added_kv_proj_dim": 48},
        "needs image_dim": {"added_kv_proj_dim": 32},
        "attention_head_dim must be even": {"attention_head_dim": 15},
        "patch_size": {"patch_size": (2, 2)},
        "num_layers": {"num_layers": 0},
        "dtype": {"dtype": "float16"},
        "pos_embed_seq_len": {"image_dim": 24, "pos_embed_seq_len": 5},
    }
    for message, overrides in bad.items():
        with pytest.raises(ValueError, match=message):
            wan.WanConfig.tiny(**overrides)

    model = wan.WanTransformer.abstract(wan.WanConfig.tiny())
    context = jnp.zeros((1, 7, 32))
    with pytest.raises(ValueError, match=r"4 channels and \(F, H, W\) divisible"):
        model.velocity(jnp.zeros((1, 2, 5, 4, 4)), jnp.ones(1), wan.WanCond(context))
    with pytest.raises(ValueError, match="encoder_hidden_states_image is required by and only by"):
        model.velocity(jnp.zeros((1, 2, 4, 4, 4)), jnp.ones(1), wan.WanCond(context, jnp.zeros((1, 5, 24))))
    with pytest.raises(ValueError, match="rope_max_seq_len=2"):
        wan.WanTransformer.abstract(wan.WanConfig.tiny(rope_max_seq_len=2)).velocity(
            jnp.zeros((1, 3, 4, 4, 4)), jnp.ones(1), wan.WanCond(context)
        )
    with pytest.raises(FileNotFoundError, match="no config.json"):
        wan.load("/nonexistent-wan-folder")
