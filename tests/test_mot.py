"""The Mixture-of-Transformers stack: routing equivalences, KV reuse == recompute, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import perturbed
from flax import nnx

from jaxpipe.loops import ar
from jaxpipe.nn.mot import IMAGE, TEXT, MoT, MoTConfig, Routing
from jaxpipe.nn.mot_layer import cat_tokens as _cat
from jaxpipe.nn.mot_layer import token_meta as _meta

CFG = MoTConfig(vocab_size=11, max_text=8, latent_size=4, dim=32, depth=2, heads=2, time_embed_dim=16)


def make(routing="modality", seed=0) -> MoT:
    return perturbed(MoT(dataclasses.replace(CFG, routing=routing), rngs=nnx.Rngs(seed)), seed=seed + 7)


@pytest.fixture(scope="module")
def batch():
    k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
    ids = jax.random.randint(k1, (3, 6), 1, CFG.vocab_size)
    lengths = jnp.asarray([6, 3, 1])
    ids = jnp.where(jnp.arange(6)[None] < lengths[:, None], ids, 0)
    x = jax.random.normal(k2, (3, *CFG.latent_shape))
    sigma = jax.random.uniform(k3, (3,))
    return ids, lengths, x, sigma


def _embedded(mot, ids, x, sigma):
    b, length = ids.shape
    pos = jnp.broadcast_to(jnp.arange(length), (b, length))
    return mot._text_in(ids, pos), mot._image_in(x, mot._time(sigma, b))


def _generate_mask(valid, n_image):
    """The packed sequence's mask written out: text causal over valid text; image over valid text and all image."""
    b, length = valid.shape
    total = length + n_image
    causal = jnp.tril(jnp.ones((length, length), bool))[None] & valid[:, None, :]
    top = jnp.concatenate([causal, jnp.zeros((b, length, n_image), bool)], axis=2)
    bottom = jnp.concatenate(
        [jnp.broadcast_to(valid[:, None, :], (b, n_image, length)), jnp.ones((b, n_image, n_image), bool)], 2
    )
    return (jnp.concatenate([top, bottom], axis=1) | jnp.eye(total, dtype=bool)[None])[:, None]


@jax.jit
def _shared_and_plain(mot, ids, x, sigma):
    """The shared-routing stack and a plain pre-LN transformer with its weights, on the same packed sequence."""
    h_text, h_image = _embedded(mot, ids, x, sigma)
    valid = ids != 0
    pos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    meta = _cat(_meta(TEXT, pos, valid), mot._image_meta(ids.shape[0], h_image.shape[1]))
    (_, out_text), (_, out_image) = mot.transform([(TEXT, h_text), (IMAGE, h_image)], meta, meta, "generate")[0]
    h = jnp.concatenate([h_text, h_image], axis=1)
    mask = _generate_mask(valid, h_image.shape[1])
    for layer in mot.layers:
        (attn,), (ffn,) = layer.attn, layer.ffn
        b, length, d = h.shape
        q, k, v = jnp.split(attn.qkv(attn.norm(h)).reshape(b, length, 3, CFG.heads, d // CFG.heads), 3, axis=2)
        y = jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], mask=mask)
        h = h + attn.out(y.reshape(b, length, d))
        h = h + ffn.mlp(ffn.norm(h))
    return jnp.concatenate([out_text, out_image], axis=1), h


def test_shared_routing_is_a_plain_transformer_bit_for_bit(batch):
    ids, _, x, sigma = batch
    stack, plain = _shared_and_plain(make("shared"), ids, x, sigma)
    np.testing.assert_array_equal(np.asarray(stack), np.asarray(plain))


def _layer_norm(x, scale, bias, eps=1e-6):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * scale + bias


def _linear(p, x):
    y = x @ p.kernel[...]
    return y + p.bias[...] if p.bias is not None else y


@jax.jit
def _modality_and_reference(mot, ids, x, sigma):
    """The modality-routed forward and a reference: each token through its own expert's weights, one
    softmax over all keys, written out here."""
    h_text, h_image = _embedded(mot, ids, x, sigma)
    valid = ids != 0
    logits, velocity = mot.forward(ids, valid, x, sigma)
    mask = _generate_mask(valid, h_image.shape[1])[:, 0]
    types = [TEXT] * ids.shape[1] + [IMAGE] * h_image.shape[1]
    h = jnp.concatenate([h_text, h_image], axis=1)
    heads, hd = CFG.heads, CFG.dim // CFG.heads
    per_type = lambda fn: jnp.concatenate([fn(t, h[:, i : i + 1]) for i, t in enumerate(types)], axis=1)
    for layer in mot.layers:
        a = layer.attn
        qkv = per_type(lambda t, hi, a=a: _linear(a[t].qkv, _layer_norm(hi, a[t].norm.scale[...], a[t].norm.bias[...])))
        b, length, _ = qkv.shape
        q, k, v = (qkv.reshape(b, length, 3, heads, hd)[:, :, j] for j in range(3))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
        scores = jnp.where(mask[:, None], scores, -jnp.inf)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v).reshape(b, length, -1)
        h = h + jnp.concatenate([_linear(a[t].out, y[:, i : i + 1]) for i, t in enumerate(types)], axis=1)
        f = layer.ffn
        mlp = lambda t, hi, f=f: _linear(
            f[t].mlp.fc2, jax.nn.gelu(_linear(f[t].mlp.fc1, _layer_norm(hi, f[t].norm.scale[...], f[t].norm.bias[...])))
        )
        h = h + per_type(mlp)
    length = ids.shape[1]
    t_emb = mot._time(sigma, ids.shape[0])
    return logits, velocity, mot._text_out(h[:, :length]), mot._image_out(h[:, length:], t_emb, x.shape)


def test_modality_routing_is_two_experts_with_one_joint_softmax(batch):
    ids, _, x, sigma = batch
    logits, velocity, ref_logits, ref_velocity = _modality_and_reference(make("modality"), ids, x, sigma)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5)
    np.testing.assert_allclose(velocity, ref_velocity, atol=1e-5)


def test_parameter_counts_per_policy():
    counts = {
        name: make(r).param_counts()
        for name, r in [("shared", "shared"), ("modality", "modality"), ("partial", Routing.ffn_only(CFG.depth))]
    }
    assert counts["shared"]["understanding"] == counts["shared"]["generation"] == 0
    assert counts["modality"]["shared"] == 0
    assert counts["modality"]["understanding"] == counts["modality"]["generation"] == counts["shared"]["shared"]
    partial = counts["partial"]
    assert 0 < partial["shared"] < counts["shared"]["shared"] and partial["understanding"] == partial["generation"] > 0
    assert counts["shared"]["io"] == counts["modality"]["io"] == partial["io"]
    for c in counts.values():
        assert c["total"] == c["shared"] + c["understanding"] + c["generation"] + c["io"]
    first = make(Routing.first_shared(CFG.depth, 1)).param_counts()
    assert first["shared"] == first["understanding"] == first["generation"]


@jax.jit
def _cached_and_uncached(mot, ids, lengths, x, sigma):
    """Every cached path of the MoT next to its uncached counterpart (one compiled function)."""
    b, width = ids.shape
    full = mot(ids, ids != 0)
    logits, cache = mot.prefill(ids[:, :1], jnp.ones((b,), jnp.int32), mot.init_cache(b))
    decoded = [logits]
    for t in range(1, width):
        logits, cache = mot.decode_step(ids[:, t], jnp.full((b,), t), cache)
        decoded.append(logits)
    _, cache = mot.prefill(ids, lengths, mot.init_cache(b))
    v_cached = mot.velocity(x, sigma, mot.text_cond(cache, lengths))
    v_full = mot.forward(ids, ids != 0, x, sigma)[1]
    latents = x[:, :1]
    cache = mot.prefill_image(latents, mot.init_cache(b))
    after_prefill, cache = mot.prefill(ids[:, :2], jnp.full((b,), 2), cache)
    after_decode, _ = mot.decode_step(ids[:, 2], jnp.full((b,), 2), cache)
    understood = mot.understand(ids, jnp.ones(ids.shape, bool), latents)
    return full, jnp.stack(decoded, 1), v_cached, v_full, after_prefill, after_decode, understood


@pytest.mark.parametrize("routing", ["modality", pytest.param("shared", marks=pytest.mark.slow)])
def test_kv_reuse_equals_recompute(batch, routing):
    ids, lengths, x, sigma = batch
    full, decoded, v_cached, v_full, after_prefill, after_decode, understood = _cached_and_uncached(
        make(routing), ids, lengths, x, sigma
    )
    # Text: prefill then cached decoding == one teacher-forced forward (a padded row's logits are not a decode's).
    valid = np.asarray(ids != 0)
    np.testing.assert_allclose(np.asarray(decoded)[valid], np.asarray(full)[valid], atol=1e-5)
    # Image: denoising with the cached text K/V == the packed uncached forward.
    np.testing.assert_allclose(v_cached, v_full, atol=1e-5)
    # Understanding: the image in the cache, then the caption == the uncached understanding forward.
    np.testing.assert_allclose(after_prefill, understood[:, 1], atol=1e-5)
    np.testing.assert_allclose(after_decode, understood[:, 2], atol=1e-5)
    assert not np.allclose(understood, full, atol=1e-3), "the image must change what the text predicts"


@pytest.mark.slow  # the bagel-mot program tests drive the AR loop on a MoT; C2 of its thoughts is in test_mot_rl
def test_the_ar_loop_drives_the_mot_and_its_log_probs_recompute(batch):
    ids, lengths, _, _ = batch
    mot = make("modality")
    config = ar.ARConfig(max_new_tokens=2)
    keys = jax.random.split(jax.random.key(0), 3)
    final, records = ar.run(mot, ar.init(mot, ids, keys, config), config, capture=True)
    cont = ar.continuation(final, records)
    recomputed = ar.sequence_log_probs(mot, cont.tokens, cont.prompt_length, cont.mask)
    np.testing.assert_allclose(recomputed, cont.log_prob, atol=1e-5)
    assert int(cont.mask.sum()) == 6


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown routing policy 'mixed'"):
        MoTConfig(vocab_size=11, routing="mixed")
    with pytest.raises(ValueError, match="names 3 layers; the depth is 2"):
        MoTConfig(vocab_size=11, routing=Routing.ffn_only(3))
    mot = make("modality")
    with pytest.raises(ValueError, match="does not fit the packed sequence's max_text=8"):
        mot(jnp.ones((1, 9), jnp.int32))
    with pytest.raises(ValueError, match=r"understanding reads one image's latents \(1, 1, 4, 4, 4\)"):
        mot.prefill_image(jnp.zeros((1, 1, 8, 8, 4)), mot.init_cache(1))
