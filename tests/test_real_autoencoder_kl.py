"""The FLUX AutoencoderKL against diffusers: a tiny random VAE computes the same posterior and
images (float32, channels-last vs NCHW), the full-size FLUX VAE has diffusers' exact parameter
keys and shapes, and bad checkpoints / configs fail naming what is wrong."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxpipe.nn import hf
from jaxpipe.nn.autoencoder_kl import RENAMES, AutoencoderKL, AutoencoderKLConfig

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")

TINY = dict(
    down_block_types=["DownEncoderBlock2D"] * 2,
    up_block_types=["UpDecoderBlock2D"] * 2,
    block_out_channels=[8, 16],
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=16,
    scaling_factor=0.3611,
    shift_factor=0.1159,
    # One reference covers both flag branches: encode through quant_conv, decode without post_quant_conv.
    use_quant_conv=True,
    use_post_quant_conv=False,
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A saved tiny diffusers VAE with every weight random (norm scales around 1), and its outputs."""
    torch.manual_seed(0)
    model = diffusers.AutoencoderKL(**TINY).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm_scale = "norm" in name and name.endswith("weight")
            p.copy_((1.0 if is_norm_scale else 0.0) + 0.3 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("vae")
    model.save_pretrained(folder)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    raw = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        posterior = model.encode(images).latent_dist
        decoded = model.decode(raw).sample
    nhwc = lambda t: t.permute(0, 2, 3, 1).numpy()
    outputs = dict(mean=nhwc(posterior.mean), logvar=nhwc(posterior.logvar), decoded=nhwc(decoded))
    return folder, nhwc(images), nhwc(raw), outputs


def test_tiny_vae_matches_diffusers(reference):
    folder, images, raw, ref = reference
    vae = AutoencoderKL.load(folder)
    cfg = vae.config
    assert cfg.use_quant_conv and not cfg.use_post_quant_conv and cfg.block_out_channels == (8, 16)
    z = (raw - cfg.shift_factor) * cfg.scaling_factor  # the FluxPipeline normalisation decode_latents undoes

    @jax.jit
    def run(vae, images, z):
        mean, logvar = vae.encode(images)
        return mean, logvar, vae.encode_latents(images), vae.decode_latents(z)

    mean, logvar, latents, decoded = jax.device_get(run(vae, jnp.asarray(images), jnp.asarray(z)))
    assert mean.shape == logvar.shape == (2, 8, 8, 4) and decoded.shape == (2, 16, 16, 3)
    for name, ours in (("mean", mean), ("logvar", logvar), ("decoded", decoded)):
        assert np.abs(ref[name]).max() > 0.1, f"{name}: vacuous reference"
        np.testing.assert_allclose(ours, ref[name], atol=1e-4, rtol=0, err_msg=name)
    np.testing.assert_allclose(latents, (ref["mean"] - cfg.shift_factor) * cfg.scaling_factor, atol=1e-4, rtol=0)


def test_flux_vae_has_diffusers_keys_and_shapes():
    with torch.device("meta"):
        ref = diffusers.AutoencoderKL(**{k: v for k, v in json.loads(FLUX_VAE_CONFIG).items() if k[0] != "_"})
    ref_shapes = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    cfg = AutoencoderKLConfig.from_json(json.loads(FLUX_VAE_CONFIG))
    assert cfg == AutoencoderKLConfig.flux()
    vae = nnx.eval_shape(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0)))
    ours = {}
    for path, var in nnx.to_flat_state(nnx.state(vae, nnx.Param)):
        shape = var.get_value().shape
        key = hf.torch_key(path, len(shape), RENAMES)
        # The torch layout of this parameter, from a zero-size broadcast view (no full-size arrays).
        ours[key] = hf.to_jax(str(path[-1]), np.broadcast_to(np.float32(0), ref_shapes.get(key, shape))).shape, shape
    assert set(ours) == set(ref_shapes)
    assert {k: a for k, (a, _) in ours.items()} == {k: b for k, (_, b) in ours.items()}
    assert vae.param_count() == sum(p.numel() for p in ref.parameters()) == 83_819_683
    # Shapes through the full-size network (the abstract parameters go in as arguments).
    mean, _ = jax.eval_shape(lambda m, x: m.encode(x), vae, jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32))
    assert mean.shape == (1, 8, 8, 16)
    assert jax.eval_shape(lambda m, z: m.decode_latents(z), vae, mean).shape == (1, 64, 64, 3)


def test_bad_checkpoint_names_every_offending_key(reference, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = reference[0]
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    tensors = load_file(str(next(folder.glob("*.safetensors"))))
    del tensors["encoder.conv_in.bias"]
    tensors["decoder.conv_out.weight"] = tensors["decoder.conv_out.weight"][:, :2]
    tensors["post_quant_conv.weight"] = np.zeros((4, 4, 1, 1), np.float32)
    save_file(tensors, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(hf.KeyMappingError) as err:
        AutoencoderKL.load(tmp_path)
    assert err.value.missing == ["encoder.conv_in.bias"] and err.value.unexpected == ["post_quant_conv.weight"]
    assert len(err.value.misshaped) == 1 and "decoder.conv_out.weight" in str(err.value)


def test_bad_config_and_input_are_refused():
    flux = json.loads(FLUX_VAE_CONFIG)
    for bad, match in [
        (dict(force_upcast=True, _class_name="AutoencoderKL", tile_size=512), "tile_size"),
        (dict(down_block_types=["DownEncoderBlock2D"]), "down_block_types"),
        (dict(up_block_types=["UpDecoderBlock2D"] * 3 + ["AttnUpDecoderBlock2D"]), "up_block_types"),
        (dict(norm_num_groups=48), "norm_num_groups"),
        (dict(act_fn="gelu"), "act_fn"),
        (dict(latents_mean=[0.0] * 16, latents_std=[1.0] * 16), "latents_mean"),
    ]:
        with pytest.raises(ValueError, match=match):
            AutoencoderKLConfig.from_json({**flux, **bad})
    with pytest.raises(ValueError, match="dtype"):
        AutoencoderKLConfig.tiny(dtype="float16")
    vae = nnx.eval_shape(lambda: AutoencoderKL(AutoencoderKLConfig.tiny(), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="channels-last"):
        jax.eval_shape(vae.encode, jax.ShapeDtypeStruct((1, 3, 16, 16), jnp.float32))
    with pytest.raises(ValueError, match="divisible by 2"):
        jax.eval_shape(vae.encode, jax.ShapeDtypeStruct((1, 15, 16, 3), jnp.float32))


# black-forest-labs/FLUX.1-dev vae/config.json
FLUX_VAE_CONFIG = """{
  "_class_name": "AutoencoderKL", "_diffusers_version": "0.30.0.dev0", "_name_or_path": "../checkpoints/flux-dev",
  "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
  "force_upcast": true, "in_channels": 3, "latent_channels": 16, "latents_mean": null, "latents_std": null,
  "layers_per_block": 2, "mid_block_add_attention": true, "norm_num_groups": 32, "out_channels": 3,
  "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
  "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
  "use_post_quant_conv": false, "use_quant_conv": false
}"""
