"""Programs: validated reads/writes, the fast path, and the split the engine drives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from xla_flags import USERS_EMITTERS

import jaxpipe as jp
from jaxpipe import parity
from jaxpipe import program as P
from jaxpipe.cards import generator, toy_i2v, toy_t2i
from jaxpipe.loops import denoise
from jaxpipe.program import ComponentNode, LoopNode, Program, ProgramError


def _identity(card, reads):
    return {"b": reads["a"]}


def _bind(card, request):
    return P.Bound(slots={"a": np.zeros((1, 2), np.float32)}, settings=())


def test_card_programs_declare_their_nodes():
    prog = toy_t2i.program()
    assert prog is toy_t2i.program()  # built once: it is a static argument of jitted functions
    assert [n.name for n in prog.nodes] == ["encode_text", "encode_null", "t2i_denoise", "decode"]
    assert dict(prog.outputs) == {"image": "image", "latents": "latents"}
    assert [n.name for n in prog.cached_nodes] == ["encode_text", "encode_null"]
    assert [n.loop for n in prog.loops] == ["t2i_denoise"]
    assert [n.name for n in toy_i2v.program().nodes] == [
        "encode_text",
        "encode_null",
        "encode_image",
        "i2v_denoise",
        "decode",
    ]


def test_reading_a_slot_nobody_writes_is_an_error_naming_it():
    with pytest.raises(ProgramError, match=r"node 'decode' reads slot 'latents', which no earlier node writes"):
        Program(
            "broken",
            ("a",),
            (ComponentNode("decode", _identity, reads=("latents",), writes=("b",)),),
            (("b", "b"),),
            _bind,
        )
    with pytest.raises(ProgramError, match=r"writes slot 'a', already a request input"):
        Program("broken", ("a",), (ComponentNode("n", _identity, reads=("a",), writes=("a",)),), (("a", "a"),), _bind)
    with pytest.raises(ProgramError, match="output 'image' reads slot 'image', which nothing writes"):
        Program(
            "broken",
            ("a",),
            (ComponentNode("n", _identity, reads=("a",), writes=("b",)),),
            (("image", "image"),),
            _bind,
        )
    with pytest.raises(ProgramError, match="two nodes are named 'n'"):
        node = ComponentNode("n", _identity, reads=("a",), writes=("b",))
        Program(
            "broken", ("a",), (node, ComponentNode("n", _identity, reads=("b",), writes=("c",))), (("c", "c"),), _bind
        )
    with pytest.raises(ProgramError, match="exactly one slot"):
        LoopNode("loop", generator.start_denoise(), reads=("a",), writes=("x", "y"))


def test_a_program_is_checked_against_its_card(t2i_card):
    toy_t2i.program().check(t2i_card)
    with pytest.raises(ProgramError, match="declares no loop 't2i_denoise'"):
        toy_t2i.program().check(jp.cards.build("wan-i2v"))
    custom = Program(
        "custom",
        ("a",),
        (ComponentNode("n", _identity, reads=("a",), writes=("b",), component="unet"),),
        (("b", "b"),),
        _bind,
    )
    with pytest.raises(ProgramError, match="uses component 'unet'"):
        custom.check(t2i_card)


def test_fused_path_and_the_split_the_engine_drives(t2i_card):
    """The split (enter -> the driver's jitted step -> enter) is the engine's path; the fused path
    (one jitted function, the loop as a scan) agrees with it within the C3 tolerance."""
    prog = toy_t2i.program()
    bound = prog.bind(t2i_card, jp.Request("flux-t2i", prompt="three thin", seed=4, num_steps=3))
    fused = prog.run(t2i_card, bound)
    enter = jax.jit(P.enter, static_argnums=(0, 1, 2))  # each piece jitted, as the engine runs them
    slots, state = enter(prog, 0, bound.settings, t2i_card, P.concat_rows([bound.slots]))
    config = dict(bound.settings)["t2i_denoise"]
    step = jax.jit(lambda card, s: denoise.DRIVER.step(card.bound("t2i_denoise"), s, config))
    for _ in range(3):
        state = step(t2i_card, state)
    slots, done = enter(prog, 1, bound.settings, t2i_card, slots, state)
    assert done is None
    np.testing.assert_allclose(fused["image"], slots["image"], atol=parity.TOLERANCE)
    np.testing.assert_allclose(fused["latents"], state.x, atol=parity.TOLERANCE)
    assert fused["image"].shape == (1, 16, 16, 1)


def test_execute_with_capture_returns_every_loops_trajectory(t2i_card):
    prog = toy_t2i.program()
    bound = prog.bind(t2i_card, jp.Request("flux-t2i", prompt="three thin", seed=4, num_steps=3))
    sde = P.settings(t2i_denoise=denoise.DenoiseConfig(num_steps=3, sampler="sde", sde_window=(0, 2)))
    slots = P.concat_rows([bound.slots])
    # capture changes no bits under the emitters users run (tests/xla_flags.py)
    run = jax.jit(P.execute, static_argnums=(0, 1), static_argnames="capture", compiler_options=USERS_EMITTERS)
    plain = run(prog, sde, t2i_card, slots)
    captured = run(prog, sde, t2i_card, slots, capture=True)
    final, trajectory = captured.captures["t2i_denoise"]
    assert trajectory.log_prob.shape == (2, 1) and final.cond.context.shape[0] == 1
    np.testing.assert_array_equal(captured.artifacts["image"], plain["image"])  # capture changes no bits
    assert set(captured.slots) >= {"ids", "context", "latents", "image"}
    assert run(prog, sde, t2i_card, slots, capture=()).captures["t2i_denoise"][1] is None


def test_generate_is_the_program_on_a_batch(t2i_card):
    prog = toy_t2i.program()
    bounds = [
        prog.bind(t2i_card, jp.Request("flux-t2i", prompt=p, seed=s, num_steps=2)) for p, s in [("one", 0), ("two", 1)]
    ]
    out = jp.generate(t2i_card, ["one", "two"], num_steps=2)
    np.testing.assert_array_equal(prog.run(t2i_card, bounds)["image"], out["image"])
    assert out["text"] == ["one", "two"] and out["latents"].shape == (2, 1, 8, 8, 4)
    with pytest.raises(ValueError, match="equal settings"):
        prog.run(t2i_card, [bounds[0], prog.bind(t2i_card, jp.Request("flux-t2i", prompt="one", num_steps=3))])


def test_binding_validates_the_request(t2i_card):
    with pytest.raises(ValueError, match="needs prompt"):
        toy_t2i.program().bind(t2i_card, jp.Request("flux-t2i"))
    with pytest.raises(ValueError, match="takes no image"):
        toy_t2i.program().bind(t2i_card, jp.Request("flux-t2i", prompt="one", image=jnp.zeros((16, 16, 1))))
    bound = toy_t2i.program().bind(t2i_card, jp.Request("flux-t2i", prompt="one", seed=3, guidance=2.0))
    assert jax.random.key_data(bound.slots["key"]).tolist() == jax.random.key_data(jax.random.key(3))[None].tolist()
    assert bound.artifacts == {"text": "one"}
    assert dict(bound.settings)["t2i_denoise"].guidance == 2.0
    wan = jp.cards.build("wan-i2v")
    with pytest.raises(ValueError, match=r"image must have shape \(16, 16, 1\)"):
        toy_i2v.program().bind(wan, jp.Request("wan-i2v", prompt="one still", image=np.zeros((16, 16, 3))))


def test_request_and_output_types():
    request = jp.Request("flux-t2i", prompt="one", seed=2**32 - 1)
    assert request.replace(seed=1).seed == 1 and request.num_steps is None
    for bad in (dict(seed=-1), dict(seed=2**32), dict(num_steps=0), dict(num_steps=2.5), dict(guidance=-1.0)):
        with pytest.raises(ValueError):
            jp.Request("flux-t2i", **bad)
    with pytest.raises(ValueError, match="model id"):
        jp.Request("")
    out = jp.Output("flux-t2i", {"image": jnp.zeros((2, 2, 1))}, request)
    assert list(out) == ["image"] and out.model == "flux-t2i" and not out.cancelled
    with pytest.raises(TypeError):
        out["image"] = 1  # read-only
