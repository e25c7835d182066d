"""Weight sync: per-component versions, feature-cache entries kept, drain-then-swap during runs; every
training method is a ``Trainer`` whose card and roles ``weight_sync.sync`` publishes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import brightness_reward, leaves_equal, perturbed, rl_batch

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe.digits import cards as digit_cards
from jaxpipe.engine import Engine, EngineError, UnknownComponentError
from jaxpipe.loops import chunk
from jaxpipe.nn import DiTConfig
from jaxpipe.training import (
    DMD2,
    DiffusionNFT,
    DistributionMatching,
    DMD2Config,
    Finetune,
    FinetuneConfig,
    FlowGRPO,
    Group,
    JointMultiExpertRL,
    Optimizer,
    SelfForcing,
    SharedMoTRL,
    Trainer,
    TrainState,
    UnifiedRL,
    weight_sync,
)
from jaxpipe.workflow import Stage, Workflow

OLD = {"text_encoder": 0, "transformer": 0, "vae": 0}
NEW = {"text_encoder": 0, "transformer": 1, "vae": 0}


def twice(state):
    return jp.Request("flux-t2i", prompt=state["prompt"], seed=state["seed"], num_steps=2)


def again(state):
    return jp.Request("flux-t2i", prompt=state["prompt"], seed=state["seed"] + 1, num_steps=2)


# Stage "b" is a flux-t2i request that is spawned only when stage "a" finishes: a request
# that starts mid-run, after the publish.
TWICE = Workflow("test.twice", (Stage("a", "flux-t2i", twice), Stage("b", "flux-t2i", again)))


def make_engine(card):
    engine = Engine(max_batch=4)
    engine.register(card)
    engine.register_workflow(TWICE)
    return engine


@pytest.fixture(scope="module")
def new_transformer(t2i_card):
    return perturbed(t2i_card["transformer"], seed=7)


@pytest.fixture(scope="module")
def new_card(t2i_card, new_transformer):
    return t2i_card.replace(transformer=new_transformer)


def t2i(seed, steps=2):
    return jp.Request("flux-t2i", prompt="seven thick", seed=seed, num_steps=steps)


def assert_same(a, b, names, tolerance=0.0):
    for name in names:
        diff = float(jnp.abs(jnp.asarray(a[name]) - jnp.asarray(b[name])).max())
        assert diff <= tolerance, (name, diff)


def test_a_new_transformer_keeps_the_text_encoder_version_and_its_cache_entries(t2i_card, new_card, new_transformer):
    engine = make_engine(t2i_card)
    before = engine.run_many([t2i(0), t2i(1)])
    keys = engine.cache.keys()
    assert {(k.component, k.version) for k in keys} == {("text_encoder", 0)}
    assert engine.cache.stats().misses == 2  # the prompt and the empty (CFG) prompt

    assert engine.publish("flux-t2i", {"transformer": new_transformer}) == NEW
    assert engine.versions("flux-t2i") == NEW
    assert engine.cache.keys() == keys  # the text encoder's entries survive the swap
    served = engine.card("flux-t2i")
    assert served["text_encoder"] is t2i_card["text_encoder"] and served["vae"] is t2i_card["vae"]
    assert leaves_equal(served["transformer"], new_transformer)

    stats = engine.cache.stats()
    after = engine.run_many([t2i(0), t2i(1)])
    assert engine.cache.stats().misses == stats.misses and engine.cache.stats().hits == stats.hits + 4
    assert float(jnp.abs(after[0]["image"] - before[0]["image"]).max()) > 1e-3
    fresh = make_engine(new_card).run_many([t2i(0), t2i(1)])
    assert parity.compare(after, fresh).passed  # bit for bit: a swapped engine is a fresh one


@pytest.mark.parametrize("mode", ["serial", "interleaved", "batched"])
def test_publish_during_a_run_drains_then_swaps(t2i_card, new_card, new_transformer, mode):
    # 0 and 1 are on the card when the publish comes (after the first step of 0); so is stage "a"
    # of the workflow request 2, but its stage "b" starts only after "a" finishes, while 1 (three
    # steps) is still running: it must wait for 1, then run on the new weights.
    requests = [t2i(0), t2i(1, steps=3), jp.Request("test.twice", prompt="seven thick", seed=2)]
    engine = make_engine(t2i_card)
    events, seen = [], {}

    def on_step(event):
        events.append((event.tick, event.index, event.stage, event.step))
        if event.index == 0 and event.step == 1:
            seen["returned"] = engine.publish("flux-t2i", {"transformer": new_transformer})
            seen["versions"] = engine.versions("flux-t2i")
            seen["pending"] = engine.pending_publishes()
            seen["card"] = engine.card("flux-t2i")

    outs = engine.run_many(requests, mode, on_step=on_step)
    # deferred: nothing swapped inside the run until the card drained; the promised versions came true
    assert seen["returned"] == NEW and seen["versions"] == OLD and seen["pending"] == {"flux-t2i": NEW}
    assert seen["card"]["transformer"] is t2i_card["transformer"]
    assert engine.versions("flux-t2i") == NEW and engine.pending_publishes() == {}
    assert engine.cache.stats().misses == 2  # the text encoder never re-encoded after the swap

    noop = lambda event: None
    old = make_engine(t2i_card).run_many(requests, mode, on_step=noop)
    new = make_engine(new_card).run_many(requests, mode, on_step=noop)
    tolerance = parity.TOLERANCE if mode == "batched" else 0.0
    if mode == "serial":  # one request at a time: only request 0 was in flight
        assert_same(outs[0], old[0], ["image", "latents"])
        assert_same(outs[1], new[1], ["image", "latents"])
        assert_same(outs[2], new[2], ["a:image", "b:image", "image"])
    else:
        # in flight: bit for bit the run without a publish. Batched rounding depends on the batch
        # a row shares (C3), and without the publish stage "b" would have joined request 1's
        # batch, so the bit-for-bit reference runs the same in-flight work without stage "b".
        inflight = make_engine(t2i_card).run_many([t2i(0), t2i(1, steps=3), t2i(2)], mode, on_step=noop)
        assert_same(outs[0], inflight[0], ["image", "latents"])
        assert_same(outs[1], inflight[1], ["image", "latents"])
        assert_same({"image": outs[2]["a:image"], "latents": outs[2]["a:latents"]}, inflight[2], ["image", "latents"])
        assert_same(outs[1], old[1], ["image", "latents"], tolerance)
        # started after the swap: the new weights
        assert_same(outs[2], new[2], ["b:image", "b:latents", "image"], tolerance)
        assert float(jnp.abs(outs[2]["b:image"] - old[2]["b:image"]).max()) > 1e-3
        # stage "b" waited for request 1 to finish
        last_of_1 = max(t for t, i, _, _ in events if i == 1)
        first_of_b = min(t for t, i, stage, _ in events if i == 2 and stage == "b")
        assert first_of_b > last_of_1
    # every request still took its own steps, in order
    assert [s for _, i, _, s in events if i == 1] == [1, 2, 3]


def test_other_cards_keep_running_while_one_drains(t2i_card, i2v_card, new_transformer):
    engine = make_engine(t2i_card)
    engine.register(i2v_card)
    video = jp.Request("wan-i2v", prompt="seven moving right", seed=3, num_steps=4, image=jnp.zeros((16, 16, 1)))
    requests = [t2i(0), t2i(1, steps=3), jp.Request("test.twice", prompt="seven thick", seed=2), video]
    ticks = {}

    def on_step(event):
        ticks.setdefault((event.index, event.stage), []).append(event.tick)
        if event.index == 0 and event.step == 1:
            engine.publish("flux-t2i", {"transformer": new_transformer})

    outs = engine.run_many(requests, "interleaved", on_step=on_step)
    assert ticks[(3, "")] == [1, 2, 3, 4]  # wan-i2v stepped every tick, never waiting for the swap
    assert engine.versions("wan-i2v") == OLD
    reference = Engine()
    reference.register(i2v_card)
    assert_same(outs[3], reference.run(video), ["video", "latents"])


def test_bad_publish_raises_and_changes_nothing(t2i_card, new_transformer):
    engine = make_engine(t2i_card)
    engine.run(t2i(0))
    before = engine.versions("flux-t2i"), engine.card("flux-t2i").components, engine.cache.keys()
    leaves, treedef = jax.tree.flatten(new_transformer)
    wrong_shape = jax.tree.unflatten(treedef, [leaves[0][..., :-1], *leaves[1:]])
    wrong_dtype = jax.tree.unflatten(treedef, [leaves[0].astype(jnp.float16), *leaves[1:]])

    def attempts():
        with pytest.raises(UnknownComponentError, match=r"has no component\(s\) \['unet'\]; it has \['text_encoder'"):
            engine.publish("flux-t2i", {"unet": new_transformer})
        with pytest.raises(KeyError):  # also a KeyError, as Card.replace raises
            engine.publish("flux-t2i", {"unet": new_transformer, "transformer": new_transformer})
        with pytest.raises(EngineError, match=r"component 'transformer': leaf .* has shape"):
            engine.publish("flux-t2i", {"transformer": wrong_shape})
        with pytest.raises(EngineError, match="dtype float16"):
            engine.publish("flux-t2i", {"transformer": wrong_dtype})
        with pytest.raises(EngineError, match="expected a DiT"):
            engine.publish("flux-t2i", {"transformer": t2i_card["text_encoder"]})
        with pytest.raises(EngineError, match="unknown model 'nope'"):
            engine.publish("nope", {"transformer": new_transformer})
        with pytest.raises(TypeError, match="mapping"):
            engine.publish("flux-t2i", new_transformer)

    attempts()
    assert (engine.versions("flux-t2i"), engine.card("flux-t2i").components, engine.cache.keys()) == before

    # during a run: the same errors, nothing deferred, and the run's bits are untouched
    reference = engine.run_many([t2i(0), t2i(1)], "interleaved")
    checked = []

    def on_step(event):
        if event.step == 1 and event.index == 0:
            attempts()
            checked.append(engine.pending_publishes())

    outs = engine.run_many([t2i(0), t2i(1)], "interleaved", on_step=on_step)
    assert checked == [{}]
    assert parity.compare(outs, reference).passed
    assert (engine.versions("flux-t2i"), engine.card("flux-t2i").components) == before[:2]


def test_weight_sync_publishes_what_changed(t2i_card, new_card, new_transformer):
    engine = make_engine(t2i_card)
    assert weight_sync.changed_components(engine, t2i_card) == ()
    assert weight_sync.publish(engine, t2i_card) == OLD  # nothing differs: nothing moves
    assert weight_sync.changed_components(engine, new_card) == ("transformer",)
    assert weight_sync.publish(engine, new_card) == NEW
    assert weight_sync.publish(engine, new_card) == NEW  # already served: no second bump
    # named components are published even when equal
    assert weight_sync.publish(engine, new_card, "vae") == {**NEW, "vae": 1}
    with pytest.raises(UnknownComponentError, match="unet"):
        weight_sync.publish(engine, new_card, ("unet",))
    with pytest.raises(TypeError, match="trained Card"):
        weight_sync.publish(engine, {"transformer": new_transformer})
    assert engine.versions("flux-t2i") == {**NEW, "vae": 1}


def test_weight_sync_from_a_trainer_during_a_run(t2i_card):
    method = Finetune(t2i_card, FinetuneConfig(trainable=("transformer",)))
    assert isinstance(method, Trainer) and method.roles == {}
    state = method.init(jax.random.key(0))
    # stands in for training steps (no gradient compile in this test): only trainable params move
    state = state._replace(params=jax.tree.map(lambda p: p * 1.01, state.params))
    trained = method.card(state)
    assert weight_sync.changed_components(make_engine(t2i_card), trained) == ("transformer",)

    engine = make_engine(t2i_card)
    versions = []

    def on_step(event):  # a trainer publishing from inside a serving loop
        if event.index == 0 and event.step == 1:
            assert engine.pending_publishes() == {}
            versions.append(weight_sync.publish(engine, trained))
            assert weight_sync.changed_components(engine, trained) == ()  # the pending swap counts

    outs = engine.run_many([t2i(0), t2i(1)], "serial", on_step=on_step)
    assert versions == [NEW] and engine.versions("flux-t2i") == NEW
    assert leaves_equal(engine.card("flux-t2i")["transformer"], trained["transformer"])
    assert_same(outs[0], make_engine(t2i_card).run(t2i(0)), ["image"])
    assert_same(outs[1], make_engine(trained).run(t2i(1)), ["image"])
    np.testing.assert_array_equal(engine.run(t2i(1))["image"], outs[1]["image"])


@pytest.mark.parametrize("how", ["cancel", "raise"])
def test_a_deferred_publish_applies_when_the_run_ends_early(t2i_card, new_card, new_transformer, how):
    engine = make_engine(t2i_card)
    stop = []

    def on_step(event):
        if event.index == 0 and event.step == 1:
            engine.publish("flux-t2i", {"transformer": new_transformer})
            if how == "raise":
                raise RuntimeError("user callback failed")
            stop.append(True)

    if how == "raise":
        with pytest.raises(RuntimeError, match="user callback failed"):
            engine.run_many([t2i(0), t2i(1)], "interleaved", on_step=on_step)
    else:
        outs = engine.run_many([t2i(0), t2i(1)], "interleaved", on_step=on_step, cancel=lambda: bool(stop))
        assert all(o.cancelled for o in outs)
    assert engine.versions("flux-t2i") == NEW and engine.pending_publishes() == {}
    assert_same(engine.run(t2i(0)), make_engine(new_card).run(t2i(0)), ["image"])


def test_a_role_tracks_its_scope_with_its_own_versions_and_follows_the_card_outside_it(
    t2i_card, new_card, new_transformer
):
    engine = make_engine(t2i_card)
    assert engine.add_role("flux-t2i", "old", "transformer") == "flux-t2i@old"
    assert engine.roles("flux-t2i") == {"old": ("transformer",)} and engine.versions("flux-t2i@old") == OLD
    # the role's scoped transformer moves alone; the card serves its own weights
    assert weight_sync.publish(engine, new_card, role="old") == NEW
    assert engine.versions("flux-t2i") == OLD
    card, role = engine.run_many([t2i(0), jp.Request("flux-t2i@old", prompt="seven thick", seed=0, num_steps=2)])
    fresh = make_engine(new_card).run(t2i(0))
    assert parity.compare([role], [fresh]).passed and not parity.compare([card], [fresh]).passed
    # nothing changed inside the scope: nothing published, no version moves
    assert weight_sync.publish(engine, new_card, role="old") == NEW
    with pytest.raises(EngineError, match="outside role 'flux-t2i@old'"):
        engine.publish("flux-t2i@old", {"text_encoder": t2i_card["text_encoder"]})
    # a publish to the card reaches the role outside its scope only, with the card's version
    text = perturbed(t2i_card["text_encoder"], seed=3)
    engine.publish("flux-t2i", {"text_encoder": text, "transformer": new_transformer})
    assert engine.versions("flux-t2i") == {"text_encoder": 1, "transformer": 1, "vae": 0}
    assert engine.versions("flux-t2i@old") == {"text_encoder": 1, "transformer": 1, "vae": 0}
    assert leaves_equal(engine.card("flux-t2i@old")["text_encoder"], text)
    with pytest.raises(EngineError, match="no role 'ema'"):
        weight_sync.publish(engine, new_card, role="ema")
    with pytest.raises(EngineError, match="already served"):
        engine.add_role("flux-t2i", "old", "transformer")
    with pytest.raises(UnknownComponentError, match="unet"):
        engine.add_role("flux-t2i", "ema", "unet")
    with pytest.raises(EngineError, match="itself a role"):
        engine.add_role("flux-t2i@old", "ema", "transformer")
    engine.unregister("test.twice")
    engine.unregister("flux-t2i")
    assert not engine.serves("flux-t2i@old")


# ---- every training method: the Trainer protocol, and sync of its card and roles -------------------


def seven_methods(t2i_card):
    """Each RL / distillation method on the smallest card its own tests train (built, not stepped: no
    compile), with the cards an engine serves beside its trained card (a distillation's teacher)."""
    unified = jp.cards.build("unified", seed=3)
    mot = digit_cards.config("bagel-mot")
    mot = jp.cards.build(
        "bagel-mot", config=dataclasses.replace(mot, mot=dataclasses.replace(mot.mot, depth=1)), seed=1
    )
    dit = DiTConfig(dim=32, depth=1, heads=2)
    teacher = jp.cards.build("wan-t2v", seed=5, config=digit_cards.config("wan-t2v", dit=dit, frames=4))
    causal = jp.cards.build(
        "wan-causal",
        seed=3,
        config=digit_cards.config("wan-causal", dit=dit, frames=4, sampling=chunk.ChunkConfig(chunks=2)),
    )
    dmd2 = DMD2Config(
        student_steps=1,
        group=Group(1),
        student=Optimizer(1e-3, b1=0.0),
        dm=DistributionMatching(critic=Optimizer(1e-3, b1=0.0), critic_steps=1),
    )
    return [
        (FlowGRPO(t2i_card, brightness_reward), ()),
        (UnifiedRL(unified, brightness_reward), ()),
        (JointMultiExpertRL(digit_cards.multi_expert(unified, 2), brightness_reward), ()),
        (SharedMoTRL(mot, brightness_reward), ()),
        (DiffusionNFT(t2i_card, brightness_reward), ()),
        (DMD2(t2i_card, dmd2), (t2i_card,)),
        (SelfForcing(causal, teacher), (teacher,)),
    ]


@pytest.mark.slow  # ~14 s (a step of every method); by default: a trainer's sync during a run and a role's own versions (above)
def test_every_method_is_a_trainer_and_sync_publishes_its_card_and_roles(t2i_card):
    """init / step / card / roles / role_card on all seven methods; ``weight_sync.track`` serves each role as
    a role of the card its ``role_card`` is (the trained card; the teacher for a critic), and ``sync`` of a
    fresh state publishes nothing. After a real DMD2 step, the student's and the critic's transformers each
    get a new version (in the student card and in the teacher's ``critic`` role); the rest keep theirs."""
    methods = seven_methods(t2i_card)
    assert [type(m).__name__ for m, _ in methods] == [
        "FlowGRPO",
        "UnifiedRL",
        "JointMultiExpertRL",
        "SharedMoTRL",
        "DiffusionNFT",
        "DMD2",
        "SelfForcing",
    ]
    for method, beside in methods:
        name = type(method).__name__
        assert isinstance(method, Trainer), name
        assert all(callable(getattr(method, f)) for f in ("init", "step", "card", "role_card", "check_batch")), name
        state = method.init(jax.random.key(0))
        assert isinstance(state, TrainState) and set(state.opt_state) == set(state.params), name
        card = method.card(state)
        assert isinstance(card, jp.Card), name
        engine = Engine()
        for served in (*beside, card):
            engine.register(served)
        roles = weight_sync.track(engine, method)
        assert set(roles) == set(method.roles), name
        for role, components in method.roles.items():
            role_card = method.role_card(state, role)
            assert roles[role] == f"{role_card.model_id}@{role}" and set(components) <= set(role_card.components), name
            assert engine.roles(role_card.model_id)[role] == tuple(components), name
        with pytest.raises(KeyError):
            method.role_card(state, "no-such-role")
        versions = weight_sync.sync(engine, method, state)
        assert set(versions) == {card.model_id, *roles.values()}, (name, versions)
        assert all(v == 0 for served in versions.values() for v in served.values()), (name, versions)
        assert weight_sync.track(engine, method) == roles, name  # already served: kept

    assert roles == {"critic": "wan-t2v@critic"}  # SelfForcing's critic: a role of its teacher
    dmd2, _ = methods[5]
    assert dmd2.roles == {"critic": ("transformer",)}
    engine = Engine()
    engine.register(t2i_card)
    state = dmd2.init(jax.random.key(0))
    engine.register(dmd2.card(state))
    assert weight_sync.track(engine, dmd2, state) == {"critic": "flux-t2i@critic"}
    state, metrics = dmd2.step(state, rl_batch(t2i_card), jax.random.key(1))
    assert float(metrics["skipped"]) == 0.0
    moved = {"text_encoder": 0, "transformer": 1, "vae": 0}
    assert weight_sync.sync(engine, dmd2, state) == {"flux-t2i-turbo": moved, "flux-t2i@critic": moved}
    assert engine.versions("flux-t2i") == {"text_encoder": 0, "transformer": 0, "vae": 0}  # the teacher itself
    assert leaves_equal(engine.card("flux-t2i-turbo")["transformer"], dmd2.card(state)["transformer"])
    assert leaves_equal(engine.card("flux-t2i@critic")["transformer"], dmd2.role_card(state, "critic")["transformer"])
    assert not leaves_equal(engine.card("flux-t2i@critic")["transformer"], engine.card("flux-t2i")["transformer"])
    assert weight_sync.sync(engine, dmd2, state) == {
        "flux-t2i-turbo": moved,
        "flux-t2i@critic": moved,
    }  # no second bump
