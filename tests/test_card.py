"""Cards are pytrees with validated static specs."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

import jaxpipe as jp
from jaxpipe.card import Card, CardSpec, CardValidationError, LoopSpec
from jaxpipe.digits import cards as digit_cards
from jaxpipe.loops import ar, policies
from jaxpipe.loops.denoise import DenoiseConfig
from jaxpipe.nn import hf
from jaxpipe.nn.stacked import Stacked

SHAPE = (1, 2, 2, 1)


def denoise_loop(loop_id="denoise", binds=("transformer",), **config):
    return LoopSpec(loop_id, "denoise", binds, DenoiseConfig(**config), latent_shape=SHAPE)


def small_components():
    rngs = nnx.Rngs(0)
    return {"encoder": nnx.Linear(3, 4, rngs=rngs), "transformer": nnx.Linear(4, 4, rngs=rngs)}


def spec(**kw):
    base = dict(
        model_id="toy",
        family="toy",
        loops=(denoise_loop(),),
        recipe=("denoise",),
    )
    return CardSpec(**{**base, **kw})


def test_card_is_a_pytree_of_its_components():
    card = Card(small_components(), spec())
    leaves = jax.tree.leaves(card)
    assert len(leaves) == 4  # two kernels, two biases
    doubled = jax.tree.map(lambda p: 2 * p, card)
    assert isinstance(doubled, Card) and doubled.spec == card.spec
    np.testing.assert_allclose(doubled["encoder"].kernel[...], 2 * card["encoder"].kernel[...])
    assert card.num_params() == 3 * 4 + 4 + 4 * 4 + 4


def test_jit_over_a_card_retraces_only_when_metadata_changes():
    traces = []

    @jax.jit
    def f(card, x):
        traces.append(card.model_id)
        return card["transformer"](card["encoder"](x))

    card = Card(small_components(), spec())
    x = jnp.ones((2, 3))
    y = f(card, x)
    assert y.shape == (2, 4)
    f(jax.tree.map(lambda p: p + 1, card), x)  # new weights, same metadata
    assert len(traces) == 1
    f(Card(small_components(), spec(model_id="toy2")), x)
    assert len(traces) == 2


def test_grad_through_a_card():
    card = Card(small_components(), spec())
    graphdef, params = nnx.split(card.components, nnx.Param)

    def loss(p):
        comps = nnx.merge(graphdef, p)
        return jnp.sum(comps["transformer"](comps["encoder"](jnp.ones((1, 3)))) ** 2)

    grads = jax.grad(loss)(params)
    assert all(bool(jnp.any(g != 0)) for g in jax.tree.leaves(grads))


def test_loop_binding_a_missing_component_is_rejected():
    bad = spec(loops=(denoise_loop(binds=("dit",)),))
    with pytest.raises(CardValidationError, match=r"binds missing component\(s\) \['dit'\]"):
        Card(small_components(), bad)


def test_recipe_with_undeclared_loop_is_rejected():
    with pytest.raises(CardValidationError, match="recipe uses undeclared loop"):
        Card(small_components(), spec(recipe=("denoise", "decode_tiles")))


def test_colliding_ids_are_rejected():
    loop = denoise_loop()
    with pytest.raises(CardValidationError, match="duplicate loop ids"):
        Card(small_components(), spec(loops=(loop, loop)))
    with pytest.raises(CardValidationError, match="name both a loop and a component"):
        Card(small_components(), spec(loops=(denoise_loop("encoder"),), recipe=()))


def test_bad_loop_kind_and_parity_are_rejected():
    with pytest.raises(CardValidationError, match="kind must be one of"):
        LoopSpec("x", "teleport", ("transformer",))
    with pytest.raises(CardValidationError, match="parity"):
        Card(small_components(), spec(parity=("C9",)))


def test_each_loop_kind_checks_its_own_spec():
    """The loop kind's driver validates a LoopSpec when it is made: config type, latent shape, binds."""
    with pytest.raises(CardValidationError, match="needs latent_shape"):
        LoopSpec("d", "denoise", ("transformer",), DenoiseConfig())
    with pytest.raises(CardValidationError, match="must be a DenoiseConfig"):
        LoopSpec("d", "denoise", ("transformer",), ar.ARConfig(), latent_shape=SHAPE)
    with pytest.raises(CardValidationError, match=r"router chooses among 2 denoiser\(s\) but it binds 1"):
        denoise_loop(router=policies.SigmaBoundary(0.5))
    with pytest.raises(CardValidationError, match="latent_shape must be positive"):
        LoopSpec("d", "denoise", ("transformer",), DenoiseConfig(), latent_shape=(0, 2))
    with pytest.raises(CardValidationError, match="drives one decoder"):
        LoopSpec("r", "ar_decode", ("a", "b"), ar.ARConfig())
    routed = denoise_loop(binds=("transformer", "encoder"), router=policies.SigmaBoundary(0.5))
    card = Card(small_components(), spec(loops=(routed,)))
    first, second = card.bound("denoise")  # the loop's models, in binds order
    assert first is card["transformer"] and second is card["encoder"]


def test_unknown_component_lookup_lists_what_exists():
    card = Card(small_components(), spec())
    with pytest.raises(KeyError, match="encoder"):
        card["vae"]


def test_flux_card_builds_and_lists():
    assert "flux-t2i" in jp.cards.buildable()
    card = jp.cards.build("flux-t2i", seed=0)
    assert set(card.components) == {"text_encoder", "transformer", "vae"}
    assert card.spec.loop("t2i_denoise").binds == ("transformer",)
    assert card.num_params() > 10_000
    with pytest.raises(KeyError, match="buildable cards"):
        jp.cards.build("flux-t3i")


def test_same_seed_same_weights():
    a, b = jp.cards.build("flux-t2i", seed=3), jp.cards.build("flux-t2i", seed=3)
    c = jp.cards.build("flux-t2i", seed=4)
    assert all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    assert not all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path, t2i_card):
    from jaxpipe.cards import load_card, save_card

    save_card(t2i_card, tmp_path / "card")
    loaded = jp.cards.load(tmp_path / "card")
    assert loaded.spec == t2i_card.spec
    for a, b in zip(jax.tree.leaves(t2i_card), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        jp.generate(t2i_card, "seven thick", num_steps=3)["image"],
        jp.generate(loaded, "seven thick", num_steps=3)["image"],
    )
    with pytest.raises(FileNotFoundError, match="not a card checkpoint"):
        load_card(tmp_path)
    with pytest.raises(KeyError, match="not a bundled card"):
        jp.cards.load("no-such-card")


def _scan_twin(scan_layers: bool) -> Card:
    """A ``flux-t2i`` card whose DiT is stored stacked or not: the same noised parameters either way (drawn by
    per-layer key), so the two compute the same images."""
    config = digit_cards.config("flux-t2i")
    dit = dataclasses.replace(config.dit, scan_layers=scan_layers)
    card = jp.cards.build("flux-t2i", seed=0, config=dataclasses.replace(config, dit=dit))
    tensors = hf.torch_state(card["transformer"])
    rng = np.random.default_rng(1)
    hf.load_into(
        card["transformer"], {k: tensors[k] + 0.05 * rng.standard_normal(tensors[k].shape) for k in sorted(tensors)}
    )
    return card


@pytest.mark.slow  # ~10 s: a scanned card's save / load / generate; the stacking itself is in test_scan_layers
def test_a_scanned_dit_card_round_trips_with_stacked_keys_and_draws_what_its_unrolled_twin_does(tmp_path):
    from jaxpipe.cards import load_card, save_card

    scanned, unrolled = _scan_twin(True), _scan_twin(False)
    folder = save_card(scanned, tmp_path / "card")
    assert json.loads((folder / "config.json").read_text())["config"]["dit"]["scan_layers"] is True
    with safe_open(str(folder / "weights.safetensors"), "np") as f:
        blocks = {k for k in f.keys() if k.startswith("transformer/blocks/")}
    assert blocks and all(k.startswith("transformer/blocks/stacked/") for k in blocks)  # one stacked array per param
    loaded = load_card(folder)
    assert loaded.spec == scanned.spec and isinstance(loaded["transformer"].blocks, Stacked)
    for a, b in zip(jax.tree.leaves(scanned), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(
        jp.generate(loaded, "seven thick", num_steps=3)["image"],
        jp.generate(unrolled, "seven thick", num_steps=3)["image"],
        atol=1e-5,
    )
