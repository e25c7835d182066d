"""LoRA adapters (jaxpipe.nn.lora) interchange with diffusers' and peft's, on a tiny FluxTransformer2DModel.

A random tiny diffusers FLUX (2 double + 2 single blocks: the stacked layout has a real layer axis) is
loaded by jaxpipe; adapters with random non-zero A and B go both ways: jaxpipe's saved in diffusers'
layout are loaded by ``FluxPipeline.load_lora_weights`` and in peft's by ``PeftModel.from_pretrained``;
peft's (``save_pretrained``; and diffusers' ``save_lora_weights`` with its metadata, or with ``.alpha``
tensors) are loaded by jaxpipe. Every pair of forwards agrees within 1e-4 in float32; a fresh adapter is the
base bit for bit and a merged one its unmerged forward within 1e-5. FLUX.1-dev with rank-64 adapters on the
default targets builds abstractly with peft's exact adapter count.
"""

import copy

import jax
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch", reason="the parity extra is not installed: pip install -e '.[parity]'")
diffusers = pytest.importorskip("diffusers", reason="the parity extra is not installed: pip install -e '.[parity]'")
peft = pytest.importorskip("peft", reason="the parity extra is not installed: pip install -e '.[parity]'")

from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
)
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file

from jaxpipe.nn import flux, lora

TINY = dict(
    in_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=True,
    axes_dims_rope=(4, 6, 6),
)
B, T, H, W = 2, 5, 4, 6
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The torch model (every param random) and jaxpipe's load of it."""
    torch.manual_seed(0)
    model = FluxTransformer2DModel(**TINY).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.1 * torch.randn_like(p)
            p.copy_(1.0 + noise if "norm" in name and p.ndim == 1 and "linear" not in name else noise)
    folder = tmp_path_factory.mktemp("flux_transformer")
    model.save_pretrained(folder)
    return model, flux.load(folder)


@pytest.fixture(scope="module")
def inputs():
    """The diffusers forward's inputs, as torch tensors and as NumPy arrays."""
    rng = np.random.default_rng(0)
    latents = torch.from_numpy(rng.standard_normal((B, TINY["in_channels"] // 4, H, W)).astype(np.float32))
    named = dict(
        hidden_states=FluxPipeline._pack_latents(latents, B, latents.shape[1], H, W),
        encoder_hidden_states=torch.from_numpy(rng.standard_normal((B, T, 32)).astype(np.float32)),
        pooled_projections=torch.from_numpy(rng.standard_normal((B, 32)).astype(np.float32)),
        timestep=torch.tensor([0.3, 0.9]),
        img_ids=FluxPipeline._prepare_latent_image_ids(B, H // 2, W // 2, "cpu", torch.float32),
        txt_ids=torch.zeros(T, 3),
        guidance=torch.tensor([3.5, 1.0]),
    )
    return named, tuple(v.numpy() for v in named.values())


@jax.jit
def run(model, *args):
    return model(*args)


def torch_out(model, named) -> np.ndarray:
    with torch.no_grad():
        return model(**named, return_dict=False)[0].numpy()


def randomised(module, seed: int, scale: float = 0.2):
    """``module`` with every adapter array (A and B) replaced by Gaussian noise: a non-trivial adapter."""
    graphdef, adapters, rest = nnx.split(module, lora.LoRAParam, ...)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return nnx.merge(
        graphdef,
        jax.tree.unflatten(treedef, [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]),
        rest,
    )


def randomise_torch(model, seed: int, scale: float = 0.2) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(scale * torch.randn_like(p))


def bare_pipeline(transformer) -> FluxPipeline:
    """A ``FluxPipeline`` holding only the transformer: what ``load_lora_weights`` loads into."""
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )


def test_jaxpipe_adapters_load_in_diffusers_and_peft(reference, inputs, tmp_path):
    model, ours = reference
    named, args = inputs
    adapted = randomised(lora.apply(ours, lora.LoRAConfig(4, alpha=8)), seed=1)
    out = np.asarray(run(adapted, *args))
    base = torch_out(model, named)
    assert np.max(np.abs(out - base)) > 100 * TOL  # the adapters change the output

    pipe = bare_pipeline(copy.deepcopy(model))
    pipe.load_lora_weights(lora.save_adapters(adapted, tmp_path / "diffusers").parent)
    assert pipe.transformer.transformer_blocks[1].attn.to_q.scaling == {"default_0": 2.0}
    assert np.max(np.abs(torch_out(pipe.transformer, named) - out)) <= TOL

    lora.save_adapters(adapted, tmp_path / "peft", format="peft")
    peft_model = PeftModel.from_pretrained(copy.deepcopy(model), tmp_path / "peft")
    assert np.max(np.abs(torch_out(peft_model, named) - out)) <= TOL


def test_fresh_adapters_are_the_base_and_merge_equals_the_unmerged_forward(reference, inputs):
    model, ours = reference
    _, args = inputs
    fresh = lora.apply(ours, lora.LoRAConfig(4, alpha=8))  # the structure the test above compiled
    base = np.asarray(run(ours, *args))
    np.testing.assert_array_equal(np.asarray(run(fresh, *args)), base)  # B = 0: bit for bit
    trained = randomised(fresh, seed=4)
    merged = lora.merge(trained)
    paths = lambda m: [p for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))]
    assert not lora.has_adapters(merged) and paths(merged) == paths(ours)
    np.testing.assert_allclose(np.asarray(run(merged, *args)), np.asarray(run(trained, *args)), atol=1e-5)


def test_peft_adapters_load_in_jaxpipe(reference, inputs, tmp_path):
    """peft's save_pretrained (rank 2, alpha 3, its own target list) -> jaxpipe."""
    model, ours = reference
    named, args = inputs
    config = LoraConfig(r=2, lora_alpha=3, target_modules=["to_q", "to_k", "to_v", "to_out.0", "proj_mlp"])
    peft_model = get_peft_model(copy.deepcopy(model), config)
    randomise_torch(peft_model, seed=2)
    peft_model.save_pretrained(tmp_path)
    loaded = lora.load_adapters(ours, tmp_path)
    assert "single_transformer_blocks.1.proj_mlp" in lora.adapter_names(loaded)
    assert np.max(np.abs(np.asarray(run(loaded, *args)) - torch_out(peft_model, named))) <= TOL


def test_diffusers_saved_adapters_load_in_jaxpipe(reference, inputs, tmp_path):
    """diffusers' own save (add_adapter + save_lora_weights with the LoraConfig metadata), and the same
    tensors with per-module ``.alpha`` keys instead of metadata: both read as diffusers reads them."""
    model, ours = reference
    named, args = inputs
    transformer = copy.deepcopy(model)
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=2, target_modules=list(flux.LORA_TARGETS)))
    randomise_torch(transformer, seed=3)
    layers = get_peft_model_state_dict(transformer)
    FluxPipeline.save_lora_weights(
        tmp_path / "meta",
        transformer_lora_layers=layers,
        transformer_lora_adapter_metadata=transformer.peft_config["default"].to_dict(),
    )
    expected = torch_out(transformer, named)
    loaded = lora.load_adapters(ours, tmp_path / "meta")
    assert np.max(np.abs(np.asarray(run(loaded, *args)) - expected)) <= TOL

    alphas = {
        f"transformer.{k.removesuffix('.lora_A.weight')}.alpha": torch.tensor(2.0) for k in layers if "lora_A" in k
    }
    save_file(
        {**{f"transformer.{k}": v.contiguous() for k, v in layers.items()}, **alphas},
        str(tmp_path / "alpha.safetensors"),
    )
    pipe = bare_pipeline(copy.deepcopy(model))
    pipe.load_lora_weights(tmp_path / "alpha.safetensors")
    np.testing.assert_allclose(torch_out(pipe.transformer, named), expected, atol=1e-6)  # diffusers: alpha 2 too
    loaded = lora.load_adapters(ours, tmp_path / "alpha.safetensors")
    assert np.max(np.abs(np.asarray(run(loaded, *args)) - expected)) <= TOL


def test_dev_with_rank_64_adapters_builds_abstractly_with_peft_count():
    config = lora.LoRAConfig(64)
    model = nnx.eval_shape(lambda: lora.apply(flux.FluxTransformer(flux.FluxConfig.dev(), rngs=nnx.Rngs(0)), config))
    with torch.device("meta"):
        reference = FluxTransformer2DModel(guidance_embeds=True, axes_dims_rope=(16, 56, 56))
        reference.add_adapter(LoraConfig(r=64, lora_alpha=64, target_modules=list(flux.LORA_TARGETS)))
    count = sum(p.numel() for name, p in reference.named_parameters() if "lora_" in name)
    assert lora.param_count(model) == count == 179_306_496
    assert len(lora.adapter_names(model)) == 19 * 12 + 38 * 3
