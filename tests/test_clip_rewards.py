"""The real reward models in JAX (CLIPScore, PickScore, the LAION aesthetic predictor) against their PyTorch references.

Tiny random transformers ``CLIPModel`` / ``CLIPVisionModelWithProjection`` folders (every parameter
random) with a tiny CLIP tokenizer and image processor are scored by jaxpipe's rewards and by the
published scoring code in torch on the same images and prompts; the rewards are differentiable,
load from ``--reward KIND:DIR`` and train cards through FlowGRPO / DiffusionNFT (Python and CLI).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
transformers = pytest.importorskip(
    "transformers", reason="the parity extra is not installed: pip install -e '.[parity]'"
)
tokenizers = pytest.importorskip("tokenizers", reason="the parity extra is not installed: pip install -e '.[parity]'")

import jaxpipe as jp  # noqa: E402
from jaxpipe import rewards  # noqa: E402
from jaxpipe.rewards import aesthetic, clip  # noqa: E402

CORPUS = [
    "a photo of a cat",
    "a red fox jumps over the lazy dog",
    "two cats sit on a mat",
    "photo of the sea at night",
    "a red cat on the moon",
    "the red moon",
    "a seven",
    "a cat",
]
TEXTS = ["a photo of a cat", "the red moon", "two cats sit on a mat", "a fox at night"]
SIDE = 32  # the tiny towers' image size: images of this size are not resized
MAX_LENGTH = 16  # the tiny text tower's positions
TOLERANCE = 1e-4


def _randomise(module, seed: int, scale: float = 0.3) -> None:
    """Every parameter random (LayerNorm scales around 1), so parity cannot pass by zeros or identities."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * scale
            p.copy_(1.0 + noise if "norm" in name and name.endswith("weight") else noise)


def _bytes_to_unicode() -> list[str]:
    """CLIP's (GPT-2's) byte -> printable character table, in its order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(extra))]


def _tokenizer(root):
    """A tiny CLIP BPE written out by hand (a trained one breaks ties differently run to run): the byte
    alphabet, each byte ending a word (``</w>``), and left-to-right merges spelling CORPUS's words."""
    chars = _bytes_to_unicode()
    vocab = [*chars, *(c + "</w>" for c in chars)]
    merges = []
    for word in dict.fromkeys(" ".join(CORPUS).split()):
        pieces = [*word[:-1], word[-1] + "</w>"]
        while len(pieces) > 1:
            merged = pieces[0] + pieces[1]
            if merged not in vocab:
                vocab.append(merged)
                merges.append(f"{pieces[0]} {pieces[1]}")
            pieces = [merged, *pieces[2:]]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    root.mkdir()
    (root / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    (root / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    return transformers.CLIPTokenizer(str(root / "vocab.json"), str(root / "merges.txt"))


def _image_processor():
    return transformers.CLIPImageProcessorPil(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE})


def _clip_model(tokenizer, seed: int, logit_scale: float, eos_token_id: int):
    """A tiny random CLIPModel; ``eos_token_id`` 2 pools at the largest id (openai's / LAION's legacy configs),
    another at the first end-of-text token."""
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=MAX_LENGTH,
        eos_token_id=eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = dict(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, image_size=SIDE, patch_size=8
    )
    torch.manual_seed(seed)
    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    _randomise(model, seed)
    with torch.no_grad():
        model.logit_scale.fill_(logit_scale)
    return model.eval()


class _Head(torch.nn.Module):
    """improved-aesthetic-predictor's ``MLP`` (its ``nn.Sequential``, without the Lightning training code)."""

    def __init__(self, sizes=aesthetic.HEAD_SIZES):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(sizes[0], sizes[1]),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(sizes[1], sizes[2]),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(sizes[2], sizes[3]),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(sizes[3], sizes[4]),
            torch.nn.Linear(sizes[4], sizes[5]),
        )

    def forward(self, x):
        return self.layers(x)


def _head(seed: int, sizes=aesthetic.HEAD_SIZES):
    head = _Head(sizes)
    _randomise(head, seed, scale=0.2)
    with torch.no_grad():
        head.layers[7].bias.fill_(5.0)  # a rating around the published head's
    return head.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The saved folders and the torch references (loaded back from them).

    clip/: a CLIPModel in the hub layout (weights, tokenizer, preprocessor_config.json at its root);
    pick/: a CLIPModel alone (as yuvalkirstain/PickScore_v1) and laion/ its processor (transformers 5's
    CLIPProcessor.save_pretrained); pick-dir/: the one --reward pickscore:DIR loads (pick/'s files,
    laion/ as processor/); aesthetic/: clip/ a CLIPVisionModelWithProjection (768-d) and the head's .pth;
    aesthetic-st/: the same with the head as .safetensors; small-head.safetensors: a head for clip/ (16-d).
    """
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("clip-rewards")
    tok = _tokenizer(root / "bpe")
    clip_ref = _clip_model(tok, seed=0, logit_scale=1.2, eos_token_id=tok.eos_token_id)
    clip_ref.save_pretrained(root / "clip")
    tok.save_pretrained(root / "clip")
    _image_processor().save_pretrained(root / "clip")
    pick_ref = _clip_model(tok, seed=1, logit_scale=1.7, eos_token_id=2)
    pick_ref.save_pretrained(root / "pick")
    transformers.CLIPProcessor(image_processor=_image_processor(), tokenizer=tok).save_pretrained(root / "laion")
    (root / "pick-dir").mkdir()
    for name in ("config.json", "model.safetensors"):
        os.symlink(root / "pick" / name, root / "pick-dir" / name)
    os.symlink(root / "laion", root / "pick-dir" / "processor")

    torch.manual_seed(2)
    vision = transformers.CLIPVisionModelWithProjection(
        transformers.CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=SIDE,
            patch_size=8,
            projection_dim=aesthetic.HEAD_SIZES[0],
        )
    )
    _randomise(vision, 2)
    vision.eval().save_pretrained(root / "aesthetic" / "clip")
    head = _head(3)
    torch.save(head.state_dict(), root / "aesthetic" / "sac+logos+ava1-l14-linearMSE.pth")
    (root / "aesthetic-st").mkdir()
    os.symlink(root / "aesthetic" / "clip", root / "aesthetic-st" / "clip")
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, root / "aesthetic-st" / "head.safetensors")
    small = _head(4, sizes=(16, 32, 8, 8, 4, 1))
    save_file({k: v.contiguous() for k, v in small.state_dict().items()}, root / "small-head.safetensors")
    return {
        "root": root,
        "clip_ref": clip_ref,
        "pick_ref": pick_ref,
        "vision_ref": vision,
        "head_ref": head,
        "small_head_ref": small,
        "processor": transformers.CLIPProcessor.from_pretrained(root / "laion"),
    }


@pytest.fixture(scope="module")
def scorers(folders):
    """The JAX rewards, loaded once, and one jitted call each (shared by the tests: one compile per shape)."""
    root = folders["root"]
    loaded = {
        "clipscore": clip.clipscore(root / "clip"),
        "pickscore": clip.pickscore(root / "pick", processor=root / "laion"),
        "aesthetic": aesthetic.load(root / "aesthetic"),
    }
    return {name: (reward, jax.jit(reward)) for name, reward in loaded.items()}


def _images(n: int = 4, h: int = SIDE, w: int = SIDE, seed: int = 0):
    """uint8 images (the torch reference's input) and the same as floats in [0, 1] (jaxpipe's)."""
    u8 = np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    return u8, u8.astype(np.float32) / 255


def _features(model, processor, u8, texts):
    """The reference's L2-normalised image and text embeddings, computed as PickScore's README does."""
    with torch.no_grad():
        image_inputs = processor(images=list(u8), return_tensors="pt")
        text_inputs = processor(text=texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        image_embs = _tensor(model.get_image_features(**image_inputs))
        image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
        text_embs = _tensor(model.get_text_features(**text_inputs))
        text_embs = text_embs / torch.norm(text_embs, dim=-1, keepdim=True)
    return image_embs, text_embs


def _tensor(out):
    """transformers 5's ``get_*_features`` return a model output whose ``pooler_output`` is the projection."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _pickscore_reference(folders, u8, texts):
    model = folders["pick_ref"]
    image_embs, text_embs = _features(model, folders["processor"], u8, texts)
    with torch.no_grad():
        scores = model.logit_scale.exp() * (text_embs @ image_embs.T)  # the README's line
    return scores.diagonal().numpy()  # row i's image against row i's prompt


def _clipscore_reference(folders, u8, texts, w=2.5):
    image_embs, text_embs = _features(folders["clip_ref"], folders["processor"], u8, texts)
    return (w * torch.clamp((image_embs * text_embs).sum(dim=-1), min=0)).numpy()  # Hessel et al.: w·max(cos, 0)


def _normalized(a, axis=-1, order=2):
    """improved-aesthetic-predictor's ``normalized``, verbatim in effect."""
    l2 = np.atleast_1d(np.linalg.norm(a, order, axis))
    l2[l2 == 0] = 1
    return a / np.expand_dims(l2, axis)


def _aesthetic_reference(vision_features, head, u8):
    """simple_inference.py: CLIP image embedding -> normalized (NumPy) -> the MLP, in float32."""
    pixels = _image_processor()(images=list(u8), return_tensors="pt").pixel_values  # CLIP's own 224-style preprocess
    with torch.no_grad():
        emb = _normalized(vision_features(pixels).numpy())
        return head(torch.from_numpy(emb).type(torch.FloatTensor))[:, 0].numpy()


# ------------------------------------------------------------------------------------------ parity
def test_pickscore_matches_the_published_scoring(folders, scorers):
    u8, images = _images()
    ours = scorers["pickscore"][1]({"image": images}, rewards.text_prompts(TEXTS))
    want = _pickscore_reference(folders, u8, TEXTS)
    assert ours.shape == (4,) and ours.dtype == jnp.float32
    np.testing.assert_allclose(ours, want, rtol=TOLERANCE, atol=TOLERANCE)
    assert np.ptp(want) > 0.5  # the rows differ: a per-row mix-up would fail


def test_clipscore_matches_w_max_cos_0(folders, scorers):
    u8, images = _images(seed=8)  # one row of positive cosine, three negative (clamped)
    reward, jitted = scorers["clipscore"]
    prompts = rewards.text_prompts(TEXTS)
    ours = jitted({"image": images}, prompts)
    want = _clipscore_reference(folders, u8, TEXTS)
    np.testing.assert_allclose(ours, want, rtol=TOLERANCE, atol=TOLERANCE)
    cosines = np.asarray(jax.jit(reward.cosines)({"image": images}, prompts))[:, 0]
    assert (cosines < 0).any() and (cosines > 0).any()  # the clamp at 0 is exercised on both sides
    np.testing.assert_allclose(ours, 2.5 * np.maximum(cosines, 0), rtol=1e-6, atol=1e-6)
    w100 = clip.clipscore(folders["root"] / "clip", weight=100.0, model=reward.model)  # torchmetrics' w
    np.testing.assert_allclose(
        jax.jit(w100)({"image": images}, prompts),
        _clipscore_reference(folders, u8, TEXTS, w=100),
        rtol=TOLERANCE,
        atol=100 * TOLERANCE,
    )


def test_aesthetic_matches_the_published_predictor(folders, scorers):
    u8, images = _images(seed=2)
    vision_ref, head_ref = folders["vision_ref"], folders["head_ref"]
    want = _aesthetic_reference(lambda pixels: vision_ref(pixel_values=pixels).image_embeds, head_ref, u8)
    ours = scorers["aesthetic"][1]({"image": images}, rewards.text_prompts(TEXTS))
    np.testing.assert_allclose(ours, want, rtol=TOLERANCE, atol=TOLERANCE)
    assert np.ptp(want) > 1e-3
    # the head as .safetensors (same keys) scores the same; so does a head on a whole CLIPModel folder's vision tower
    same = aesthetic.load(folders["root"] / "aesthetic-st")
    np.testing.assert_allclose(jax.jit(same)({"image": images}), ours, rtol=1e-6, atol=1e-6)
    root = folders["root"]
    on_clip = aesthetic.load(root / "aesthetic", clip=root / "clip", head=root / "small-head.safetensors")
    clip_ref = folders["clip_ref"]
    want = _aesthetic_reference(
        lambda pixels: _tensor(clip_ref.get_image_features(pixel_values=pixels)), folders["small_head_ref"], u8
    )
    np.testing.assert_allclose(jax.jit(on_clip)({"image": images}), want, rtol=TOLERANCE, atol=TOLERANCE)


def test_resized_images_match_within_a_looser_tolerance(folders, scorers):
    """40×48 images are resized to 32×38 and centre cropped; jaxpipe's antialiased bicubic resize of the float
    images differs from PIL's of the uint8 ones by interpolation detail: PickScore (scale e^1.7 ≈ 5.5) within 0.05."""
    u8, images = _images(h=40, w=48, seed=3)
    pick = clip.pickscore(
        folders["root"] / "pick", processor=folders["root"] / "laion", model=scorers["pickscore"][0].model
    )
    ours = jax.jit(pick)({"image": images}, rewards.text_prompts(TEXTS))
    want = _pickscore_reference(folders, u8, TEXTS)
    np.testing.assert_allclose(ours, want, rtol=0, atol=0.05)


def test_videos_average_their_frames_and_grey_is_rgb(scorers):
    _, images = _images(n=6, seed=4)  # 2 videos of 3 frames
    reward, _ = scorers["pickscore"]
    prompts = rewards.text_prompts(TEXTS[:2])
    per_frame = jax.jit(reward)({"image": images}, rewards.text_prompts([TEXTS[0]] * 3 + [TEXTS[1]] * 3))
    video = jax.jit(reward)({"video": images.reshape(2, 3, SIDE, SIDE, 3)}, prompts)
    np.testing.assert_allclose(video, per_frame.reshape(2, 3).mean(axis=1), rtol=1e-5, atol=1e-5)
    grey = images[:2, ..., :1]
    np.testing.assert_allclose(
        jax.jit(reward)({"image": grey}, prompts),
        jax.jit(reward)({"image": np.repeat(grey, 3, axis=-1)}, prompts),
        rtol=1e-6,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="prompts.repeat"):
        reward({"image": images}, prompts)


def test_rewards_are_differentiable_in_the_images(scorers):
    _, images = _images(seed=5)
    prompts = rewards.text_prompts(TEXTS)
    for name in ("pickscore", "aesthetic"):
        reward = scorers[name][0]
        grad = jax.jit(jax.grad(lambda x, reward=reward: jnp.sum(reward({"image": x}, prompts))))(images)
        assert grad.shape == images.shape and bool(jnp.all(jnp.isfinite(grad))), name
        assert float(jnp.max(jnp.abs(grad))) > 1e-6, name


# ------------------------------------------------------------------------------------------ loading
def test_load_reward_models_by_kind_and_directory(folders, scorers, monkeypatch):
    root = folders["root"]
    pick = rewards.load(f"pickscore:{root / 'pick-dir'}")
    assert isinstance(pick, clip.PickScore) and pick.__name__ == "pickscore"
    assert rewards.load(f"pickscore:{root / 'pick-dir'}") is pick  # cached per kind and directory
    u8, images = _images()
    np.testing.assert_allclose(
        jax.jit(pick)({"image": images}, rewards.text_prompts(TEXTS)),
        _pickscore_reference(folders, u8, TEXTS),
        rtol=TOLERANCE,
        atol=TOLERANCE,
    )
    score = rewards.load(f"clipscore:{root / 'pick-dir'}")  # the same folder's CLIPModel (shared, not read again)
    cosines = jax.jit(score.cosines)({"image": images}, rewards.text_prompts(TEXTS))[:, 0]
    np.testing.assert_allclose(
        jax.jit(pick)({"image": images}, rewards.text_prompts(TEXTS)), np.exp(1.7) * cosines, rtol=1e-5, atol=1e-5
    )
    assert isinstance(rewards.load(f"aesthetic:{root / 'aesthetic'}"), aesthetic.AestheticScore)
    monkeypatch.chdir(root)  # a relative directory
    assert rewards.load("pickscore:pick-dir") is pick
    assert rewards.spec_name(f"pickscore:{root / 'pick-dir'}") == "pickscore"
    assert rewards.spec_name("my_rewards.py:brightness") == "brightness"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("pickscore:{root}/absent", "no pickscore model directory"),
        ("hpsv2:{root}/pick-dir", "unknown reward model kind 'hpsv2'; the kinds are clipscore, pickscore, aesthetic"),
        ("pickscore:{root}/pick", "no CLIP tokenizer"),  # PickScore_v1 alone: its processor is another folder's
        ("aesthetic:{root}/clip", "no clip/ folder .* put the CLIP in a clip/ sub-folder"),
        ("clipscore:{root}/aesthetic", "no config.json"),
        ("clipscore:{root}/aesthetic/clip", "model_type must be 'clip'"),
    ],
)
def test_load_errors_name_the_problem(folders, spec, message):
    with pytest.raises(ValueError, match=message):
        rewards.load(spec.format(root=folders["root"]))


def test_aesthetic_head_errors(folders, tmp_path):
    from safetensors.numpy import save_file

    root = folders["root"]
    save_file({"layers.0.weight": np.zeros((4, 768), np.float32)}, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match=r"not the LAION aesthetic head .*missing \['layers.0.bias'"):
        aesthetic.load(root / "aesthetic", head=tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="takes 768-d embeddings but the CLIP projects to 16"):
        aesthetic.load(root / "aesthetic", clip=root / "clip")
    (tmp_path / "headless").mkdir()
    (tmp_path / "headless" / "clip").symlink_to(root / "aesthetic" / "clip")
    with pytest.raises(FileNotFoundError, match="exactly one head file .*found none"):
        aesthetic.load(tmp_path / "headless")


def test_run_flags_name_reward_models_by_kind(folders, tmp_path):
    from jaxpipe.cli.train_flags import RunFlags

    root = folders["root"]
    flags = RunFlags(
        steps=1,
        out=tmp_path,
        reward=[f"pickscore:{root / 'pick-dir'}", f"aesthetic:{root / 'aesthetic'}"],
        reward_weight=[1.0, 0.5],
    )
    combined = flags.user_reward()
    _, images = _images()
    parts = jax.jit(combined)({"image": images}, rewards.text_prompts(TEXTS))
    assert sorted(parts) == ["aesthetic", "pickscore"]
    twice = RunFlags(steps=1, out=tmp_path, reward=[f"pickscore:{root / 'pick-dir'}", f"pickscore:{root / 'pick'}"])
    with pytest.raises(ValueError, match="share a name"):
        twice.user_reward()


# ------------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def pickscore_reward(folders):
    return rewards.load(f"pickscore:{folders['root'] / 'pick-dir'}")


def _methods(card, reward):
    from jaxpipe.training import DiffusionNFT, DiffusionNFTConfig, FlowGRPO, FlowGRPOConfig, Group, Sampling

    return {
        "flow-grpo": FlowGRPO(
            card, reward, FlowGRPOConfig(group=Group(2), sampling=Sampling(num_steps=2, sampler="sde"))
        ),
        "nft": DiffusionNFT(card, reward, DiffusionNFTConfig(group=Group(2), sampling=Sampling(num_steps=2))),
    }


@pytest.mark.slow  # ~10 s: two trainers' rollouts compiled with a CLIP in them; the steps below train with it
def test_flow_grpo_and_nft_rollouts_score_with_the_reward_model(t2i_card, pickscore_reward):
    """Inside FlowGRPO's and DiffusionNFT's jitted rollouts (the grey 16×16 digits card: resized, grey as RGB) the
    rewards are PickScore's of the rendered images."""
    from conftest import rl_batch

    batch = rl_batch(t2i_card)
    for name, method in _methods(t2i_card, pickscore_reward).items():
        ro = method.rollout(method.init(), batch, jax.random.key(0))
        want = jax.jit(pickscore_reward)(
            {"image": ro.images if name == "nft" else ro.generated.images}, batch.repeat(2)
        )
        np.testing.assert_allclose(ro.rewards, want, rtol=1e-5, atol=1e-5, err_msg=name)
        assert float(jnp.std(ro.rewards)) > 0, name


@pytest.mark.slow  # ~20 s: a FlowGRPO and a DiffusionNFT step compiled with the reward model in them
def test_flow_grpo_and_nft_steps_with_the_reward_model(t2i_card, pickscore_reward):
    from conftest import rl_batch

    for name, method in _methods(t2i_card, pickscore_reward).items():
        _, metrics = method.step(method.init(), rl_batch(t2i_card), jax.random.key(0))
        assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["reward_mean"])), name


@pytest.fixture(scope="module")
def flux_folder(tmp_path_factory):
    """A tiny random ``FluxPipeline`` saved by diffusers (``test_real_pipelines``'s): 16×16 RGB images."""
    pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
    from test_real_pipelines import flux_pipeline

    folder = tmp_path_factory.mktemp("flux-tiny")
    flux_pipeline().save_pretrained(folder)
    return folder


FLUX_PROMPTS = ["a red cat", "a cat on the moon", "the red moon", "a seven", "the cat", "a red seven"]


@pytest.mark.slow  # ~30 s: 24 FlowGRPO steps of a FLUX card with a CLIP reward in the loop (compiles included)
def test_flow_grpo_raises_the_pickscore_of_a_tiny_flux_card(flux_folder, pickscore_reward):
    """Deterministic (fixed seeds, a hand-written tokenizer): over every prompt with the same noise the trained
    card's mean PickScore beats the initial card's by +0.58 (seeds 1, 2 of the prompt order and key: +0.35, +0.61)."""
    from jaxpipe import prompts
    from jaxpipe.training import FlowGRPO, FlowGRPOConfig, Group, Optimizer, Sampling
    from jaxpipe.training.fit import fit

    card = jp.cards.load(flux_folder, height=16, width=16, max_sequence_length=16)
    config = FlowGRPOConfig(
        group=Group(4),
        sampling=Sampling(num_steps=2, sampler="sde", sde_window=(0, 2)),
        beta=0.0,
        optimizer=Optimizer(1e-3),
    )
    method = FlowGRPO(card, pickscore_reward, config)
    train = prompts.PromptSet.from_list(FLUX_PROMPTS)
    start = method.init()
    state, history = fit(
        method.step, start, train.batches(card, 2, seed=0), steps=24, key=jax.random.key(0), progress=False
    )
    assert len(history) == 24 and all(np.isfinite(row["reward_mean"]) for row in history)
    # (the per-step reward_mean swings by ±1.4 with the step's two prompts: judge every prompt under the same noise)
    every, key = train.prompts(card), jax.random.key(123)
    before, after = method.rollout(start, every, key).rewards, method.rollout(state, every, key).rewards
    assert float(jnp.mean(after)) > float(jnp.mean(before)) + 0.2, (before, after)


@pytest.mark.slow  # ~40 s: a CLI run with its own compiles; the Python paths above are the default tier's
def test_jaxpipe_train_flow_grpo_with_reward_pickscore_dir(flux_folder, folders, tmp_path):
    from typer.testing import CliRunner

    from jaxpipe.cli import app

    (tmp_path / "prompts.txt").write_text("\n".join(FLUX_PROMPTS) + "\n")

    def train(reward: str, out):
        return CliRunner().invoke(
            app,
            [
                "train",
                "flow-grpo",
                "--model",
                str(flux_folder),
                "--model-option",
                "height=16",
                "--model-option",
                "width=16",
                "--model-option",
                "max_sequence_length=16",
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--reward",
                reward,
                "--steps",
                "4",
                "--out",
                str(out),
                "-P",
                "2",
                "-K",
                "4",
                "--num-steps",
                "2",
                "--sde-window",
                "all",
                "--beta",
                "0",
                "--lr",
                "1e-3",
                "--heldout",
                "0.34",
                "--eval-samples",
                "2",
                "--diversity-prompts",
                "2",
                "--diversity-seeds",
                "2",
                "--save-every",
                "100",
            ],
        )

    missing = train(f"pickscore:{tmp_path / 'absent'}", tmp_path / "nothing")
    assert missing.exit_code == 2 and "no pickscore model directory" in missing.output, (
        missing.output
    )  # before any card loads
    result = train(f"pickscore:{folders['root'] / 'pick-dir'}", tmp_path / "run")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(np.isfinite(row["reward_mean"]) for row in rows)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert "heldout_reward" in report["summary"] and report["settings"]["prompts"]["heldout"] == 2
    assert jp.cards.load(tmp_path / "run").spec.family == "flux"
