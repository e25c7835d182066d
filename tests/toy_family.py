"""A card family defined outside the package: a class-conditioned flow model over 4×4 latents.

Used by ``test_family.py`` (a family is one folder's worth of code plus one ``register`` call) and
``test_routing.py`` (two denoisers switched by noise level in one loop). Components: ``embed``
(class label -> context, index 10 = unconditional) and one denoiser (``denoiser``), or two
(``high``, ``low``) routed by ``policies.SigmaBoundary``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxpipe as jp
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.loops import denoise, policies
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program, settings

MODEL_ID = "toy-flow"
LOOP = "denoise"
SHAPE = (1, 4, 4, 1)
NULL = 10  # the unconditional label


@dataclasses.dataclass(frozen=True)
class Config:
    dim: int = 32
    experts: int = 1  # 1: "denoiser"; 2: "high" and "low", switched at `boundary`
    boundary: float = 0.5
    num_steps: int = 4


class ToyDenoiser(nnx.Module):
    """``velocity(x (B, 1, 4, 4, 1), sigma (B,), cond {"context": (B, dim)})``: an MLP (the denoiser protocol)."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(16 + 1 + dim, 64, rngs=rngs)
        self.out = nnx.Linear(64, 16, rngs=rngs)

    def velocity(self, x: jax.Array, sigma: jax.Array, cond: Mapping[str, jax.Array]) -> jax.Array:
        b = x.shape[0]
        h = jnp.concatenate([x.reshape(b, 16), jnp.broadcast_to(sigma, (b,))[:, None], cond["context"]], axis=-1)
        return self.out(jax.nn.gelu(self.inp(h))).reshape(x.shape)


def denoisers(config: Config) -> tuple[str, ...]:
    return ("denoiser",) if config.experts == 1 else ("high", "low")


def sampling(config: Config) -> denoise.DenoiseConfig:
    router = policies.Single() if config.experts == 1 else policies.SigmaBoundary(config.boundary)
    return denoise.DenoiseConfig(num_steps=config.num_steps, router=router)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    rngs = nnx.Rngs(seed)
    components = {"embed": nnx.Embed(NULL + 1, config.dim, rngs=rngs)}
    for name in denoisers(config):
        components[name] = ToyDenoiser(config.dim, rngs=rngs)
    loop = LoopSpec(LOOP, "denoise", denoisers(config), sampling(config), latent_shape=SHAPE)
    spec = CardSpec(
        model_id=model_id, family="toy_flow", loops=(loop,), recipe=(LOOP,), parity=("C0", "C1"), config=config
    )
    return Card(components, spec)


def _embed(card: Card, reads) -> dict[str, jax.Array]:
    return {"context": card["embed"](reads["label"])}


def _start(card: Card, loop: LoopSpec, reads, config: denoise.DenoiseConfig) -> denoise.DenoiseState:
    return denoise.init(reads["key"], loop.latent_shape, {"context": reads["context"]}, config)


def _bind(card: Card, request: jp.Request) -> Bound:
    if request.prompt not in [str(d) for d in range(10)]:
        raise ValueError(f"{card.model_id!r} draws a class: the prompt is one of '0'..'9' (got {request.prompt!r})")
    config = card.spec.loop(LOOP).config
    if request.num_steps is not None:
        config = config.replace(num_steps=request.num_steps)
    slots = {"label": np.asarray([int(request.prompt)], np.int32), "key": jax.random.key(request.seed)[None]}
    return Bound(slots=slots, settings=settings(**{LOOP: config}))


@functools.cache
def program() -> Program:
    return Program(
        name=MODEL_ID,
        inputs=("label", "key"),
        nodes=(
            ComponentNode("embed", _embed, reads=("label",), writes=("context",), component="embed", cached=True),
            LoopNode(LOOP, _start, reads=("key", "context"), writes=("latents",)),
        ),
        outputs=(("sample", "latents"),),
        bind=_bind,
    )


@dataclasses.dataclass(frozen=True)
class ToyFlow:
    """``FlowData``: a batch is ``{"x0": (B, 1, 4, 4, 1), "label": (B,) int32}``."""

    def latents(self, components: Mapping[str, Any], batch: Mapping[str, Any]) -> jax.Array:
        return batch["x0"]

    def cond(self, components: Mapping[str, Any], batch: Mapping[str, Any], keep: jax.Array, x0: jax.Array):
        return {"context": components["embed"](jnp.where(keep, batch["label"], NULL))}


FAMILY = jp.cards.Family(
    name="toy_flow", config=Config, build=build, programs={"sample": program}, model_id=MODEL_ID, flow=ToyFlow()
)


def data(n: int, seed: int = 0) -> dict[str, jax.Array]:
    """Each class is a fixed 4×4 pattern (its label's bits, ±1) plus a little noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.int32)
    bits = ((labels[:, None] >> np.arange(16) % 4) & 1) * 2.0 - 1.0
    x0 = bits.reshape(n, *SHAPE) + 0.05 * rng.standard_normal((n, *SHAPE))
    return {"x0": jnp.asarray(x0, jnp.float32), "label": jnp.asarray(labels)}
