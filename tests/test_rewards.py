"""jaxpipe.rewards: JAX and host rewards inside jit, combine, score and load."""

import conftest
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpipe import prompts as jpp
from jaxpipe import rewards
from jaxpipe.prompts import Prompts

B = 4  # two prompts, two samples each


def batch():
    """Artifacts of B = 4 rendered rows and their prompts (repeated to 4 rows), tiny shapes."""
    prompts = Prompts(
        np.zeros((2, 3), np.int32),
        jpp.encode_text(["seven thick", "café 七"], 64),
        {"digit": np.array([7, 1], np.int32), "box": np.array([[0.0, 1.0], [2.0, 3.0]], np.float32)},
    )
    images = jax.random.uniform(jax.random.key(0), (B, 2, 2, 3))
    return {"image": images}, prompts.repeat(2)


def brightness(artifacts, prompts):
    return jnp.mean(artifacts["image"], axis=(1, 2, 3))


def host_brightness(artifacts, prompts):
    return artifacts["image"].mean(axis=(1, 2, 3))


def test_jax_and_host_rewards_agree_inside_jit():
    artifacts, prompts = batch()
    host = rewards.host(host_brightness)
    both = jax.jit(lambda a, p: (rewards.score(brightness, a, p)[0], rewards.score(host, a, p)[0]))(artifacts, prompts)
    assert both[1].dtype == jnp.float32 and both[1].shape == (B,)
    np.testing.assert_allclose(both[1], both[0], rtol=0, atol=1e-6)
    assert host.__name__ == "host_brightness" and "host_brightness" in repr(host)


def test_a_host_reward_sees_numpy_artifacts_and_the_exact_prompts():
    artifacts, prompts = batch()
    seen = []

    @rewards.host
    def record(artifacts, prompts):
        seen.append((type(artifacts["image"]), artifacts["image"].shape, list(prompts), prompts.metadata))
        return np.arange(len(prompts))

    out = jax.jit(record)(artifacts, prompts)
    np.testing.assert_array_equal(out, [0, 1, 2, 3])
    kind, shape, texts, metadata = seen[0]
    assert kind is np.ndarray and shape == (B, 2, 2, 3)
    assert texts == ["seven thick", "seven thick", "café 七", "café 七"]
    np.testing.assert_array_equal(metadata["digit"], [7, 7, 1, 1])
    np.testing.assert_array_equal(metadata["box"], [[0, 1], [0, 1], [2, 3], [2, 3]])


@pytest.mark.parametrize("method, calls", [("broadcast_all", 1), ("sequential", 3)])
def test_host_reward_under_vmap(method, calls):
    """broadcast_all: one host call with every mapped row; sequential: one call per mapped element."""
    artifacts, prompts = batch()
    stacked = jax.random.uniform(jax.random.key(1), (3, B, 2, 2, 3))
    rows = []

    @rewards.host(vmap_method=method)
    def counted(artifacts, prompts):
        rows.append(len(prompts))
        return host_brightness(artifacts, prompts)

    out = jax.jit(jax.vmap(lambda i, p: counted({"image": i}, p), in_axes=(0, None)))(stacked, prompts)
    expected = jax.vmap(lambda i: brightness({"image": i}, prompts))(stacked)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    assert rows == [3 * B // calls] * calls


def test_a_host_reward_of_the_wrong_shape_names_the_function():
    artifacts, prompts = batch()

    @rewards.host
    def short_reward(artifacts, prompts):
        return np.zeros(3)

    # the ValueError is raised on the host, inside the callback; JAX re-raises it as a JaxRuntimeError
    with pytest.raises(Exception, match=r"host reward .*short_reward returned shape \(3,\); .* shape \(4,\)"):
        jax.block_until_ready(jax.jit(short_reward)(artifacts, prompts))
    parts = rewards.host(lambda a, p: {"x": np.zeros(4)})
    with pytest.raises(Exception, match="returned parts"):
        jax.block_until_ready(parts(artifacts, prompts))
    with pytest.raises(ValueError, match="one row per prompt row"):
        rewards.host(host_brightness)({"image": jnp.zeros((3, 2))}, prompts)


def test_score_sums_parts_in_the_rewards_order():
    artifacts, prompts = batch()

    def parted(artifacts, prompts):
        mean = brightness(artifacts, prompts)
        return {"mean": mean, "digit": prompts.metadata["digit"].astype(jnp.float32) / 10, "third": mean**2}

    total, parts = rewards.score(parted, artifacts, prompts)
    assert list(parts) == ["mean", "digit", "third"]
    assert np.array_equal(total, parts["mean"] + parts["digit"] + parts["third"])
    # inside jit too: the total is the trainers' sum(parts.values()) in the reward's order, bit for bit
    both = jax.jit(lambda a, p: (rewards.score(parted, a, p)[0], sum(parted(a, p).values())))
    jitted, reference = both(artifacts, prompts)
    assert np.array_equal(jitted, reference)
    np.testing.assert_allclose(parts["digit"], [0.7, 0.7, 0.1, 0.1], rtol=1e-6)
    total, parts = rewards.score(brightness, artifacts, prompts)
    assert parts == {} and total.shape == (B,) and total.dtype == jnp.float32


def test_score_rejects_wrong_shapes_naming_the_reward():
    artifacts, prompts = batch()

    def per_image(artifacts, prompts):
        return jnp.mean(artifacts["image"], axis=(1, 2))  # (B, C): forgot the channel axis

    with pytest.raises(ValueError, match=r"reward .*per_image returned shape \(4, 3\); .* \(4,\)"):
        rewards.score(per_image, artifacts, prompts)
    with pytest.raises(ValueError, match=r"part 'bad' returned shape \(\)"):
        rewards.score(lambda a, p: {"ok": brightness(a, p), "bad": jnp.float32(1)}, artifacts, prompts)
    with pytest.raises(ValueError, match="returned no parts"):
        rewards.score(lambda a, p: {}, artifacts, prompts)
    with pytest.raises(ValueError, match=r"prompts.repeat\(K\)"):
        rewards.score(brightness, artifacts, prompts.take(np.array([0, 2])))


def test_combine_weights_and_names_the_parts():
    artifacts, prompts = batch()
    digit = lambda a, p: p.metadata["digit"].astype(jnp.float32)
    nested = rewards.combine({"x": brightness, "y": digit})
    reward = rewards.combine(
        {"bright": brightness, "host": rewards.host(host_brightness), "both": nested}, {"bright": 2.0, "both": -0.5}
    )
    assert list(reward(artifacts, prompts)) == ["bright", "host", "both/x", "both/y"]  # the order given
    total, parts = jax.jit(lambda a, p: rewards.score(reward, a, p))(artifacts, prompts)
    assert sorted(parts) == ["both/x", "both/y", "bright", "host"]  # (a dict out of jit comes back key-sorted)
    mean = brightness(artifacts, prompts)
    np.testing.assert_allclose(parts["bright"], 2 * mean, rtol=1e-6)
    np.testing.assert_allclose(parts["host"], mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parts["both/y"], [-3.5, -3.5, -0.5, -0.5], rtol=1e-6)
    np.testing.assert_allclose(total, 2 * mean + mean - 0.5 * mean - 0.5 * prompts.metadata["digit"], rtol=1e-5)
    assert "bright=2" in reward.__name__


@pytest.mark.parametrize(
    "args, message",
    [
        (({},), "at least one reward"),
        (({"a": brightness}, {"b": 1.0}), r"unknown reward\(s\) \['b'\]"),
        (({"a": brightness}, {"a": float("nan")}), "weight of 'a' must be a finite number"),
        (({"a": brightness}, {"a": float("inf")}), "finite"),
        (({"a": 3.0},), "not callable"),
    ],
)
def test_combine_errors(args, message):
    with pytest.raises(ValueError, match=message):
        rewards.combine(*args)


def test_combine_rejects_clashing_part_names():
    artifacts, prompts = batch()
    reward = rewards.combine({"a/b": brightness, "a": lambda a, p: {"b": brightness(a, p)}})
    with pytest.raises(ValueError, match="two rewards give a part named 'a/b'"):
        reward(artifacts, prompts)


def test_load_from_a_module_and_from_a_file(tmp_path):
    assert rewards.load("conftest:brightness_reward") is conftest.brightness_reward
    assert rewards.load("jaxpipe.rewards:combine") is rewards.combine
    path = tmp_path / "my_reward.py"
    path.write_text(
        "import jaxpipe.rewards\n"
        "@jaxpipe.rewards.host\n"
        "def darkness(artifacts, prompts):\n"
        "    return 1 - artifacts['image'].mean(axis=(1, 2, 3))\n"
        "THRESHOLD = 0.5\n"
    )
    loaded = rewards.load(f"{path}:darkness")
    assert isinstance(loaded, rewards.HostReward) and rewards.load(f"{path}:darkness") is loaded  # imported once
    artifacts, prompts = batch()
    np.testing.assert_allclose(loaded(artifacts, prompts), 1 - brightness(artifacts, prompts), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="no module named 'no_such_reward_module'"):
        rewards.load("no_such_reward_module:f")
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        rewards.load(f"{path}:missing")
    with pytest.raises(ValueError, match="'THRESHOLD' is a float, not a reward function"):
        rewards.load(f"{path}:THRESHOLD")
    with pytest.raises(ValueError, match="no reward file"):
        rewards.load(f"{tmp_path / 'absent.py'}:f")
    with pytest.raises(ValueError, match="'package.module:function'"):
        rewards.load("brightness")


def test_a_reward_model_kind_registers_and_loads_from_its_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(rewards, "MODEL_LOADERS", dict(rewards.MODEL_LOADERS))
    monkeypatch.setattr(rewards, "MODEL_KINDS", rewards.MODEL_KINDS)
    monkeypatch.setattr(rewards, "_LOADED", {})
    seen = []

    def loader(folder, loaded):
        seen.append((folder, dict(loaded)))
        return lambda artifacts, prompts: jnp.mean(artifacts["image"], axis=(1, 2, 3))

    rewards.register_model_kind("glowscore", loader)
    assert rewards.MODEL_KINDS[-1] == "glowscore"
    folder = tmp_path / "glow"
    folder.mkdir()
    reward = rewards.load(f"glowscore:{folder}")
    assert seen == [(folder, {})] and rewards.load(f"glowscore:{folder}") is reward  # loaded once
    assert rewards.spec_name(f"glowscore:{folder}") == "glowscore"
    with pytest.raises(ValueError, match="registered already"):
        rewards.register_model_kind("glowscore", loader)
    with pytest.raises(ValueError, match="a plain name"):
        rewards.register_model_kind("a/b", loader)
    with pytest.raises(ValueError, match="no glowscore model directory"):
        rewards.load(f"glowscore:{tmp_path / 'missing'}")
