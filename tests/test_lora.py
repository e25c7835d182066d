"""LoRA (jaxpipe.nn.lora) as a card-level transform: stacked and unrolled layouts get the same adapters, bad
targets are named errors, files round-trip; FlowGRPO with LoRA trains the adapters alone (C2 at the rollout
weights, base weights bit-identical, an adapter-sized optimiser state, a merged card), and so do NFT, DMD2 and
UnifiedRL.

Forwards (a fresh adapter is the base bit for bit, merge equals the unmerged forward) and interchange with
diffusers' and peft's own files are proven in test_real_lora.py (the parity extra), on a diffusers FLUX.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import brightness_reward, leaves_equal, rl_batch
from flax import nnx

import jaxpipe as jp
from jaxpipe import distributed
from jaxpipe.nn import flux, hf, lora, stacked
from jaxpipe.nn.flux import FluxConfig, FluxTransformer
from jaxpipe.prompts import Prompts
from jaxpipe.training import (
    DMD2,
    DiffusionNFT,
    DiffusionNFTConfig,
    DMD2Config,
    FlowGRPO,
    FlowGRPOConfig,
    Group,
    LoRAConfig,
    Optimizer,
    Sampling,
    SharedMoTRLConfig,
    UnifiedRL,
    UnifiedRLConfig,
)
from jaxpipe.training.parts import Parts

SMALL = dict(num_layers=2, num_single_layers=2)  # a stacked block with a real layer axis


def tiny_flux(scan_layers: bool = True) -> FluxTransformer:
    return FluxTransformer(FluxConfig.tiny(**SMALL, scan_layers=scan_layers), rngs=nnx.Rngs(0))


def randomised(module, seed: int, scale: float = 0.2):
    """``module`` with every adapter array (A and B) Gaussian noise."""
    graphdef, adapters, rest = nnx.split(module, lora.LoRAParam, ...)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return nnx.merge(
        graphdef,
        jax.tree.unflatten(treedef, [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]),
        rest,
    )


class Toy(nnx.Module):
    """An ``nnx.Linear`` then 3 scanned blocks of two: the two layouts a wrapped layer meets."""

    def __init__(self, scan: bool = True):
        rngs = nnx.Rngs(0)
        self.proj = nnx.Linear(8, 16, rngs=rngs)
        self.blocks = stacked.blocks(
            lambda: nnx.Dict(up=nnx.Linear(16, 32, rngs=rngs), down=nnx.Linear(32, 16, rngs=rngs)), 3, scan=scan
        )

    def __call__(self, x):
        return stacked.apply(self.blocks, lambda b, h: h + b["down"](jax.nn.gelu(b["up"](h))), self.proj(x))


@pytest.mark.slow  # ~6 s; test_real_lora checks the same on the diffusers FLUX in the default tier
def test_fresh_adapters_are_the_base_and_merge_equals_the_unmerged_forward():
    """(The same on a diffusers FLUX, against diffusers: test_real_lora.py.)"""
    base, x = Toy(), jax.random.normal(jax.random.key(1), (2, 5, 8))
    fresh = lora.apply(base, LoRAConfig(2, alpha=3.0, target_modules=("proj", "up", "down")))
    assert fresh.blocks.stacked["up"].lora_A.kernel.shape == (3, 16, 2)
    assert fresh.blocks.stacked["up"].lora_B.kernel.shape == (3, 2, 32)
    np.testing.assert_array_equal(fresh(x), base(x))  # B = 0: bit for bit
    trained = randomised(fresh, seed=2)
    assert np.max(np.abs(trained(x) - base(x))) > 1e-2
    merged = lora.merge(trained)
    assert not lora.has_adapters(merged) and lora.has_adapters(trained)  # merge and unload return copies
    paths = lambda m: [p for p, _ in nnx.to_flat_state(nnx.state(m, nnx.Param))]
    assert paths(merged) == paths(base)  # the plain network again
    np.testing.assert_allclose(merged(x), trained(x), atol=1e-5)
    assert leaves_equal(nnx.state(lora.unload(trained), nnx.Param), nnx.state(base, nnx.Param))


def test_stacked_and_unrolled_layouts_get_the_same_adapters():
    config = LoRAConfig(3, target_modules=("to_q", "proj_mlp", "ff.net.2"), seed=7)
    stacked, unrolled = (lora.apply(tiny_flux(scan), config) for scan in (True, False))
    a, b = (hf.torch_state(m, only=lora.LoRAParam) for m in (stacked, unrolled))
    assert sorted(a) == sorted(b) and "single_transformer_blocks.1.proj_mlp.lora_A.weight" in a
    assert a["transformer_blocks.1.attn.to_q.lora_A.weight"].shape == (3, 32)  # peft's (rank, din)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    bound = 1 / np.sqrt(32)  # peft's kaiming-uniform bound 1/sqrt(din); each layer draws its own
    A = a["transformer_blocks.0.attn.to_q.lora_A.weight"]
    assert 0.5 * bound < np.abs(A).max() <= bound
    assert not np.array_equal(A, a["transformer_blocks.1.attn.to_q.lora_A.weight"])
    assert lora.adapter_names(stacked) == lora.adapter_names(unrolled)
    assert lora.param_count(stacked) == 2 * 2 * (
        3 * (32 + 32) + 3 * (128 + 32)
    )  # to_q + (ff.net.2 | proj_mlp), 4 blocks


def test_a_scanned_stack_of_one_layer_gets_stacked_adapters_and_runs():
    """``FluxConfig.tiny()`` (the real-sizes guide's example) scans ONE block of each kind: its adapters
    carry the layer axis like the kernel they wrap, ``(1, din, r)`` beside ``(1, r, dout)``, so the
    scanned forward runs and, with B = 0, equals the base bit for bit."""
    cfg = FluxConfig.tiny(scan_layers=True)
    base = FluxTransformer(cfg, rngs=nnx.Rngs(0))
    fresh = lora.apply(base, LoRAConfig(2, target_modules=("to_q", "proj_mlp")))
    b, length, text = 2, 4, 3
    keys = jax.random.split(jax.random.key(3), 3)
    args = (
        jax.random.normal(keys[0], (b, length, cfg.in_channels)),
        jax.random.normal(keys[1], (b, text, cfg.joint_attention_dim)),
        jax.random.normal(keys[2], (b, cfg.pooled_projection_dim)),
        jnp.full((b,), 0.5),
        np.zeros((length, 3), np.float32),
        np.zeros((text, 3), np.float32),
        jnp.full((b,), 3.5),
    )
    np.testing.assert_array_equal(fresh(*args), base(*args))
    trained = randomised(fresh, seed=4)
    assert np.max(np.abs(trained(*args) - base(*args))) > 1e-3
    shapes = {tuple(x.shape) for x in jax.tree.leaves(nnx.state(fresh, lora.LoRAParam))}
    assert all(len(shape) == 3 and shape[0] == 1 for shape in shapes), shapes


def test_bad_configs_and_targets_are_named_errors():
    for bad, message in (
        ({"rank": 0}, "rank must be an int >= 1"),
        ({"rank": 2, "alpha": -1.0}, "alpha must be"),
        ({"rank": 2, "target_modules": ()}, "non-empty"),
        ({"rank": 2, "target_modules": "("}, "valid regex"),
    ):
        with pytest.raises(ValueError, match=message):
            LoRAConfig(**bad)
    assert LoRAConfig(2, target_modules=["to_q"]).target_modules == ("to_q",) and LoRAConfig(4, alpha=8).scale == 2.0
    base = tiny_flux()
    with pytest.raises(
        ValueError, match=r"\('to_query',\) match no linear layer of FluxTransformer.*include: context_embedder"
    ):
        lora.apply(base, LoRAConfig(2, target_modules=("to_query",)))
    with pytest.raises(ValueError, match="only some layers of the stacked block transformer_blocks.stacked.attn.to_q"):
        lora.apply(base, LoRAConfig(2, target_modules=r"transformer_blocks\.0\.attn\.to_q"))
    regex = lora.apply(tiny_flux(scan_layers=False), LoRAConfig(2, target_modules=r"transformer_blocks\.0\.attn\.to_q"))
    assert lora.adapter_names(regex) == ("transformer_blocks.0.attn.to_q",)  # unrolled: one layer alone
    with pytest.raises(ValueError, match="already has adapters"):
        lora.apply(lora.apply(base, LoRAConfig(2)), LoRAConfig(2))

    class Conv(nnx.Module):
        def __init__(self):
            self.proj = nnx.Conv(2, 3, (3, 3), rngs=nnx.Rngs(0))

    with pytest.raises(ValueError, match=r"proj \(Conv\) has a kernel of shape \(3, 3, 2, 3\).*only linear layers"):
        lora.apply(Conv(), LoRAConfig(2, target_modules=("proj",)))
    with pytest.raises(ValueError, match="declares no LORA_TARGETS"):
        lora.apply(Conv(), LoRAConfig(2))


@pytest.mark.slow  # ~6 s; test_real_lora round-trips both formats through diffusers and peft in the default tier
@pytest.mark.parametrize("format", lora.FORMATS)
def test_adapter_files_round_trip(format, tmp_path):
    base = tiny_flux()
    trained = randomised(
        lora.apply(base, LoRAConfig(4, alpha=2.0, target_modules=("to_q", "to_v", "proj_out"))), seed=2
    )
    file = lora.save_adapters(trained, tmp_path, format=format)
    loaded = lora.load_adapters(base, tmp_path)
    assert leaves_equal(nnx.state(loaded, lora.LoRAParam), nnx.state(trained, lora.LoRAParam))
    assert {w.alpha for _, w in nnx.iter_graph(loaded) if isinstance(w, lora.LoRA)} == {2.0}
    assert "proj_out" in lora.adapter_names(loaded)  # the top-level one too (a name equal to the target)
    if format == "peft":
        config = json.loads((tmp_path / lora.PEFT_CONFIG).read_text())
        assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 2.0, "LORA")
        assert config["target_modules"] == list(lora.adapter_names(trained))
    else:
        assert file.name == lora.DIFFUSERS_FILE
        from safetensors import safe_open
        from safetensors.flax import save_file

        with safe_open(str(file), framework="flax") as f:  # the same adapters stored in bfloat16, a file by itself
            metadata, tensors = f.metadata(), {k: f.get_tensor(k).astype(jnp.bfloat16) for k in f.keys()}
        save_file(tensors, str(tmp_path / "bf16.safetensors"), metadata=metadata)
        half = lora.load_adapters(base, tmp_path / "bf16.safetensors")
        for x, y in zip(
            jax.tree.leaves(nnx.state(half, lora.LoRAParam)), jax.tree.leaves(nnx.state(trained, lora.LoRAParam))
        ):
            assert x.dtype == jnp.float32 and np.allclose(x, y, rtol=1e-2, atol=1e-3)
    with pytest.raises(hf.KeyMappingError, match="unexpected"):
        lora.load_adapters(tiny_flux(scan_layers=True).context_embedder, file)  # no layer of this module is named so
    with pytest.raises(FileNotFoundError):
        lora.load_adapters(base, tmp_path / "missing")
    with pytest.raises(ValueError, match="has no LoRA adapters"):
        lora.save_adapters(base, tmp_path / "none")


def test_a_wrapped_layer_shards_as_before_and_the_dev_model_builds_abstractly():
    adapted = nnx.eval_shape(lambda: lora.apply(FluxTransformer(FluxConfig.dev(), rngs=nnx.Rngs(0)), LoRAConfig(64)))
    assert lora.param_count(adapted) == 179_306_496  # peft's own count: test_real_lora.py
    axes = dict(nnx.to_flat_state(distributed.logical_axes(adapted, flux.LOGICAL_AXES)))
    q = ("transformer_blocks", "stacked", "attn", "to_q")
    assert axes[(*q, lora.BASE_LAYER, "kernel")] == jax.sharding.PartitionSpec(None, "embed", "heads")
    assert axes[(*q, "lora_A", "kernel")] == jax.sharding.PartitionSpec(None, None, None)  # small: replicated


# ------------------------------------------------------------------------------------------ FlowGRPO
# clip_eps 1e-6: the update's clip_frac == 0 says every captured step's ratio is within 1e-6 of 1 (C2)
CONFIG = FlowGRPOConfig(
    group=Group(2),
    sampling=Sampling(num_steps=3, sampler="sde", sde_window=(0, 2)),
    clip_eps=1e-6,
    optimizer=Optimizer(1e-3),
    lora=LoRAConfig(4),
)


def test_parts_train_the_adapters_and_freeze_the_base(t2i_card):
    card = t2i_card.replace(transformer=lora.apply(t2i_card["transformer"], LoRAConfig(2)))
    parts = Parts(card, {"generator": ("transformer",)})
    trained = nnx.to_flat_state(parts.params["generator"])
    assert trained and all(isinstance(var, lora.LoRAParam) for _, var in trained)
    base = nnx.state(parts.frozen["transformer"])
    assert not jax.tree.leaves(nnx.filter_state(base, lora.LoRAParam)) and jax.tree.leaves(base)
    assert {"text_encoder", "vae", "transformer"} <= set(parts.frozen)
    back = parts.components(parts.params, parts.frozen)["transformer"]
    assert leaves_equal(nnx.state(back), nnx.state(card["transformer"]))


@pytest.mark.slow  # ~11 s: one compiled FlowGRPO step; the split it relies on is test_parts_train_the_adapters_and_freeze_the_base
def test_flow_grpo_with_lora_trains_the_adapters_alone(t2i_card):
    """One compiled step: C2 at the rollout weights (the update's ratios), and only adapter leaves move."""
    method = FlowGRPO(t2i_card, brightness_reward, CONFIG)
    state = method.init()
    new, metrics = method.step(state, rl_batch(t2i_card), jax.random.key(0))
    assert float(metrics["clip_frac"]) == 0.0 and abs(float(metrics["ratio_mean"]) - 1.0) < 1e-6  # every ratio is 1
    assert float(metrics["skipped"]) == 0.0 and float(metrics["reward_std"]) > 0.0
    assert not leaves_equal(new.params, state.params)  # the adapters moved
    assert leaves_equal(new.frozen, state.frozen)
    original = nnx.state(t2i_card["transformer"], nnx.Param)
    trained = method.components(new.params, new.frozen)["transformer"]
    assert leaves_equal(nnx.state(lora.unload(trained), nnx.Param), original)  # base weights bit-identical

    adapters = jax.tree.leaves(new.params)
    shapes = sorted(x.shape for x in adapters)
    moments = [x for x in jax.tree.leaves(new.opt_state) if x.ndim]
    assert sorted(x.shape for x in moments) == sorted(shapes + shapes)  # Adam's mu and nu, adapter-shaped only
    full = jax.eval_shape(method.tx.init, original)
    assert sum(x.size for x in moments) * 10 < sum(x.size for x in jax.tree.leaves(full))  # rank 4 of width 96: 1/17

    card = method.card(new)  # merged: the plain DiT, served and saved like the original
    assert not lora.has_adapters(card["transformer"]) and type(card["transformer"]) is type(t2i_card["transformer"])
    assert not leaves_equal(nnx.state(card["transformer"], nnx.Param), original)
    assert leaves_equal(card["text_encoder"], t2i_card["text_encoder"])


def _adapters_only(state) -> bool:
    flat = nnx.to_flat_state(state)
    return bool(flat) and all(isinstance(var, lora.LoRAParam) for _, var in flat)


def test_nft_dmd2_and_unified_rl_train_adapters_only(t2i_card):
    """Built, not stepped (their steps run with adapters in the slow test below): each trained denoiser part,
    and every copy of it (the old policy, the teacher and critic, the KL reference), is adapters only."""
    adapters = LoRAConfig(2)
    unified_card = jp.cards.build("unified", seed=3)
    nft = DiffusionNFT(t2i_card, brightness_reward, DiffusionNFTConfig(group=Group(2), lora=adapters))
    dmd2 = DMD2(t2i_card, DMD2Config(lora=adapters))
    unified = UnifiedRL(unified_card, brightness_reward, UnifiedRLConfig(generator=FlowGRPOConfig(lora=adapters)))
    for method, parts, copies, card in (
        (nft, ("generator",), ("old",), t2i_card),
        (dmd2, ("student", "critic"), ("teacher",), t2i_card),
        (unified, ("generator",), ("generator_reference",), unified_card),
    ):
        state = method.init()
        assert all(_adapters_only(state.params[p]) for p in parts) and all(
            _adapters_only(state.copies[c]) for c in copies
        )
        merged = method.card(state)["transformer"]  # fresh adapters merge to the base exactly
        assert not lora.has_adapters(merged)
        assert leaves_equal(nnx.state(merged, nnx.Param), nnx.state(card["transformer"], nnx.Param))
    assert not jax.tree.leaves(
        nnx.filter_state(unified.init().params["refiner"], lora.LoRAParam)
    )  # the LM trains whole
    with pytest.raises(ValueError, match="prompt-only RL"):
        UnifiedRLConfig(generator=FlowGRPOConfig(lora=adapters), joint=False)
    with pytest.raises(ValueError, match="SharedMoTRL trains its shared MoT weights whole"):
        SharedMoTRLConfig(generator=FlowGRPOConfig(beta=0.04, lora=adapters))
    with pytest.raises(ValueError, match=r"card 'flux-t2i', component 'transformer': LoRA: target_modules \('to_q',\)"):
        FlowGRPO(t2i_card, brightness_reward, dataclasses.replace(CONFIG, lora=LoRAConfig(2, target_modules=("to_q",))))


@pytest.mark.slow  # three more compiled trainer steps (~1 min); each method's LoRA wiring is checked built above
@pytest.mark.parametrize("name", ["nft", "dmd2", "unified"])
def test_one_step_of_each_denoiser_method_with_lora_keeps_the_base(name, t2i_card):
    adapters = LoRAConfig(2)
    if name == "unified":
        card = jp.cards.build("unified", seed=3)
        method = UnifiedRL(
            card,
            brightness_reward,
            UnifiedRLConfig(
                generator=FlowGRPOConfig(
                    group=Group(2), sampling=Sampling(num_steps=2, sampler="sde", sde_window=(0, 1)), lora=adapters
                )
            ),
        )
        batch = Prompts.from_texts(card, ["seven", "one thin"])
    else:
        card, batch = t2i_card, rl_batch(t2i_card)
        method = (
            DiffusionNFT(
                card,
                brightness_reward,
                DiffusionNFTConfig(group=Group(2), sampling=Sampling(num_steps=2), lora=adapters),
            )
            if name == "nft"
            else DMD2(card, DMD2Config(group=Group(2), lora=adapters))
        )
    state = method.init()
    new, metrics = method.step(state, batch, jax.random.key(0))
    assert float(metrics["skipped"]) == 0.0
    assert leaves_equal(new.frozen, state.frozen) and not leaves_equal(new.params, state.params)
    assert not lora.has_adapters(method.card(new)["transformer"])
