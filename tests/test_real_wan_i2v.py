"""Wan 2.1 image-to-video as a ``wan`` card against diffusers: a tiny random ``WanImageToVideoPipeline`` folder
(UMT5, the I2V transformer with image K/V, the Wan VAE, a tiny ``CLIPVisionModel`` + ``CLIPImageProcessor``; every
parameter random) loaded with ``jp.cards.load(folder)`` and rendered through jaxpipe's own program from the same
initial latents and sigmas gives the diffusers video within 1e-3; the engine serves the same card."""

import dataclasses
import types

import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
transformers = pytest.importorskip(
    "transformers", reason="the parity extra is not installed: pip install -e '.[parity]'"
)
Image = pytest.importorskip("PIL.Image")

from conftest import leaves_equal  # noqa: E402
from test_real_pipelines import PROMPT, WORDS, _randomise, _tokenizer  # noqa: E402

import jaxpipe as jp  # noqa: E402
from jaxpipe import parity  # noqa: E402
from jaxpipe.cards import generator, wan  # noqa: E402
from jaxpipe.cards.wan.program import resize_image  # noqa: E402
from jaxpipe.engine import Engine  # noqa: E402
from jaxpipe.loops import denoise  # noqa: E402
from jaxpipe.nn import clip_vision, hf  # noqa: E402
from jaxpipe.nn import wan as wan_nn  # noqa: E402

SIZE, FRAMES, STEPS = 32, 5, 2  # latents (2, 4, 4, 4): 8 transformer tokens; σ = 1, .75 after the shift of 3
NEGATIVE = "the moon"


def _image(seed: int, height: int = SIZE, width: int = SIZE) -> np.ndarray:
    """A uint8 RGB image: a smooth gradient plus noise, so both CLIP and the VAE see structure."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    smooth = np.stack([x, y, 1 - x * y], axis=-1) * 200
    return np.clip(smooth + rng.normal(0, 25, (height, width, 3)), 0, 255).astype(np.uint8)


def i2v_pipeline():
    """A tiny random diffusers Wan 2.1 ``WanImageToVideoPipeline`` (every parameter random): 32×32 video, a
    CLIP tower on 32² images, word-level UMT5 tokens over ``WORDS`` padded to 512 (as diffusers' I2V attention assumes)."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(2)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=12,
        out_channels=4,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=1,
        rope_max_seq_len=32,
        image_dim=32,
        added_kv_proj_dim=32,
    )
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
    clip = transformers.CLIPVisionModel(
        transformers.CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=SIZE,
            patch_size=8,
            hidden_act="gelu",  # Wan's ViT-H/14 uses plain GELU
        )
    )
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE})
    for i, module in enumerate((transformer, vae, umt5, clip)):
        _randomise(module, 20 + i)
    # diffusers' I2V attention takes the last 512 context tokens as text: its prompts are always padded to 512
    return WanImageToVideoPipeline(
        tokenizer=_tokenizer(WORDS, clip=False, max_length=512),
        text_encoder=umt5,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        image_processor=processor,
        image_encoder=clip,
        transformer=transformer,
    )


@pytest.fixture(scope="module")
def i2v_folder(tmp_path_factory):
    """The tiny pipeline saved as a folder, and the diffusers pipeline loaded back from it."""
    from diffusers import WanImageToVideoPipeline

    folder = tmp_path_factory.mktemp("wan-i2v-tiny")
    i2v_pipeline().save_pretrained(folder)
    return folder, WanImageToVideoPipeline.from_pretrained(folder)


@pytest.fixture(autouse=True)
def _ftfy(monkeypatch):
    """diffusers 0.42's I2V pipeline calls ``ftfy.fix_text`` whether or not ftfy is installed (its T2V pipeline
    checks); without ftfy, stand in the identity, which is what ``fix_text`` does to these ASCII prompts."""
    from diffusers.pipelines.wan import pipeline_wan_i2v

    if not hasattr(pipeline_wan_i2v, "ftfy"):
        monkeypatch.setattr(pipeline_wan_i2v, "ftfy", types.SimpleNamespace(fix_text=lambda text: text), raising=False)


@pytest.fixture(scope="module")
def i2v_card(i2v_folder):
    return jp.cards.load(
        i2v_folder[0], height=SIZE, width=SIZE, frames=FRAMES, max_sequence_length=512, num_steps=STEPS, guidance=3.0
    )


def _diffusers_video(pipe, card, image: np.ndarray, seed: int) -> np.ndarray:
    """diffusers' video from the initial latents jaxpipe draws for ``seed``, on jaxpipe's sigmas."""
    loop = card.spec.loop(wan.I2V_LOOP_ID)
    x0 = denoise.init(
        generator.request_keys([seed]), loop.latent_shape, {"c": np.zeros((1,))}, loop.config, {"c": np.zeros((1,))}
    ).x
    latents = torch.from_numpy(np.array(x0)).permute(0, 4, 1, 2, 3)
    # diffusers' Wan default schedule is not linspace(1, 0): give its Euler scheduler jaxpipe's sigmas (shifted by it)
    set_timesteps = pipe.scheduler.set_timesteps
    pipe.scheduler.set_timesteps = lambda n, device=None: set_timesteps(
        sigmas=np.linspace(1.0, 1.0 / n, n), device=device
    )
    try:
        with torch.no_grad():
            return pipe(
                Image.fromarray(image),
                PROMPT,
                negative_prompt=NEGATIVE,
                height=SIZE,
                width=SIZE,
                num_frames=FRAMES,
                num_inference_steps=STEPS,
                guidance_scale=3.0,
                latents=latents,
                max_sequence_length=512,
                output_type="np",
            ).frames
    finally:
        pipe.scheduler.set_timesteps = set_timesteps


def test_i2v_folder_loads_as_an_i2v_card(i2v_card):
    config = i2v_card.spec.config
    assert config.i2v and i2v_card.spec.family == "wan" and i2v_card.spec.capabilities == ("i2v",)
    assert i2v_card.spec.loop(wan.I2V_LOOP_ID).binds == ("transformer",)
    assert config.image_encoder == clip_vision.CLIPVisionConfig.tiny(
        intermediate_size=37, hidden_act="gelu", projection_dim=512
    )
    assert config.image_processing == clip_vision.ImageProcessing.openai(SIZE)
    assert jp.cards.registry.default_program(i2v_card) is wan.i2v_program()


@pytest.mark.slow  # ~15 s from a cold compile cache (eager random init, then a new fused program); the folder card covers rendering
def test_a_tiny_random_i2v_card_builds_and_renders(i2v_card):
    config = wan.Config.tiny_i2v(tokenizer=i2v_card.spec.config.tokenizer, num_steps=2)
    card = wan.build(config, seed=1)
    assert set(card.components) == {"text_encoder", "transformer", "vae", "image_encoder"}
    assert card.spec.capabilities == ("i2v",) and config.latent_shape == (2, 2, 2, 4)
    out = jp.generate(card, PROMPT, image=_image(5, 24, 20) / 255.0)
    assert out["video"].shape == (1, 5, 16, 16, 3) and out["latents"].shape == (1, 2, 2, 2, 4)


def test_i2v_card_round_trips_through_a_checkpoint(i2v_card, tmp_path):
    jp.cards.save_card(i2v_card, tmp_path / "card")
    back = jp.cards.load(tmp_path / "card")
    assert back.spec.config == i2v_card.spec.config and back.spec.capabilities == ("i2v",)
    assert jp.cards.registry.default_program(back) is wan.i2v_program()
    assert leaves_equal(nnx.state(back["image_encoder"]), nnx.state(i2v_card["image_encoder"]))


def test_i2v_pipeline_folder_renders_like_diffusers(i2v_folder, i2v_card):
    pipe = i2v_folder[1]
    image = _image(0)
    ours = np.asarray(
        jp.generate(i2v_card, PROMPT, image=image / 255.0, seed=5, inputs={"negative_prompt": NEGATIVE})["video"]
    )
    theirs = _diffusers_video(pipe, i2v_card, image, seed=5)
    assert ours.shape == theirs.shape == (1, FRAMES, SIZE, SIZE, 3)
    assert float(np.std(theirs)) > 1e-2
    np.testing.assert_allclose(ours, theirs, atol=1e-3)
    # the image matters: another first frame gives another video
    other = np.asarray(
        jp.generate(i2v_card, PROMPT, image=_image(1) / 255.0, seed=5, inputs={"negative_prompt": NEGATIVE})["video"]
    )
    assert float(np.abs(other - ours).max()) > 1e-2


@pytest.mark.slow  # ~8 s: the engine on the folder card; by default the folder renders like diffusers
def test_engine_serves_the_i2v_card_like_generate(i2v_card):  # ~5 s from a cold compile cache
    image = _image(0) / 255.0
    engine = Engine()
    engine.register(i2v_card)
    request = lambda seed: jp.Request(
        i2v_card.model_id, prompt=PROMPT, image=image, seed=seed, inputs={"negative_prompt": NEGATIVE}
    )
    served = engine.run(request(5))
    fused = jp.generate(i2v_card, PROMPT, image=image, seed=5, inputs={"negative_prompt": NEGATIVE})
    assert served["video"].shape == (FRAMES, SIZE, SIZE, 3)
    np.testing.assert_allclose(np.asarray(served["video"]), np.asarray(fused["video"][0]), atol=parity.TOLERANCE)
    # the image's CLIP tokens and first-frame latents are cached like the prompt's: another seed encodes nothing again
    assert sorted(k.component for k in engine.cache.keys()) == ["image_encoder", "text_encoder", "text_encoder", "vae"]
    engine.run(request(6))
    assert len(engine.cache.keys()) == 4 and engine.cache.stats().hits == 4


def test_a_larger_image_is_resized_to_the_video_like_diffusers():
    image = _image(3, 48, 40)
    ours = np.asarray(resize_image(image / 255.0, SIZE, SIZE))
    theirs = np.asarray(Image.fromarray(image).resize((SIZE, SIZE), resample=Image.LANCZOS)) / 255.0
    assert ours.shape == (SIZE, SIZE, 3)
    # PIL rounds to uint8 (and clips between its horizontal and vertical passes): ~0.3/255 on average
    diff = np.abs(ours - theirs) * 255
    assert float(diff.mean()) <= 0.5 and float(np.percentile(diff, 99)) <= 2.0, (diff.mean(), diff.max())


def test_any_image_size_renders_close_to_diffusers(i2v_folder, i2v_card):
    image = _image(4, 48, 40)  # CLIP resizes its shortest edge and centre crops; the VAE's copy is squeezed to 32×32
    ours = np.asarray(
        jp.generate(i2v_card, PROMPT, image=image / 255.0, seed=6, inputs={"negative_prompt": NEGATIVE})["video"]
    )
    theirs = _diffusers_video(i2v_folder[1], i2v_card, image, seed=6)
    # the interpolations differ in detail (PIL resamples uint8 pixels): measured 3e-3 at most, 2.5e-4 on average
    assert float(np.abs(ours - theirs).max()) <= 1e-2 and float(np.abs(ours - theirs).mean()) <= 1e-3


def test_i2v_configs_and_requests_are_checked(i2v_card):
    with pytest.raises(ValueError, match="animates a first frame"):
        jp.generate(i2v_card, PROMPT)
    with pytest.raises(ValueError, match=r"RGB image \(H, W, 3\)"):
        jp.generate(i2v_card, PROMPT, image=np.zeros((SIZE, SIZE, 1), np.float32))
    tiny = wan.Config.tiny_i2v()
    with pytest.raises(ValueError, match="Wan 2.2 I2V"):
        dataclasses.replace(tiny, image_encoder=None)
    with pytest.raises(ValueError, match="image_dim .* must equal image_encoder.hidden_size"):
        dataclasses.replace(tiny, image_encoder=clip_vision.CLIPVisionConfig.tiny(hidden_size=64))
    with pytest.raises(ValueError, match="crops"):
        dataclasses.replace(tiny, image_processing=clip_vision.ImageProcessing.openai(64))
    with pytest.raises(ValueError, match="text-to-video card has no image encoder"):
        dataclasses.replace(wan.Config.tiny(), image_encoder=tiny.image_encoder)


def test_the_cli_serves_an_i2v_folder_with_its_image_program(i2v_folder):
    from typer.testing import CliRunner

    from jaxpipe.cli import app

    result = CliRunner().invoke(app, ["generate", PROMPT, "--model", str(i2v_folder[0])])
    assert result.exit_code != 0 and "(i2v) starts from an image: pass --image" in result.output, result.output


def test_published_i2v_sizes_fit_together():
    config = wan.Config.i2v_14b()
    assert config.i2v and (config.height, config.width, config.frames, config.shift) == (480, 832, 81, 3.0)
    assert config.latent_shape == (21, 60, 104, 16) and config.loop_id == wan.I2V_LOOP_ID
    # diffusers' Wan2.1-I2V-14B transformer (tests/test_real_wan.py), CLIP ViT-H/14 224² -> 257 tokens of 1280
    assert wan_nn.WanTransformer.abstract(config.transformer).param_count() == 16_394_878_784
    assert config.image_encoder.hidden_size == config.transformer.image_dim == 1280
    assert (
        config.image_encoder.num_patches + 1 == 257 and config.image_processing == clip_vision.ImageProcessing.openai()
    )
    assert wan.Config.i2v_14b_720p().latent_shape == (21, 90, 160, 16)


@pytest.mark.slow  # ~5 s (60-330 s before jaxpipe.tracing): nnx.eval_shape of the whole 14B card; by default the 1.3B builds abstractly
def test_published_i2v_card_builds_abstractly():
    card = nnx.eval_shape(lambda: wan.build(wan.Config.i2v_14b()))
    assert card.spec.capabilities == ("i2v",) and card.spec.loop(wan.I2V_LOOP_ID).binds == ("transformer",)
    assert hf.count_params(card["transformer"]) == 16_394_878_784
    assert hf.count_params(card["image_encoder"]) == clip_vision.param_count(clip_vision.CLIPVisionConfig.vit_h14())
