"""CLIP vision, CLIPModel and CLIP's image preprocessing against transformers on tiny random models
(every parameter randomised), and the published sizes counted abstractly against transformers' own."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the parity reference needs torch (the `parity` extra)")
transformers = pytest.importorskip(
    "transformers", reason="the parity reference needs transformers (the `parity` extra)"
)

from jaxpipe.nn import clip_model, clip_vision  # noqa: E402

TOL = 1e-5
VISION = dict(
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
    projection_dim=16,
    hidden_act="gelu",
)
TEXT = dict(
    vocab_size=99,
    hidden_size=24,
    intermediate_size=29,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=16,
    eos_token_id=2,
)


def close(actual, desired, tol: float = TOL) -> None:
    """Within ``tol`` of the reference's scale (its largest magnitude, at least 1): float32 sums in another order."""
    desired = np.asarray(desired)
    np.testing.assert_allclose(np.asarray(actual), desired, rtol=0, atol=tol * max(1.0, float(np.max(np.abs(desired)))))


def _randomise(model, seed: int, scale: float = 0.3) -> None:
    """Every parameter random, LayerNorm weights around 1 (the defaults would make parity of the norms vacuous)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * scale
            norm = ("layer_norm" in name or "layrnorm" in name or "layernorm" in name) and name.endswith("weight")
            p.copy_(1.0 + noise if norm else noise)


def _save(model, path):
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    vision_config = transformers.CLIPVisionConfig(**VISION)
    bare = transformers.CLIPVisionModel(vision_config).eval()
    _randomise(bare, 0)
    projected = transformers.CLIPVisionModelWithProjection(vision_config).eval()
    _randomise(projected, 1)
    full = transformers.CLIPModel(
        transformers.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=16)
    ).eval()
    _randomise(full, 2)
    return {
        "bare": (bare, _save(bare, root / "bare")),
        "projected": (projected, _save(projected, root / "projected")),
        "full": (full, _save(full, root / "full")),
    }


def _pixels(seed: int, b: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(b, 32, 32, 3)).astype(np.float32)


def _torch_pixels(pixels: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_vision_tower_matches_transformers(folders, scan_layers):
    model, path = folders["bare"]
    ours = clip_vision.load(path, scan_layers=scan_layers)
    pixels = _pixels(0)
    with torch.no_grad():
        ref = model(pixel_values=_torch_pixels(pixels), output_hidden_states=True)
    last, pooled = jax.jit(lambda p: ours(p))(pixels)
    close(last, ref.last_hidden_state.numpy())
    close(pooled, ref.pooler_output.numpy())
    for index in (-2, 0, 1):
        close(ours.hidden_state(pixels, index), ref.hidden_states[index].numpy())
    with pytest.raises(IndexError, match="outside the 4 hidden states"):
        ours.hidden_state(pixels, 4)


@pytest.mark.slow  # ~8 s: by default the vision tower is held to transformers (scanned and unrolled)
def test_projected_tower_and_clip_model_match_transformers(folders):
    model, path = folders["projected"]
    pixels = _pixels(1)
    with torch.no_grad():
        ref = model(pixel_values=_torch_pixels(pixels)).image_embeds.numpy()
    close(clip_vision.load_with_projection(path)(pixels), ref)

    model, path = folders["full"]
    ours = clip_model.load(path)
    ids = np.array([[0, 5, 17, 40, 2, 1, 1, 1], [0, 9, 2, 1, 1, 1, 1, 1], [0, 3, 4, 5, 6, 7, 8, 2]], np.int64)
    mask = (np.arange(8)[None] <= np.argmax(ids, axis=1)[:, None]).astype(np.int64)
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), pixel_values=_torch_pixels(pixels)
        )
    image, text = ours.image_features(pixels), ours.text_features(ids, mask)
    close(image, _unnormalised(model, pixels))
    close(clip_model.normalize(image), out.image_embeds.numpy())
    close(clip_model.normalize(text), out.text_embeds.numpy())
    # CLIP's logits_per_image diagonal is exp(logit_scale)·cos of matching rows
    close(ours.similarity(image, text), np.diag(out.logits_per_image.numpy()))


def _unnormalised(model, pixels):
    with torch.no_grad():
        pooled = model.vision_model(pixel_values=_torch_pixels(pixels)).pooler_output
        return model.visual_projection(pooled).numpy()


def test_load_refuses_the_wrong_folder(folders):
    from jaxpipe.nn import hf

    with pytest.raises(hf.KeyMappingError, match="unexpected"):
        clip_vision.load(folders["projected"][1])
    with pytest.raises(ValueError, match="model_type must be 'clip'"):
        clip_model.load(folders["bare"][1])


def test_preprocess_equals_clip_image_processor():
    processor = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processing = clip_vision.ImageProcessing.from_json(processor.to_dict())
    assert processing == clip_vision.ImageProcessing(size=32, crop=(32, 32))
    rng = np.random.default_rng(0)
    exact = rng.integers(0, 256, size=(2, 32, 32, 3), dtype=np.uint8)  # crop-sized: no resampling on either side
    ref = processor(images=list(exact), return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
    np.testing.assert_allclose(np.asarray(clip_vision.preprocess(exact / 255.0, processing)), ref, atol=1e-5)
    # resized (48×40 -> shortest edge 32 -> 38×32 -> crop 32×32): JAX's antialiased bicubic vs PIL's on uint8
    smooth = np.clip(
        0.5
        + 0.4
        * np.sin(np.linspace(0, 3, 48))[None, :, None, None]
        * np.cos(np.linspace(0, 2, 40))[None, None, :, None]
        * np.array([1.0, 0.6, -0.8]),
        0,
        1,
    )
    uint8 = np.round(smooth * 255).astype(np.uint8)
    ref = processor(images=list(uint8), return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
    ours = np.asarray(clip_vision.preprocess(uint8 / 255.0, processing))
    assert ours.shape == ref.shape == (1, 32, 32, 3)
    assert np.max(np.abs(ours - ref)) < 0.05, np.max(
        np.abs(ours - ref)
    )  # normalised units (std ≈ 0.27): under 1.5/255 of a pixel


def test_preprocess_errors():
    with pytest.raises(ValueError, match=r"\(B, H, W, 3\)"):
        clip_vision.preprocess(np.zeros((2, 32, 32)))
    with pytest.raises(ValueError, match="smaller than the 32×32 crop"):
        clip_vision.preprocess(np.zeros((1, 16, 16, 3)), clip_vision.ImageProcessing(size=None, crop=(32, 32)))
    with pytest.raises(ValueError, match="std must be positive"):
        clip_vision.ImageProcessing(std=(0.1, 0.0, 0.1))


@pytest.mark.slow  # building the 1 B parameter trees abstractly (ours and transformers' on meta) takes ~20 s
@pytest.mark.parametrize(
    "name, hub", [("vit_l14", "openai/clip-vit-large-patch14"), ("vit_h14", "laion/CLIP-ViT-H-14")]
)
def test_published_sizes_count_like_transformers(name, hub):
    ours = getattr(clip_model.CLIPConfig, name)()
    text = {
        f.name: getattr(ours.text, f.name)
        for f in dataclasses.fields(ours.text)
        if f.name not in ("dtype", "scan_layers", "remat")
    }
    vision = {
        f.name: getattr(ours.vision, f.name)
        for f in dataclasses.fields(ours.vision)
        if f.name not in ("dtype", "scan_layers", "remat", "projection_dim")
    }
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=ours.projection_dim)
    with torch.device("meta"):
        full = transformers.CLIPModel(config)
        tower = transformers.CLIPVisionModelWithProjection(
            transformers.CLIPVisionConfig(**vision, projection_dim=ours.projection_dim)
        )
    assert clip_model.param_count(ours) == sum(p.numel() for p in full.parameters()), hub
    assert clip_vision.param_count(ours.vision, projection=True) == sum(p.numel() for p in tower.parameters()), hub
