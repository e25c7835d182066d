"""The FLUX.1 transformer (jaxpipe.nn.flux) against diffusers' FluxTransformer2DModel.

A tiny diffusers model with every parameter randomised is saved sharded, loaded, and compared in
float32 (forward and pipeline-style packed velocity); bfloat16 stays close; bad checkpoints and
bad configs are named errors; FLUX.1-dev / schnell build abstractly with diffusers' exact counts.
"""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")

from diffusers import FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import FluxPipeline

from jaxpipe.nn import hf
from jaxpipe.nn.flux import LOGICAL_AXES, FluxCond, FluxConfig, FluxTransformer, load

TINY = dict(
    in_channels=16,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)
B, T, H, W = 2, 5, 4, 6  # batch, text tokens, latent height / width (a 2x3 grid of packed tokens)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The torch model (all params random, norms around 1) and its sharded save folder."""
    torch.manual_seed(0)
    model = FluxTransformer2DModel(**TINY).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.1 * torch.randn_like(p)
            p.copy_(1.0 + noise if "norm" in name and p.ndim == 1 and "linear" not in name else noise)
    folder = tmp_path_factory.mktemp("flux_transformer")
    model.save_pretrained(folder, max_shard_size="100KB")
    return model, folder


@jax.jit
def run(model, packed, text, pooled, sigma, img_ids, txt_ids, guidance, latents):
    """One jitted jaxpipe call: the diffusers-signature forward and the denoiser-protocol velocity."""
    out = model(packed, text, pooled, sigma, img_ids, txt_ids, guidance)
    return out, model.velocity(latents, sigma, FluxCond(text, pooled, guidance))


def test_parity_with_diffusers(reference):
    model, folder = reference
    assert list(folder.glob("*.safetensors.index.json")), "the reference must be saved sharded"
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((B, TINY["in_channels"] // 4, H, W)).astype(np.float32)  # NCHW like diffusers
    text = rng.standard_normal((B, T, TINY["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((B, TINY["pooled_projection_dim"])).astype(np.float32)
    sigma = np.array([0.3, 0.9], np.float32)
    guidance = np.array([3.5, 1.0], np.float32)

    packed = FluxPipeline._pack_latents(torch.from_numpy(latents), B, latents.shape[1], H, W)
    img_ids = FluxPipeline._prepare_latent_image_ids(B, H // 2, W // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(T, 3)
    with torch.no_grad():
        ref = model(
            hidden_states=packed,
            encoder_hidden_states=torch.from_numpy(text),
            pooled_projections=torch.from_numpy(pooled),
            timestep=torch.from_numpy(sigma),
            img_ids=img_ids,
            txt_ids=txt_ids,
            guidance=torch.from_numpy(guidance),
            return_dict=False,
        )[0]
    ref_velocity = FluxPipeline._unpack_latents(ref, H * 8, W * 8, 8).numpy().transpose(0, 2, 3, 1)  # NHWC
    ref = ref.numpy()

    inputs = (
        packed.numpy(),
        text,
        pooled,
        sigma,
        img_ids.numpy(),
        txt_ids.numpy(),
        guidance,
        latents.transpose(0, 2, 3, 1),
    )
    ours = load(folder)
    out, velocity = run(ours, *inputs)
    assert out.dtype == velocity.dtype == jnp.float32
    assert out.shape == ref.shape and velocity.shape == ref_velocity.shape == (B, H, W, 4)
    assert np.max(np.abs(np.asarray(out) - ref)) <= 1e-4
    assert np.max(np.abs(np.asarray(velocity) - ref_velocity)) <= 1e-4

    bf16 = load(folder, dtype="bfloat16")
    assert {p.dtype for p in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
    out16, velocity16 = run(bf16, *inputs)
    assert out16.dtype == jnp.float32
    for low, high in ((out16, ref), (velocity16, ref_velocity)):
        assert np.linalg.norm(np.asarray(low) - high) <= 5e-2 * np.linalg.norm(high)


def test_checkpoint_key_errors(reference, tmp_path):
    from safetensors.numpy import save_file

    _, folder = reference
    tensors = hf.read_tensors(folder)
    del tensors["proj_out.bias"]
    tensors["pos_embed.extra"] = np.zeros(3, np.float32)
    tensors["x_embedder.weight"] = tensors["x_embedder.weight"][:, :-1].copy()
    save_file(tensors, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(hf.KeyMappingError) as err:
        load(tmp_path)
    message = str(err.value)
    for key in (
        "missing key(s): proj_out.bias",
        "unexpected key(s): pos_embed.extra",
        "mis-shaped key(s): x_embedder.weight",
    ):
        assert key in message


# Exact parameter counts of diffusers' FluxTransformer2DModel(**config) (computed on the meta device, see below).
DEV_PARAMS = 11_901_408_320
SCHNELL_PARAMS = 11_891_178_560  # dev without the guidance embedder (256·3072 + 3072 + 3072² + 3072)


@pytest.mark.parametrize("variant, count", [("dev", DEV_PARAMS), ("schnell", SCHNELL_PARAMS)])
def test_full_size_abstract_param_count(variant, count):
    config = getattr(FluxConfig, variant)()
    model = nnx.eval_shape(lambda: FluxTransformer(config, rngs=nnx.Rngs(0)))
    kwargs = {f: getattr(config, f) for f in ("guidance_embeds", "axes_dims_rope")}  # every other field is the default
    with torch.device("meta"):
        reference = FluxTransformer2DModel(**kwargs)
    assert model.param_count() == sum(p.numel() for p in reference.parameters()) == count
    assert abs(count - 11.9e9) < 0.02e9
    if variant == "dev":  # the sharding table: every rule used with the right rank, every matrix over 1M covered
        # a stacked block's param matches the table by its per-layer path and shape, as distributed.logical_axes does
        paths = {}
        for path, p in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            layer = "/".join("0" if part == "stacked" else str(part) for part in path)
            paths[layer] = p.shape[1:] if "stacked" in path else p.shape
        for pattern, axes in LOGICAL_AXES:
            ranks = {len(shape) for path, shape in paths.items() if re.fullmatch(pattern, path)}
            assert ranks == {len(axes)}, pattern
        big = [path for path, shape in paths.items() if math.prod(shape) > 1_000_000]
        assert all(any(re.fullmatch(pattern, path) for pattern, _ in LOGICAL_AXES) for path in big)


def test_bad_config_and_inputs():
    config = json.loads(json.dumps({"_class_name": "FluxTransformer2DModel", **TINY}))
    assert FluxConfig.from_json(config) == FluxConfig.tiny()
    with pytest.raises(ValueError, match="rope_theta"):
        FluxConfig.from_json({**config, "rope_theta": 10_000})
    with pytest.raises(ValueError, match="sums to 20.*attention_head_dim=16"):
        FluxConfig.tiny(axes_dims_rope=(4, 8, 8))
    with pytest.raises(ValueError, match="even"):
        FluxConfig.tiny(axes_dims_rope=(4, 5, 7))
    with pytest.raises(ValueError, match="dtype"):
        FluxConfig.tiny(dtype="float16")
    model = nnx.eval_shape(lambda: FluxTransformer(FluxConfig.tiny(), rngs=nnx.Rngs(0)))
    cond = FluxCond(jnp.zeros((1, T, 32)), jnp.zeros((1, 32)))
    with pytest.raises(ValueError, match="FluxCond.guidance"):
        model.velocity(jnp.zeros((1, H, W, 4)), jnp.ones(1), cond)
    with pytest.raises(ValueError, match=r"\(B, h, w, 4\)"):
        model.velocity(jnp.zeros((1, H, W, 3)), jnp.ones(1), cond._replace(guidance=jnp.ones(1)))
