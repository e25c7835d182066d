"""The Wan VAE chunk by chunk (a jax.lax.scan carrying the causal caches) equals the whole-clip pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed
from flax import nnx

from jaxpipe.nn.wan_vae import WanVAE, WanVAEConfig


@pytest.fixture(scope="module")
def vae():
    """The tiny VAE with every parameter perturbed (biases start at 0), so that a cached frame and the
    causal zero padding give different numbers wherever a chunk boundary is mishandled."""
    return perturbed(WanVAE(WanVAEConfig.tiny(), rngs=nnx.Rngs(0)), seed=1)


@jax.jit
def both_ways(vae, video):
    chunked, whole = vae.encode(video), vae.encode(video, chunked=False)
    z = chunked[0]
    return chunked, whole, vae.decode(z), vae.decode(z, chunked=False)


# frame 0 + one and two 4-frame chunks (2 and 3 latent frames); 9 needs both cached frames of every conv
@pytest.mark.slow  # ~12 s of compiles (whole-clip and chunked, encode and decode); the default tier traces 480p
@pytest.mark.parametrize("frames", [5, 9])
def test_chunked_encode_and_decode_equal_the_whole_clip(vae, frames):
    video = jax.random.uniform(jax.random.key(frames), (2, frames, 16, 16, 3), minval=-1, maxval=1)
    (mean, logvar), (mean_w, logvar_w), decoded, decoded_w = both_ways(vae, video)
    latent_frames = 1 + (frames - 1) // 4
    assert mean.shape == logvar.shape == (2, latent_frames, 2, 2, 4) and decoded.shape == (2, frames, 16, 16, 3)
    for ours, whole in [(mean, mean_w), (logvar, logvar_w), (decoded, decoded_w)]:
        np.testing.assert_allclose(np.asarray(ours), np.asarray(whole), rtol=0, atol=1e-5)
    assert float(jnp.std(mean[:, 1:] - mean[:, :1])) > 1e-2  # later latent frames are not copies of the first
    assert float((jnp.abs(decoded) < 1).mean()) > 0.5  # most values are compared unclamped


def test_a_480p_81_frame_clip_traces_abstractly_at_full_size():
    abstract = nnx.eval_shape(lambda: WanVAE(WanVAEConfig.wan21(), rngs=nnx.Rngs(0)))
    video = jax.ShapeDtypeStruct((1, 81, 480, 832, 3), jnp.float32)
    mean, logvar = nnx.eval_shape(lambda m, v: m.encode(v), abstract, video)
    assert mean.shape == logvar.shape == (1, 21, 60, 104, 16) and mean.dtype == jnp.float32
    decoded = nnx.eval_shape(lambda m, z: m.decode(z), abstract, mean)
    assert decoded.shape == (1, 81, 480, 832, 3) and decoded.dtype == jnp.float32
