"""The Wan 2.1 VAE (jaxpipe.nn.wan_vae) against diffusers' AutoencoderKLWan: same numbers, same size, named errors."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")

from jaxpipe.nn import hf, wan_vae

TINY = {
    "base_dim": 8,
    "z_dim": 4,
    "dim_mult": [1, 2, 2, 2],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "latents_mean": [0.1, -0.2, 0.3, 0.0],
    "latents_std": [1.5, 0.5, 2.0, 1.0],
}


def channels_last(t):
    return np.asarray(t.detach().permute(0, 2, 3, 4, 1).numpy())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A tiny random AutoencoderKLWan (RMS gammas randomised too: they start at 1) saved as a diffusers folder."""
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLWan(**TINY).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("wan_vae")
    ref.save_pretrained(folder)
    return ref, folder


@pytest.mark.slow  # ~10 s: by default the Wan pipeline folders render like diffusers through this autoencoder
def test_encode_and_decode_match_diffusers(reference):
    ref, folder = reference
    vae = wan_vae.load(folder)
    # 9 frames = diffusers' first frame + two 4-frame chunks: both temporal resamplers reach their
    # cached steady state (the third latent frame), not only the first-chunk special case.
    video = torch.rand(1, 3, 9, 16, 16, generator=torch.Generator().manual_seed(1)) * 2 - 1
    image = video[:, :, :1]
    with torch.no_grad():
        posts = [ref.encode(x).latent_dist for x in (video, image)]
        decoded = [ref.decode(p.mean).sample for p in posts]

    @jax.jit
    def run(vae, video, image, z_video, z_image):
        return [vae.encode(video), vae.encode(image), vae.decode(z_video), vae.decode(z_image)]

    (mv, lv), (mi, li), dv, di = run(vae, *(channels_last(t) for t in (video, image, posts[0].mean, posts[1].mean)))
    assert mv.shape == (1, 3, 2, 2, 4) and mi.shape == (1, 1, 2, 2, 4) and dv.shape == (1, 9, 16, 16, 3)
    pairs = [
        (mv, posts[0].mean),
        (lv, posts[0].logvar),
        (mi, posts[1].mean),
        (li, posts[1].logvar),
        (dv, decoded[0]),
        (di, decoded[1]),
    ]
    errors = [float(np.abs(np.asarray(ours) - channels_last(theirs)).max()) for ours, theirs in pairs]
    assert max(errors) <= 1e-4, errors
    assert float((decoded[0].abs() < 1).float().mean()) > 0.9  # the clamp is not what makes them agree

    # The pipeline normalisation round-trips through the stored statistics.
    mean = jnp.asarray(TINY["latents_mean"])
    std = jnp.asarray(TINY["latents_std"])
    np.testing.assert_allclose(
        np.asarray(mv - mean) / np.asarray(std),
        jax.jit(lambda v, x: v.encode_latents(x))(vae, channels_last(video)),
        atol=1e-5,
    )


def test_full_size_wan21_has_the_diffusers_parameter_count():
    with torch.device("meta"):
        expected = sum(p.numel() for p in diffusers.AutoencoderKLWan().parameters())
    abstract = nnx.eval_shape(lambda: wan_vae.WanVAE(wan_vae.WanVAEConfig.wan21(), rngs=nnx.Rngs(0)))
    assert abstract.param_count() == expected == 126_892_531
    for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):  # every parameter has a sharding rule
        name, ndim = "/".join(map(str, path)), len(var.get_value().shape)
        axes = next((axes for pattern, axes in wan_vae.LOGICAL_AXES if re.fullmatch(pattern, name)), None)
        assert axes is not None and len(axes) == ndim, (name, axes)


def test_key_errors_are_named_and_bad_inputs_refused(reference, tmp_path):
    _, folder = reference
    tensors = hf.read_tensors(folder)
    tensors.pop("decoder.up_blocks.0.upsamplers.0.time_conv.weight")
    tensors["encoder.bogus.weight"] = np.zeros(3, np.float32)
    from safetensors.numpy import save_file

    save_file(tensors, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(hf.KeyMappingError, match=r"upsamplers\.0\.time_conv\.weight.*encoder\.bogus\.weight"):
        wan_vae.load(tmp_path)

    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(ValueError, match="unknown config key"):
        wan_vae.WanVAEConfig.from_json({**config, "block_out_channels": [1]})
    with pytest.raises(ValueError, match="Wan 2.2"):
        wan_vae.WanVAEConfig.from_json({**config, "is_residual": True})
    # Inputs are checked before any computation: an abstract module is enough.
    vae = nnx.eval_shape(lambda: wan_vae.WanVAE(wan_vae.WanVAEConfig.from_json(config), rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"1 \+ 4k"):
        vae.encode(jnp.zeros((1, 4, 16, 16, 3)))
    with pytest.raises(ValueError, match="multiples of 8"):
        vae.encode(jnp.zeros((1, 5, 12, 16, 3)))
