"""Whole real pipelines against diffusers: a tiny random ``FluxPipeline`` (and ``WanPipeline``) saved as a
diffusers folder, loaded with ``jp.cards.load(folder)`` and rendered through jaxpipe's own program from the
same initial latents and sigmas must give the diffusers images within 1e-3."""

import jax
import numpy as np
import pytest
from flax import nnx
from scripts.mesh_steps import random_weights  # numpy-filled weights: no eager init, no per-shape compiles

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
transformers = pytest.importorskip(
    "transformers", reason="the parity extra is not installed: pip install -e '.[parity]'"
)

import jaxpipe as jp  # noqa: E402
from jaxpipe.cards import generator  # noqa: E402
from jaxpipe.loops import denoise  # noqa: E402
from jaxpipe.nn.flux import FluxConfig  # noqa: E402

WORDS = ["a", "seven", "red", "cat", "on", "the", "moon", "thick", "slow"]
PROMPT = "a red cat on the moon"


def _randomise(module, seed: int, scale: float = 0.3) -> None:
    """Every parameter random (diffusers zero-initialises the adaLN and output layers: parity would be vacuous)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * scale
            p.copy_(
                1.0 + noise
                if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "_norm.weight")) and p.ndim == 1
                else noise
            )


def _tokenizer(words, *, clip: bool, max_length: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    if clip:  # CLIP pools at the largest id (eos_token_id 2, as openai's config): end-of-text is the last id
        specials = ["<|startoftext|>"]
        vocab = {t: i for i, t in enumerate([*specials, "<unk>", *words, "<|endoftext|>"])}
        eos, bos, pad = "<|endoftext|>", "<|startoftext|>", "<|endoftext|>"
        template = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
        )
    else:
        vocab = {t: i for i, t in enumerate(["<pad>", "</s>", "<unk>", *words])}
        eos, pad = "</s>", "<pad>"
        template = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = template
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pad, eos_token=eos, unk_token="<unk>", model_max_length=max_length
    )


def flux_pipeline():
    """A tiny random diffusers ``FluxPipeline`` (every parameter random) with word-level tokenizers over ``WORDS``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1,
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
    vae = AutoencoderKL(
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.1159,
        scaling_factor=0.3611,
    )
    clip = transformers.CLIPTextModel(
        transformers.CLIPTextConfig(
            vocab_size=len(WORDS) + 3,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            eos_token_id=2,
        )
    )
    t5 = transformers.T5EncoderModel(
        transformers.T5Config(
            vocab_size=len(WORDS) + 3,
            d_model=32,
            d_kv=8,
            d_ff=48,
            num_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            feed_forward_proj="gated-gelu",
        )
    )
    for i, module in enumerate((transformer, vae, clip, t5)):
        _randomise(module, i)
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    return FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=_tokenizer(WORDS, clip=True, max_length=16),
        text_encoder_2=t5,
        tokenizer_2=_tokenizer(WORDS, clip=False, max_length=16),
        transformer=transformer,
    )


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    from diffusers import FluxPipeline

    folder = tmp_path_factory.mktemp("flux-tiny")
    flux_pipeline().save_pretrained(folder)
    # the reference is the folder as diffusers loads it (an unsaved transformers T5 can differ from its own file)
    return folder, FluxPipeline.from_pretrained(folder)


def test_flux_pipeline_folder_renders_like_diffusers(flux_folder):
    folder, pipe = flux_folder
    steps = 3
    card = jp.cards.load(folder, height=16, width=16, max_sequence_length=16, num_steps=steps)
    assert card.spec.family == "flux" and sorted(card.components) == [
        "text_encoder",
        "text_encoder_2",
        "transformer",
        "vae",
    ]
    ours = jp.generate(card, PROMPT, seed=3, guidance=4.0)["image"]

    # the same initial latents: the noise jaxpipe's loop draws for seed 3, packed the diffusers way
    loop = card.spec.loop("t2i_denoise")
    x0 = denoise.init(generator.request_keys([3]), loop.latent_shape, {"c": np.zeros((1,))}, loop.config).x
    h, w, c = loop.latent_shape
    latents = pipe._pack_latents(torch.from_numpy(np.array(x0)).permute(0, 3, 1, 2), 1, c, h, w)
    with torch.no_grad():
        theirs = pipe(
            PROMPT,
            height=16,
            width=16,
            num_inference_steps=steps,
            guidance_scale=4.0,
            latents=latents,
            max_sequence_length=16,
            output_type="np",
        ).images
    assert ours.shape == theirs.shape == (1, 16, 16, 3)
    assert float(np.std(theirs)) > 1e-2  # a real image, not a constant
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-3)


def test_flux_tokenizers_and_bad_folders(flux_folder, tmp_path):
    folder, pipe = flux_folder
    card = jp.cards.load(folder, height=16, width=16, max_sequence_length=16)
    ids = card.spec.tokenizer.encode([PROMPT])
    clip_ids = pipe.tokenizer([PROMPT], padding="max_length", max_length=16, truncation=True).input_ids
    t5_ids = pipe.tokenizer_2([PROMPT], padding="max_length", max_length=16, truncation=True).input_ids
    np.testing.assert_array_equal(ids, np.concatenate([clip_ids, t5_ids], axis=1))
    # a loaded (e.g. RL-trained) card saves as a jaxpipe checkpoint, tokenizers and schedule included
    back = jp.cards.load(jp.cards.save_card(card, tmp_path / "saved"))
    assert back.spec == card.spec and np.array_equal(back.spec.tokenizer.encode([PROMPT]), ids)
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        jp.cards.flux.Config.from_diffusers(tmp_path)
    # an abstract card is enough: the request is refused while binding, before any compute
    schnell = nnx.eval_shape(
        lambda: jp.cards.flux.build(
            jp.cards.flux.Config(transformer=FluxConfig.tiny(guidance_embeds=False), guidance=None)
        )
    )
    with pytest.raises(ValueError, match="no guidance embedding"):
        jp.generate(schnell, PROMPT, guidance=2.0)
    with pytest.raises(ValueError, match="no tokenizer"):
        jp.generate(schnell, PROMPT)


@pytest.fixture(scope="module")
def wan_moe_folder(tmp_path_factory):
    """A tiny Wan 2.2-style pipeline: two experts switched at boundary_ratio 0.8, UMT5, the Wan VAE."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(1)
    experts = [
        WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=4,
            out_channels=4,
            text_dim=32,
            freq_dim=32,
            ffn_dim=64,
            num_layers=1,
            rope_max_seq_len=32,
        )
        for _ in range(2)
    ]
    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.1, -0.2, 0.3, 0.0],
        latents_std=[1.5, 0.8, 1.2, 2.0],
    )
    umt5 = transformers.UMT5EncoderModel(
        transformers.UMT5Config(
            vocab_size=len(WORDS) + 3,
            d_model=32,
            d_kv=8,
            d_ff=48,
            num_layers=1,
            num_heads=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            feed_forward_proj="gated-gelu",
        )
    )
    for i, module in enumerate((*experts, vae, umt5)):
        _randomise(module, 10 + i)
    pipe = WanPipeline(
        tokenizer=_tokenizer(WORDS, clip=False, max_length=16),
        text_encoder=umt5,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=experts[0],
        transformer_2=experts[1],
        boundary_ratio=0.8,
    )
    folder = tmp_path_factory.mktemp("wan-moe-tiny")
    pipe.save_pretrained(folder)
    return folder, WanPipeline.from_pretrained(folder)


@pytest.mark.slow  # ~12 s: the two-expert folder; by default the FLUX folder and the Wan networks are held to diffusers
def test_wan_moe_pipeline_folder_renders_like_diffusers(wan_moe_folder):
    folder, pipe = wan_moe_folder
    steps = 4  # σ = 1, .9, .75, .5 after the shift of 3: two steps on each expert of the 0.8 boundary
    card = jp.cards.load(folder, height=32, width=32, frames=5, max_sequence_length=16, num_steps=steps, guidance=3.0)
    assert card.spec.loop("t2v_denoise").binds == ("transformer", "transformer_2")
    ours = jp.generate(card, PROMPT, seed=5, inputs={"negative_prompt": "the moon"})["video"]

    loop = card.spec.loop("t2v_denoise")
    x0 = denoise.init(
        generator.request_keys([5]), loop.latent_shape, {"c": np.zeros((1,))}, loop.config, {"c": np.zeros((1,))}
    ).x
    latents = torch.from_numpy(np.array(x0)).permute(0, 4, 1, 2, 3)
    # diffusers' Wan default schedule is not linspace(1, 0): give its Euler scheduler jaxpipe's sigmas (shifted by it)
    set_timesteps = pipe.scheduler.set_timesteps
    pipe.scheduler.set_timesteps = lambda n, device=None: set_timesteps(
        sigmas=np.linspace(1.0, 1.0 / n, n), device=device
    )
    with torch.no_grad():
        theirs = pipe(
            PROMPT,
            negative_prompt="the moon",
            height=32,
            width=32,
            num_frames=5,
            num_inference_steps=steps,
            guidance_scale=3.0,
            latents=latents,
            max_sequence_length=16,
            output_type="np",
        ).frames
    assert ours.shape == theirs.shape == (1, 5, 32, 32, 3)
    assert float(np.std(theirs)) > 1e-2
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-3)


@pytest.mark.slow  # ~15 s; by default FlowGRPO trains a card of no world (test_own_reward.py) and the flux folder renders like diffusers (above)
def test_flowgrpo_trains_a_real_flux_card_unchanged():
    """FlowGRPO on a tiny random ``flux`` card (no torch needed): the update's first recompute of the captured
    log-probs is at the rollout weights (ratio 1, C2) and one step moves only the transformer."""
    from jaxpipe.prompts import Prompts, encode_text
    from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, Sampling

    card = random_weights(lambda: jp.cards.flux.build(jp.cards.flux.Config(num_steps=2)), seed=0)
    brightness = lambda artifacts, prompts: artifacts["image"].mean(
        axis=(1, 2, 3)
    )  # a user's reward: (B, H, W, 3) -> (B,)
    config = FlowGRPOConfig(group=Group(2), sampling=Sampling(num_steps=2, sampler="sde"), optimizer=Optimizer(1e-3))
    method = FlowGRPO(card, brightness, config)
    state = method.init()
    batch = Prompts(
        np.ones((1, 32), np.int32), encode_text(["a prompt"], 64), {}
    )  # this card has no tokenizer files: ids given
    rollout = method.rollout(state, batch, jax.random.key(0))
    new, metrics = method.update(state, rollout, jax.random.key(1))
    assert abs(float(metrics["ratio_mean"]) - 1.0) < 1e-5 and float(metrics["skipped"]) == 0.0
    moved = jax.tree.leaves(
        jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), new.params, state.params)
    )
    assert max(moved) > 0 and set(state.params["generator"]) == {"transformer"}
