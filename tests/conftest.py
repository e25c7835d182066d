"""Shared fixtures: small cards whose zero-initialised output layers are perturbed so they compute something.

The suite compiles through JAX's persistent compilation cache (``jaxpipe.compilation``): the
user's cache directory (kept between runs, CI's included), or ``$JAXPIPE_CACHE_DIR``. Both pytest-xdist
workers and the subprocesses the tests start share it.

``JAXPIPE_COMPILE_LOG=FILE`` appends one JSON line per trace, lowering and XLA compile to ``FILE.<worker>``
(``{"test", "event", "fun", "s"}``): where a test's seconds go (see docs/testing.md).
"""

import gc
import json
import os

import jax
import jax.numpy as jnp
import pytest
import xla_flags  # tests/xla_flags.py
from flax import nnx

import jaxpipe as jp
from jaxpipe import compilation
from jaxpipe.prompts import Prompts

os.environ["JAXPIPE_CACHE_DIR"] = str(compilation.enable_cache())

xla_flags.apply()  # before the backend starts: compiled for speed of compiling (tests/xla_flags.py)

# the modules imported so far live as long as the worker: the collector need not walk them again at every full
# collection while JAX traces (tracing allocates, and so triggers, a great many)
gc.freeze()

if os.environ.get("JAXPIPE_COMPILE_LOG"):
    from jax import monitoring

    _EVENTS = {
        "/jax/core/compile/jaxpr_trace_duration": "trace",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
        "/jax/core/compile/backend_compile_duration": "compile",
    }
    _LOG = open(f"{os.environ['JAXPIPE_COMPILE_LOG']}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a")  # noqa: SIM115

    def _log_compile(event: str, seconds: float, **kwargs) -> None:
        if event in _EVENTS:
            test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
            row = {"test": test, "event": _EVENTS[event], "fun": str(kwargs.get("fun_name", "")), "s": seconds}
            _LOG.write(json.dumps(row) + "\n")
            _LOG.flush()

    monitoring.register_event_duration_secs_listener(_log_compile)

pytest_plugins = ["crash_rerun"]  # tests/crash_rerun.py: a crashed worker's test runs once more

LONGEST_FIRST = (
    "test_classifier.py",
    "test_benchmarks.py",
    "test_stop_resume.py",
    "test_parity.py",
    "test_notebook.py",
    "test_distributed.py",
    "test_joint_rl.py",
    "test_self_forcing.py",
    "test_unified_rl.py",
    "test_own_reward.py",
)
"""Files holding the suite's longest tests (``--durations``), started first: pytest-xdist's work stealing then
balances the short rest across both workers instead of one worker finishing a long test alone at the end."""


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def leaves_equal(a, b) -> bool:
    """The two pytrees have the same number of leaves, each of the same dtype and bit for bit the same values."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(x.dtype == y.dtype and bool(jnp.array_equal(x, y)) for x, y in zip(la, lb))


def brightness_reward(artifacts, prompts):
    """Mean brightness of images in [0, 1]: a reward whose direction the RL tests can check."""
    return jnp.mean(artifacts["image"], axis=(1, 2, 3))


def rl_batch(card):
    """Two prompts with their digit labels (``metadata["digit"]``), as the RL methods take them."""
    return Prompts.from_texts(card, ["seven thick", "one thin"], {"digit": [7, 1]})


def perturbed(module_or_card, seed: int = 0, scale: float = 0.05):
    """A copy whose every parameter gets small Gaussian noise (adaLN-zero layers start at exactly 0)."""
    graphdef, params, rest = nnx.split(module_or_card, nnx.Param, ...)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    # leaf by leaf outside jit: one tiny compile per distinct shape, shared by every card (measured: one jitted
    # draw of all leaves compiles for ~3 s per card structure, several times the tiny ones)
    leaves = [p + scale * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves), rest)


@pytest.fixture(scope="session")
def t2i_card():
    """A ``flux-t2i`` card at default (tiny) size with non-trivial weights."""
    card = jp.cards.build("flux-t2i", seed=0)
    return card.replace(transformer=perturbed(card["transformer"], seed=1))


@pytest.fixture(scope="session")
def i2v_card():
    """A ``wan-i2v`` card at default (tiny) size with non-trivial weights."""
    card = jp.cards.build("wan-i2v", seed=1)
    return card.replace(transformer=perturbed(card["transformer"], seed=2))


# ---- the HTTP server (jaxpipe.serve) -----------------------------------------------------------------------------

SERVED_CARDS = ("flux-t2i", "wan-i2v", "unified", "bagel-mot", "digit-scorer")
SERVED_WORKFLOWS = ("image_video.t2i_i2v",)


@pytest.fixture(scope="session")
def server():
    """A live server for the HTTP tests (tests/test_serve*.py, chat, rewards), started once per session.

    uvicorn runs ``jaxpipe.serve.app.create_app(front)`` in a background thread on a free loopback port, over
    a ``jaxpipe.serve.front.Front`` (default ``Budget``) of an ``Engine(mode="batched")`` serving the bundled
    ``SERVED_CARDS`` and the ``SERVED_WORKFLOWS``. Yields ``(url, front)`` (a ``Served`` named tuple: ``.url`` is
    the base URL without a trailing slash, e.g. ``http://127.0.0.1:PORT``; the OpenAI client takes
    ``url + "/v1"``; ``.front.engine`` is the engine). Tests must leave it serving: never drain or close it.
    """
    pytest.importorskip("fastapi")
    from jaxpipe import workflow as workflows
    from jaxpipe.engine import Engine
    from jaxpipe.serve.app import create_app
    from jaxpipe.serve.chat import register_text_programs
    from jaxpipe.serve.front import Front
    from jaxpipe.serve.server import Served, serve_in_thread

    engine = Engine(mode="batched")
    for model_id in SERVED_CARDS:
        engine.register(jp.cards.load(model_id))
    for wf in workflows.bundled():
        if wf.id in SERVED_WORKFLOWS:
            engine.register_workflow(wf)
    register_text_programs(engine)  # as jaxpipe serve does: the app never changes its engine
    front = Front(engine)
    with serve_in_thread(create_app(front)) as url:
        yield Served(url, front)
    front.close()


def assert_api_error(response, status: int, param: str | None, message: str) -> None:
    """``response`` is an OpenAI-style error envelope with ``status``, naming ``param`` and saying ``message``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error
