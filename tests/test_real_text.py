"""The real text encoders (T5 / UMT5 / CLIP text) and tokenizers match transformers.

Tiny random transformers models (every constant-initialised parameter perturbed) are saved with
``save_pretrained``, loaded into jaxpipe, and run once each under jit with padded inputs; the full
FLUX / Wan sizes are only built abstractly and counted against transformers on the meta device.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
transformers = pytest.importorskip(
    "transformers", reason="the parity extra is not installed: pip install -e '.[parity]'"
)
tokenizers = pytest.importorskip("tokenizers", reason="the parity extra is not installed: pip install -e '.[parity]'")
from safetensors.numpy import load_file, save_file

from jaxpipe.nn import clip, hf, t5
from jaxpipe.nn.tokenizer import HFTokenizer

TINY_T5 = {
    "vocab_size": 100,
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 48,
    "num_layers": 2,
    "num_heads": 2,
    "feed_forward_proj": "gated-gelu",
    # few buckets so 10 tokens reach the exact, logarithmic and clamped ranges
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 6,
}
TINY_CLIP = {
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 37,
    "max_position_embeddings": 16,
    "eos_token_id": 50,
    "bos_token_id": 49,
    "pad_token_id": 0,
}
TINY_CLIP_CONFIG = {k: v for k, v in TINY_CLIP.items() if k not in ("bos_token_id", "pad_token_id")}


def _saved(model, folder):
    """Perturb every constant-initialised parameter (norm weights, biases), then save."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if bool((p == p.flatten()[0]).all()):
                p.add_(0.1 * torch.randn_like(p))
    model.eval().save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("real_text")
    refs = {
        "t5": transformers.T5EncoderModel(transformers.T5Config(**TINY_T5)),
        "umt5": transformers.UMT5EncoderModel(transformers.UMT5Config(**TINY_T5)),
        "clip": transformers.CLIPTextModel(transformers.CLIPTextConfig(**TINY_CLIP)),
    }
    return {name: (_saved(ref, root / name), root / name) for name, ref in refs.items()}


def _forward(module, *args):
    graphdef, state = nnx.split(module)
    return jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))(state, *args)


@pytest.mark.parametrize("name", ["t5", "umt5"])
def test_t5_encoders_match_transformers(folders, name):
    ref, folder = folders[name]
    ids = np.array([[5, 7, 9, 11, 3, 1, 0, 0, 0, 0], [4, 8, 15, 16, 23, 42, 2, 99, 13, 1]])
    mask = (np.arange(10) < np.array([[6], [10]])).astype(np.int64)
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    got = _forward(t5.load(folder), jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))
    assert got.shape == (2, 10, 32) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=0)


def test_clip_text_matches_transformers_and_both_pooling_rules(folders):
    ref, folder = folders["clip"]
    # row 0 is padded (with the end-of-text id, as CLIP pads); row 1's largest id (97) is not its end-of-text
    ids = np.array([[49, 12, 30, 50, 50, 50, 50], [49, 97, 13, 7, 50, 3, 0]])
    mask = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    hidden, pooled = _forward(clip.load(folder), jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))
    np.testing.assert_allclose(np.asarray(hidden), want.last_hidden_state.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(pooled), want.pooler_output.numpy(), atol=1e-4, rtol=0)
    # openai's / FLUX's configs keep eos_token_id 2: transformers then pools at the largest id
    legacy = transformers.CLIPTextModel.from_pretrained(folder, eos_token_id=2).eval()
    with torch.no_grad():
        want_legacy = legacy(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).pooler_output.numpy()
    np.testing.assert_allclose(np.asarray(clip.pool_eos(hidden, ids, 2)), want_legacy, atol=1e-4, rtol=0)
    assert not np.allclose(want_legacy[1], want.pooler_output.numpy()[1])


def test_relative_position_buckets_match_transformers_at_full_size():
    offsets = np.arange(-700, 701)
    from transformers.models.t5.modeling_t5 import T5Attention

    want = T5Attention._relative_position_bucket(torch.tensor(offsets), True, 32, 128).numpy()
    np.testing.assert_array_equal(t5.relative_position_bucket(offsets, num_buckets=32, max_distance=128), want)


def _write_tokenizers(root):
    """A T5-like BPE (``</s>`` appended, ``<pad>`` padding) saved by ``PreTrainedTokenizerFast`` (right
    and left sides), and a CLIP folder of only vocab.json + merges.txt, like FLUX's ``tokenizer/``."""
    from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

    corpus = [
        "a photo of a cat",
        "a red fox jumps over the lazy dog",
        "two cats sit on a mat",
        "photo of the sea at night",
    ]
    bpe = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.normalizer, bpe.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"]))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    for side in ("right", "left"):
        transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe,
            pad_token="<pad>",
            eos_token="</s>",
            unk_token="<unk>",
            padding_side=side,
            truncation_side=side,
        ).save_pretrained(root / f"t5_{side}")
    byte_bpe = tokenizers.Tokenizer(models.BPE(continuing_subword_prefix="", end_of_word_suffix="</w>"))
    byte_bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            end_of_word_suffix="</w>",
            special_tokens=["<|startoftext|>", "<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    model = json.loads(byte_bpe.to_str())["model"]
    (root / "clip").mkdir()
    (root / "clip" / "vocab.json").write_text(json.dumps(model["vocab"]))
    (root / "clip" / "merges.txt").write_text("#version: 0.2\n" + "".join(" ".join(m) + "\n" for m in model["merges"]))
    special = {
        "content": "",
        "lstrip": False,
        "normalized": True,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }
    (root / "clip" / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "CLIPTokenizer",
                "bos_token": "<|startoftext|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "model_max_length": 77,
                "added_tokens_decoder": {
                    "0": {**special, "content": "<|startoftext|>"},
                    "1": {**special, "content": "<|endoftext|>"},
                },
            }
        )
    )
    return ["t5_right", "t5_left", "clip"]


def test_tokenizer_matches_transformers_padding_and_truncation(tmp_path):
    prompts = ["a photo of a cat", "Two CATS sit, on a mat!  at night <|endoftext|> photo", "", "the lazy\tdog"]
    for name in _write_tokenizers(tmp_path):
        ref = transformers.AutoTokenizer.from_pretrained(tmp_path / name)
        ours = HFTokenizer.from_folder(tmp_path / name)
        for max_length in (4, 16):  # truncating every prompt but the empty one; padding them all
            want = ref(prompts, padding="max_length", max_length=max_length, truncation=True)
            ids, mask = ours(prompts, max_length)
            assert ids.dtype == mask.dtype == np.int32 and ids.shape == (4, max_length)
            np.testing.assert_array_equal(ids, want["input_ids"], err_msg=f"{name} {max_length}")
            np.testing.assert_array_equal(mask, want["attention_mask"], err_msg=f"{name} {max_length}")


def _meta_count(model_cls, config):
    with torch.device("meta"):
        return sum(p.numel() for p in model_cls(config).parameters())


def test_full_sizes_equal_transformers_and_axes_cover_them():
    cases = [
        (
            t5,
            t5.T5EncoderConfig.t5_xxl(),
            transformers.T5EncoderModel,
            transformers.T5Config(
                vocab_size=32128,
                d_model=4096,
                d_kv=64,
                d_ff=10240,
                num_layers=24,
                num_heads=64,
                feed_forward_proj="gated-gelu",
            ),
            4.76e9,
        ),
        (
            t5,
            t5.T5EncoderConfig.umt5_xxl(),
            transformers.UMT5EncoderModel,
            transformers.UMT5Config(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64),
            5.68e9,
        ),
        (
            clip,
            clip.CLIPTextEncoderConfig.vit_l14(),
            transformers.CLIPTextModel,
            transformers.CLIPTextConfig(
                hidden_size=768,
                intermediate_size=3072,
                num_attention_heads=12,
                num_hidden_layers=12,
                projection_dim=768,
            ),
            123.06e6,
        ),
    ]
    for module, config, ref_cls, ref_config, approx in cases:
        count = module.param_count(config)
        assert count == _meta_count(ref_cls, ref_config), config
        assert abs(count / approx - 1) < 1e-3, (config, count)
    # every LOGICAL_AXES rule names some parameter, with one axis name per dimension (tiny sizes, same paths; a
    # stacked layer's param by its layer's path and rank, as distributed.logical_axes matches it)
    import re

    for module, config, build in (
        (t5, t5.T5EncoderConfig(**TINY_T5), t5.T5Encoder),
        (clip, clip.CLIPTextEncoderConfig(**TINY_CLIP_CONFIG), clip.CLIPTextEncoder),
    ):
        params = nnx.to_flat_state(
            nnx.state(nnx.eval_shape(lambda b=build, c=config: b(c, rngs=nnx.Rngs(0))), nnx.Param)
        )
        paths = {}
        for path, var in params:
            name = "/".join(map(str, path))
            paths[name.replace("/stacked/", "/0/")] = var.get_value().ndim - ("/stacked/" in name)
        for pattern, axes in module.LOGICAL_AXES:
            ranks = {ndim for path, ndim in paths.items() if re.fullmatch(pattern, path)}
            assert ranks == {len(axes)}, (pattern, ranks)


def test_checkpoint_layouts_and_key_errors(folders, tmp_path):
    _, t5_folder = folders["t5"]
    tensors = load_file(t5_folder / "model.safetensors")
    shared = tensors["shared.weight"]

    def variant(name, tensors, config_folder=t5_folder, **config_changes):
        folder = tmp_path / name
        folder.mkdir()
        config = json.loads((config_folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
        save_file(tensors, folder / "model.safetensors")
        return folder

    # the tied token table saved under either name or both; a seq2seq checkpoint's decoder is ignored
    rest = {k: v for k, v in tensors.items() if k != "shared.weight"}
    for name, extra in [
        ("embed_only", {"encoder.embed_tokens.weight": shared}),
        (
            "both",
            {
                "shared.weight": shared,
                "encoder.embed_tokens.weight": shared,
                "decoder.final_layer_norm.weight": np.ones(32, np.float32),
            },
        ),
    ]:
        loaded = t5.load(variant(name, {**rest, **extra}))
        np.testing.assert_array_equal(np.asarray(loaded.shared.embedding[...]), shared)
    # missing, unexpected and mis-shaped keys are named
    broken = {k: v for k, v in tensors.items() if k != "encoder.final_layer_norm.weight"}
    broken["encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"] = np.zeros((8, 2), np.float32)
    with pytest.raises(hf.KeyMappingError, match=r"encoder\.final_layer_norm\.weight.*relative_attention_bias"):
        t5.load(variant("broken", broken))
    with pytest.raises(hf.KeyMappingError, match=r"mis-shaped.*wi_0\.weight"):
        t5.load(variant("d_ff", tensors, d_ff=64))
    # UMT5 has a bias table in every block: the T5 checkpoint lacks block 1's
    with pytest.raises(
        hf.KeyMappingError, match=r"missing.*block\.1\.layer\.0\.SelfAttention\.relative_attention_bias"
    ):
        t5.load(variant("as_umt5", tensors, model_type="umt5"))

    # the hub's CLIP layout: text_model. prefix and a persisted position_ids buffer
    _, clip_folder = folders["clip"]
    clip_tensors = load_file(clip_folder / "model.safetensors")
    hub = {f"text_model.{k}": v for k, v in clip_tensors.items()}
    hub["text_model.embeddings.position_ids"] = np.arange(16)[None]
    loaded = clip.load(variant("clip_hub", hub, config_folder=clip_folder), dtype="bfloat16")
    assert loaded.encoder.layers.layer(1).mlp.fc2.kernel[...].dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(loaded.final_layer_norm.bias[...], np.float32), clip_tensors["final_layer_norm.bias"], atol=1e-2
    )
    with pytest.raises(hf.KeyMappingError, match=r"unexpected.*text_projection"):
        clip.load(
            variant(
                "clip_proj",
                {**clip_tensors, "text_projection.weight": np.zeros((32, 32), np.float32)},
                config_folder=clip_folder,
            )
        )


def test_bad_configs_inputs_and_tokenizer_folders(tmp_path):
    with pytest.raises(ValueError, match="model_type must be 't5' or 'umt5'"):
        t5.T5EncoderConfig.from_json({"model_type": "bert"})
    with pytest.raises(ValueError, match="decoder"):
        t5.T5EncoderConfig.from_json({"model_type": "t5", "is_decoder": True})
    with pytest.raises(ValueError, match="feed_forward_proj"):
        t5.T5EncoderConfig.t5_xxl(feed_forward_proj="gated-gelu-x")
    with pytest.raises(ValueError, match="activation 'foo'"):
        t5.T5EncoderConfig.t5_xxl(feed_forward_proj="gated-foo")
    with pytest.raises(ValueError, match="num_heads"):
        t5.T5EncoderConfig.t5_xxl(num_heads=0)
    with pytest.raises(ValueError, match="dtype"):
        t5.T5EncoderConfig.t5_xxl(dtype="float16")
    with pytest.raises(ValueError, match="relative_attention_max_distance"):
        t5.T5EncoderConfig.t5_xxl(relative_attention_max_distance=4)
    xxl = t5.T5EncoderConfig.from_json(
        {
            "model_type": "umt5",
            "vocab_size": 256384,
            "d_model": 4096,
            "d_ff": 10240,
            "num_layers": 24,
            "num_heads": 64,
            "num_decoder_layers": 3,
        }
    )
    assert xxl == t5.T5EncoderConfig.umt5_xxl() and xxl.act == "gelu_new" and xxl.is_gated
    with pytest.raises(ValueError, match="text tower"):
        clip.CLIPTextEncoderConfig.from_json({"model_type": "clip"})
    with pytest.raises(ValueError, match="divisible"):
        clip.CLIPTextEncoderConfig.vit_l14(num_attention_heads=5)
    with pytest.raises(ValueError, match="hidden_act"):
        clip.CLIPTextEncoderConfig.vit_l14(hidden_act="tanh")
    tiny = nnx.eval_shape(
        lambda: clip.CLIPTextEncoder(clip.CLIPTextEncoderConfig(**TINY_CLIP_CONFIG), rngs=nnx.Rngs(0))
    )
    with pytest.raises(ValueError, match="at most 16"):
        tiny(jnp.zeros((1, 17), jnp.int32))

    # tokenizer folders: SentencePiece only, no pad token, bad calls
    (tmp_path / "spm").mkdir()
    (tmp_path / "spm" / "spiece.model").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"only a SentencePiece model \(spiece\.model\).*save_pretrained"):
        HFTokenizer.from_folder(tmp_path / "spm")
    with pytest.raises(FileNotFoundError, match="no such tokenizer folder"):
        HFTokenizer.from_folder(tmp_path / "absent")
    (tmp_path / "nopad").mkdir()
    word = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    word.save(str(tmp_path / "nopad" / "tokenizer.json"))
    with pytest.raises(ValueError, match="no pad token"):
        HFTokenizer.from_folder(tmp_path / "nopad")
    shutil.copy(tmp_path / "nopad" / "tokenizer.json", tmp_path / "spm" / "tokenizer.json")
    (tmp_path / "spm" / "tokenizer_config.json").write_text(json.dumps({"pad_token": "<unk>"}))
    ours = HFTokenizer.from_folder(tmp_path / "spm")
    with pytest.raises(ValueError, match="max_length"):
        ours(["a"], 0)
    with pytest.raises(TypeError, match="strings"):
        ours([1, "a"], 4)
    ids, mask = ours("a a", 3)
    np.testing.assert_array_equal(ids, [[1, 1, 1]])  # no whitespace pre-tokenizer: one unknown word, then padding
    np.testing.assert_array_equal(mask, [[1, 0, 0]])
