"""The Flax NNX components: tokenizer, text encoder, DiT, autoencoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed
from flax import nnx

from jaxpipe.digits import VOCABULARY
from jaxpipe.nn import Autoencoder, AutoencoderConfig, DiT, DiTConfig, TextEncoder, TextEncoderConfig, Tokenizer

TOK = Tokenizer(VOCABULARY)


@jax.jit
def call(module, *args):
    """``module(*args)`` in one compile per shape (eager NNX runs op by op: ~15 s for these tests)."""
    return module(*args)


def n_params(module) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(module, nnx.Param))))


# ---------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip_and_padding():
    ids = TOK.encode(["seven thick left", "one"], max_len=6)
    assert ids.shape == (2, 6) and ids.dtype == np.int32
    assert TOK.words[:2] == ("<pad>", "<unk>")
    assert list(ids[1, 1:]) == [0] * 5
    assert TOK.decode(ids) == ["seven thick left", "one"]


def test_tokenizer_unknown_words():
    with pytest.raises(ValueError, match="unknown word.*'purple'.*vocabulary is: zero"):
        TOK.encode(["seven purple"], max_len=4)
    ids = TOK.encode(["seven purple"], max_len=4, unknown="unk")
    assert ids[0, 1] == 1


def test_tokenizer_rejects_long_prompts():
    with pytest.raises(ValueError, match="max_len is 2"):
        TOK.encode(["one two three"], max_len=2)


# ---------------------------------------------------------------- text encoder
def test_text_encoder_shapes_and_padding_invariance():
    enc = TextEncoder(TextEncoderConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0))
    short = jnp.asarray(TOK.encode(["seven thick"], max_len=4))
    long = jnp.asarray(TOK.encode(["seven thick"], max_len=8))
    a, b = call(enc, short), call(enc, long)
    assert a.shape == (1, 4, 32) and b.shape == (1, 8, 32)
    np.testing.assert_allclose(a[:, :2], b[:, :2], atol=1e-5)  # padding is masked out of attention
    assert bool(jnp.all(jnp.isfinite(call(enc, jnp.zeros((1, 8), jnp.int32)))))  # the empty prompt


def test_text_encoder_rejects_too_long_ids():
    enc = TextEncoder(TextEncoderConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_len"):
        enc(jnp.ones((1, 9), jnp.int32))


# ---------------------------------------------------------------- DiT
def dit_inputs(b=2, t=1, side=8, c=4, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k[0], (b, t, side, side, c))
    ctx = jax.random.normal(k[1], (b, 5, 32))
    mask = jnp.arange(5)[None, :] < jnp.array([[3], [5]])[:b]
    return x, jnp.linspace(0.9, 0.2, b), ctx, mask


@pytest.mark.slow
def test_dit_starts_as_zero_velocity_adaln_zero():
    dit = DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0))
    x, s, ctx, mask = dit_inputs()
    assert float(jnp.abs(dit(x, s, ctx, mask)).max()) == 0.0


@pytest.mark.slow
def test_dit_image_and_video_share_one_class():
    dit = perturbed(DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0)))
    for t in (1, 4):
        x, s, ctx, mask = dit_inputs(t=t)
        v = dit(x, s, ctx, mask)
        assert v.shape == x.shape and v.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(v)))


def test_dit_examples_are_independent_and_text_matters():
    dit = perturbed(DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0)))
    x, s, ctx, mask = dit_inputs()
    both = call(dit, x, s, ctx, mask)
    first = call(dit, x[:1], s[:1], ctx[:1], mask[:1])
    np.testing.assert_allclose(both[:1], first, atol=1e-5)
    other_text = call(dit, x[:1], s[:1], ctx[1:], mask[:1])
    assert float(jnp.abs(other_text - first).max()) > 1e-4
    masked_tail = ctx.at[0, 3:].set(100.0)  # masked-out tokens must not matter
    np.testing.assert_allclose(call(dit, x, s, masked_tail, mask)[:1], first, atol=1e-5)


def test_dit_first_frame_conditioning():
    dit = perturbed(DiT(DiTConfig.tiny(frame_cond=True), rngs=nnx.Rngs(0)))
    x, s, ctx, mask = dit_inputs(t=4)
    frame_a = jax.random.normal(jax.random.key(5), (2, 8, 8, 4))
    va, vb = call(dit, x, s, ctx, mask, frame_a), call(dit, x, s, ctx, mask, -frame_a)
    assert float(jnp.abs(va - vb).max()) > 1e-4
    np.testing.assert_array_equal(va, call(dit, x, s, ctx, mask, frame_a))
    with pytest.raises(ValueError, match="frame_cond=False"):
        perturbed(DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0)))(x, s, ctx, mask, frame_a)


def test_dit_shape_errors():
    dit = DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0))
    x, s, ctx, mask = dit_inputs()
    with pytest.raises(ValueError, match="divisible by patch_size"):
        dit(x[:, :, :7, :7], s, ctx, mask)
    with pytest.raises(ValueError, match="must be"):
        dit(x[..., :3], s, ctx, mask)


@pytest.mark.slow
def test_dit_bfloat16_compute_keeps_float32_params_and_output():
    dit = perturbed(DiT(DiTConfig.tiny(dtype="bfloat16"), rngs=nnx.Rngs(0)))
    ref = perturbed(DiT(DiTConfig.tiny(), rngs=nnx.Rngs(0)))
    x, s, ctx, mask = dit_inputs()
    v, v32 = dit(x, s, ctx, mask), ref(x, s, ctx, mask)
    assert v.dtype == jnp.float32
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(dit, nnx.Param)))
    np.testing.assert_allclose(v, v32, atol=0.1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        DiT(DiTConfig.tiny(dtype="float8"), rngs=nnx.Rngs(0))


def test_billion_parameter_config_constructs_abstractly():
    big = nnx.eval_shape(lambda: DiT(DiTConfig.xl_1b(), rngs=nnx.Rngs(0)))
    assert n_params(big) > 1_000_000_000
    enc = nnx.eval_shape(lambda: TextEncoder(TextEncoderConfig.large(TOK.vocab_size), rngs=nnx.Rngs(0)))
    assert n_params(enc) > 100_000_000
    vae = nnx.eval_shape(lambda: Autoencoder(AutoencoderConfig.large(), rngs=nnx.Rngs(0)))
    assert n_params(vae) > 5_000_000


# ---------------------------------------------------------------- autoencoder
def test_autoencoder_shapes_and_video():
    ae = Autoencoder(AutoencoderConfig.tiny(), rngs=nnx.Rngs(0))
    images = jax.random.uniform(jax.random.key(0), (3, 16, 16, 1), minval=-1, maxval=1)
    z = ae.encode(images)
    assert z.shape == (3, 8, 8, 4)
    assert ae.decode(z).shape == images.shape
    video = jnp.stack([images] * 2, axis=1)
    zv = ae.encode_video(video)
    assert zv.shape == (3, 2, 8, 8, 4)
    np.testing.assert_allclose(zv[:, 0], z, atol=1e-5)
    assert ae.decode_video(zv).shape == video.shape
    with pytest.raises(ValueError, match="divisible by 2"):
        ae.encode(images[:, :15, :15])
