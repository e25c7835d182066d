"""Programs: ordered nodes over ONE card that turn a request into artifacts (DESIGN §2, §7).

A program passes named **slots** (arrays with a leading batch axis) from node to node:

* a ``ComponentNode`` is a pure function ``fn(card, reads) -> writes`` (encode the text, encode
  the conditioning image, decode the latents ...);
* a ``LoopNode`` starts one of the card's loops from some slots (``start(card, reads, config)
  -> loop state``), the loop runs, and ``result(final state)`` is bound to one slot.

Reads and writes are declared and checked when the program is built: a node reading a slot that
no earlier node writes and that is not a request input is an error naming the slot. A host-side
``bind(card, request) -> Bound`` turns a ``Request`` into the input slots (batch axis 1), the
static per-loop settings and any host artifacts (the prompt as ``"text"``).

Two ways to run a program, and they give the same bits:

* the fast path, ``Program.run`` / ``execute``: every node, loops as fused ``lax.scan``s, in one
  jitted function;
* split at its loops, the way the engine drives it: ``enter(program, i, ...)`` applies the result
  of loop ``i-1``, runs the component nodes up to loop ``i`` and starts it; the engine then calls
  the loop's pure ``step`` (through its ``LoopDriver``) as often as it likes, batching, previewing
  or cancelling between steps; ``enter(program, len(loops), ...)`` finishes.

Loop kinds are driven through ``LOOP_DRIVERS`` (``"denoise"`` and ``"ar_decode"`` here); a program
may only use loop kinds that have a driver.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card, LoopSpec
from jaxpipe import samplers
from jaxpipe.loops import ar, denoise
from jaxpipe.request import Request

__all__ = [
    "ARDriver",
    "Bound",
    "ComponentNode",
    "DenoiseDriver",
    "LOOP_DRIVERS",
    "LoopDriver",
    "LoopNode",
    "Program",
    "ProgramError",
    "Settings",
    "enter",
    "execute",
    "score_program",
    "settings",
]

Slots = dict[str, Any]
Settings = tuple[tuple[str, Hashable], ...]
"""Static per-loop settings: ``((loop id, loop config), ...)``; hashable, so jit keys on it."""


class ProgramError(ValueError):
    """A program is inconsistent with itself or with the card it is run on."""


def settings(**configs: Hashable) -> Settings:
    """``Settings`` from ``loop_id=config`` keywords (sorted, hashable)."""
    return tuple(sorted(configs.items()))


def _config(settings_: Settings, loop_id: str) -> Hashable:
    for key, value in settings_:
        if key == loop_id:
            return value
    raise ProgramError(f"no settings for loop {loop_id!r}; settings name {[k for k, _ in settings_]}")


# --------------------------------------------------------------------------------------------
# Nodes
# --------------------------------------------------------------------------------------------


def _names(value, what: str) -> tuple[str, ...]:
    value = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(v, str) and v for v in value):
        raise ProgramError(f"{what} must be non-empty slot names (got {value!r})")
    return value


@dataclasses.dataclass(frozen=True)
class ComponentNode:
    """A pure step ``fn(card, {read: array}) -> {write: array}`` of a program.

    ``component``: the card component the outputs depend on (its weight version keys cached
    values); ``cached``: the outputs of one request depend only on that component's weights and
    on the request's own ``reads`` (no batch coupling), so an engine may cache them per request
    (a text encoder is; a batch-norm would not be).
    """

    name: str
    fn: Callable[[Card, Mapping[str, Any]], Mapping[str, Any]]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    component: str | None = None
    cached: bool = False

    def __post_init__(self):
        object.__setattr__(self, "reads", _names(self.reads, f"node {self.name!r} reads"))
        object.__setattr__(self, "writes", _names(self.writes, f"node {self.name!r} writes"))
        if not self.writes:
            raise ProgramError(f"node {self.name!r} writes no slot")
        if self.cached and self.component is None:
            raise ProgramError(f"node {self.name!r} is cached but names no component (its weight version keys the cache)")

    def __call__(self, card: Card, slots: Mapping[str, Any]) -> Slots:
        out = dict(self.fn(card, {r: slots[r] for r in self.reads}))
        if set(out) != set(self.writes):
            raise ProgramError(f"node {self.name!r} declared writes {list(self.writes)} but returned {sorted(out)}")
        return out


def final_latents(state: denoise.DenoiseState) -> jax.Array:
    """The default result of a denoise loop: its final latents ``x``."""
    return state.x


@dataclasses.dataclass(frozen=True)
class LoopNode:
    """Start the card's loop ``loop`` from ``reads`` and bind ``result(final state)`` to ``writes[0]``.

    ``start(card, {read: array}, config) -> state`` builds the loop state (e.g.
    ``denoise.init``); ``config`` is the request's static settings for this loop.
    """

    loop: str
    start: Callable[[Card, Mapping[str, Any], Hashable], Any]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    result: Callable[[Any], jax.Array] = final_latents

    def __post_init__(self):
        object.__setattr__(self, "reads", _names(self.reads, f"loop node {self.loop!r} reads"))
        object.__setattr__(self, "writes", _names(self.writes, f"loop node {self.loop!r} writes"))
        if len(self.writes) != 1:
            raise ProgramError(f"loop node {self.loop!r} must write exactly one slot (got {list(self.writes)})")

    @property
    def name(self) -> str:
        return self.loop


Node = ComponentNode | LoopNode


# --------------------------------------------------------------------------------------------
# Loop drivers: how an engine steps, pads and batches a loop of a given kind
# --------------------------------------------------------------------------------------------


class LoopDriver(Protocol):
    """What the engine needs to drive a loop kind step by step (all functions pure, jittable)."""

    def step(self, card: Card, loop: LoopSpec, state, config) -> Any: ...

    def run(self, card: Card, loop: LoopSpec, state, config) -> Any: ...

    def num_steps(self, config) -> int: ...

    def batch_key(self, config) -> Hashable: ...

    def batch_config(self, config, width: int) -> Hashable: ...

    def schedule(self, config, width: int) -> np.ndarray: ...

    def with_schedule(self, state, schedule: jax.Array) -> Any: ...

    def deactivate(self, state, rows: jax.Array) -> Any: ...

    def empty(self, state, capacity: int) -> Any: ...

    def latents(self, state) -> jax.Array: ...


class DenoiseDriver:
    """Driver of ``denoise`` loops (``jaxpipe.loops.denoise``).

    Mixed step counts share a batch by **padding the schedule**: a request with ``n`` steps gets
    the sigma row ``[flow_sigmas(n), 0, ..., 0]`` of a common width ``W + 1`` (``schedule``); its
    steps read exactly the sigmas they read unpadded, and the engine, which knows each request's
    ``n``, retires it after its ``n``-th step (``deactivate`` then sets its step index to ``W``, so
    the pure ``step`` leaves the row unchanged). A batch starts with ``batch_config`` (``num_steps
    = W``) and ``with_schedule`` puts each row's own sigmas in. Configs that differ only in
    ``num_steps`` batch together (``batch_key``).
    """

    def step(self, card: Card, loop: LoopSpec, state: denoise.DenoiseState, config) -> denoise.DenoiseState:
        return denoise.step(card[loop.binds[0]], state, config)[0]

    def run(self, card: Card, loop: LoopSpec, state: denoise.DenoiseState, config) -> denoise.DenoiseState:
        return denoise.run(card[loop.binds[0]], state, config)[0]

    def num_steps(self, config: denoise.DenoiseConfig) -> int:
        return config.num_steps

    def batch_key(self, config: denoise.DenoiseConfig) -> Hashable:
        # step() reads num_steps only through the width of state.sigmas, and the SDE window is
        # validated per request, so everything but num_steps must agree.
        return dataclasses.replace(config, num_steps=config.sde_window[1] if config.sde_window else 1)

    def batch_config(self, config: denoise.DenoiseConfig, width: int) -> denoise.DenoiseConfig:
        """The config a batch of width ``width`` (>= every member's ``num_steps``) starts with."""
        return dataclasses.replace(config, num_steps=width)

    def schedule(self, config: denoise.DenoiseConfig, width: int) -> np.ndarray:
        """One request's sigma row ``(width + 1,)``: its own schedule, then zeros."""
        return _padded_sigmas(config.num_steps, config.shift, width)

    def with_schedule(self, state: denoise.DenoiseState, schedule: jax.Array) -> denoise.DenoiseState:
        if schedule.shape != state.sigmas.shape:
            raise ValueError(f"schedule {schedule.shape} does not match the state's sigmas {state.sigmas.shape}")
        return state._replace(sigmas=jnp.asarray(schedule, state.sigmas.dtype))

    def deactivate(self, state: denoise.DenoiseState, rows: jax.Array) -> denoise.DenoiseState:
        width = state.sigmas.shape[1] - 1
        return state._replace(step=jnp.where(rows, width, state.step))

    def empty(self, state: denoise.DenoiseState, capacity: int) -> denoise.DenoiseState:
        """``capacity`` inert rows shaped like one row of ``state`` (finished: ``step == W``)."""
        rows = jax.tree.map(lambda a: jnp.zeros((capacity,) + a.shape[1:], a.dtype), state)
        keys = jax.random.split(jax.random.key(0), capacity)  # never read: the rows are inactive
        width = state.sigmas.shape[1] - 1
        return rows._replace(key=keys, step=jnp.full((capacity,), width, jnp.int32))

    def latents(self, state: denoise.DenoiseState) -> jax.Array:
        return state.x


@functools.lru_cache(maxsize=256)
def _padded_sigmas(num_steps: int, shift: float, width: int) -> np.ndarray:
    if width < num_steps:
        raise ValueError(f"cannot pad a {num_steps}-step schedule to {width} steps")
    row = np.zeros((width + 1,), np.float32)
    row[: num_steps + 1] = np.asarray(_flow_sigmas_jit(num_steps, shift))
    row.flags.writeable = False
    return row


_flow_sigmas_jit = jax.jit(samplers.flow_sigmas, static_argnums=(0, 1))


class ARDriver:
    """Driver of ``ar_decode`` loops (``jaxpipe.loops.ar``) over the component the loop binds.

    A request takes ``max_new_tokens`` steps (a request that emits ``<eos>`` earlier is done and
    its remaining steps leave its tokens unchanged), so the engine retires it after exactly the
    steps ``run`` scans. Every row draws its tokens from its own key (``fold_in(key, i)``), so
    rows at different steps share a batch; configs batch together only when equal (``batch_key``
    is the whole ``ARConfig``: ``step`` reads ``max_new_tokens``, temperature and ``eos_id``).
    There is no per-row schedule (``schedule`` is an empty row); ``latents`` is the token
    buffer ``(B, max_len)`` (what a preview of this loop shows).
    """

    def step(self, card: Card, loop: LoopSpec, state: ar.ARState, config: ar.ARConfig) -> ar.ARState:
        return ar.step(card[loop.binds[0]], state, config)[0]

    def run(self, card: Card, loop: LoopSpec, state: ar.ARState, config: ar.ARConfig) -> ar.ARState:
        return ar.run(card[loop.binds[0]], state, config)[0]

    def num_steps(self, config: ar.ARConfig) -> int:
        return config.max_new_tokens

    def batch_key(self, config: ar.ARConfig) -> Hashable:
        return config

    def batch_config(self, config: ar.ARConfig, width: int) -> ar.ARConfig:
        del width  # every member has the same config (batch_key), hence the same step count
        return config

    def schedule(self, config: ar.ARConfig, width: int) -> np.ndarray:
        del config, width
        return _NO_SCHEDULE

    def with_schedule(self, state: ar.ARState, schedule: jax.Array) -> ar.ARState:
        del schedule
        return state

    def deactivate(self, state: ar.ARState, rows: jax.Array) -> ar.ARState:
        return state._replace(done=state.done | rows)

    def empty(self, state: ar.ARState, capacity: int) -> ar.ARState:
        """``capacity`` inert rows shaped like one row of ``state`` (``done``: a step leaves their tokens alone)."""
        rows = jax.tree.map(lambda a: jnp.zeros((capacity,) + a.shape[1:], a.dtype), state._replace(key=None))
        keys = jax.random.split(jax.random.key(0), capacity)  # never read: the rows are done
        return rows._replace(key=keys, done=jnp.ones((capacity,), bool))

    def latents(self, state: ar.ARState) -> jax.Array:
        return state.tokens


_NO_SCHEDULE = np.zeros((0,), np.float32)
_NO_SCHEDULE.flags.writeable = False


LOOP_DRIVERS: dict[str, LoopDriver] = {"denoise": DenoiseDriver(), "ar_decode": ARDriver()}
"""Loop kind -> driver. A program may only use loops whose kind is listed here."""


def driver(kind: str) -> LoopDriver:
    if kind not in LOOP_DRIVERS:
        raise ProgramError(f"no driver for loop kind {kind!r}; programs can drive {sorted(LOOP_DRIVERS)}")
    return LOOP_DRIVERS[kind]


# --------------------------------------------------------------------------------------------
# Program
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bound:
    """A request bound to a program: input ``slots`` (leading batch axis 1, host or device
    arrays), static ``settings`` and host-side ``artifacts`` (e.g. ``{"text": prompt}``)."""

    slots: Mapping[str, Any]
    settings: Settings
    artifacts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """Ordered nodes over one card, validated at construction.

    Arguments:
      name: the program's name (error messages).
      inputs: the slots ``bind`` provides.
      nodes: ``ComponentNode``s and ``LoopNode``s, in execution order.
      outputs: ``((artifact name, slot), ...)``: the artifacts a request gets.
      bind: ``bind(card, request) -> Bound``: validates the request against the card (unknown
        words, image shape, ...) and builds the input slots; host-side, never traced.

    Programs hash by identity (they are static arguments of jitted functions): build each once,
    e.g. behind ``functools.cache``.
    """

    name: str
    inputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, str], ...]
    bind: Callable[[Card, Request], Bound]

    def __post_init__(self):
        object.__setattr__(self, "inputs", _names(self.inputs, f"program {self.name!r} inputs"))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "outputs", tuple((str(a), str(s)) for a, s in dict(self.outputs).items()))
        available = {slot: "a request input" for slot in self.inputs}
        names = set()
        for node in self.nodes:
            if not isinstance(node, (ComponentNode, LoopNode)):
                raise ProgramError(f"program {self.name!r}: {node!r} is not a ComponentNode or LoopNode")
            if node.name in names:
                raise ProgramError(f"program {self.name!r}: two nodes are named {node.name!r}")
            names.add(node.name)
            for slot in node.reads:
                if slot not in available:
                    raise ProgramError(
                        f"program {self.name!r}: node {node.name!r} reads slot {slot!r}, which no earlier node writes "
                        f"and which is not a request input (inputs: {list(self.inputs)}; "
                        f"written before it: {[s for s in available if s not in self.inputs]})"
                    )
            for slot in node.writes:
                if slot in available:
                    raise ProgramError(
                        f"program {self.name!r}: node {node.name!r} writes slot {slot!r}, already {available[slot]}"
                    )
                available[slot] = f"written by {node.name!r}"
        for artifact, slot in self.outputs:
            if slot not in available:
                raise ProgramError(
                    f"program {self.name!r}: output {artifact!r} reads slot {slot!r}, which nothing writes; "
                    f"slots are {sorted(available)}"
                )
        if not self.outputs:
            raise ProgramError(f"program {self.name!r} has no outputs")

    @property
    def loops(self) -> tuple[LoopNode, ...]:
        return tuple(n for n in self.nodes if isinstance(n, LoopNode))

    def segment(self, index: int) -> tuple[ComponentNode, ...]:
        """The component nodes after loop ``index - 1`` and before loop ``index``."""
        bounds = [i for i, n in enumerate(self.nodes) if isinstance(n, LoopNode)]
        lo = bounds[index - 1] + 1 if index > 0 else 0
        hi = bounds[index] if index < len(bounds) else len(self.nodes)
        return self.nodes[lo:hi]

    @property
    def cached_nodes(self) -> tuple[ComponentNode, ...]:
        """Cached component nodes before the first loop that read only request inputs and the writes of
        earlier such nodes, in order (an engine can resolve them per request up front, e.g. a refiner
        that rewrites the prompt, then the text encoding of the rewritten prompt)."""
        known, nodes = set(self.inputs), []
        for n in self.segment(0):
            if isinstance(n, ComponentNode) and n.cached and set(n.reads) <= known:
                nodes.append(n)
                known.update(n.writes)
        return tuple(nodes)

    def check(self, card: Card) -> None:
        """Raise ``ProgramError`` unless every loop and component the program names exists on ``card``."""
        for node in self.nodes:
            if isinstance(node, LoopNode):
                try:
                    spec = card.spec.loop(node.loop)
                except KeyError as err:
                    raise ProgramError(f"program {self.name!r}: {err.args[0]}") from None
                driver(spec.kind)
            elif node.component is not None and node.component not in card.components:
                raise ProgramError(
                    f"program {self.name!r}: node {node.name!r} uses component {node.component!r}; "
                    f"card {card.model_id!r} has {sorted(card.components)}"
                )

    def run(self, card: Card, bound: Bound | Sequence[Bound]) -> dict[str, jax.Array]:
        """The fast path: every node in one jitted function; batched artifacts ``{name: (B, ...)}``.

        ``bound`` is one ``Bound`` or several with equal settings (their slots are concatenated).
        """
        bounds = [bound] if isinstance(bound, Bound) else list(bound)
        if not bounds:
            raise ValueError("run needs at least one bound request")
        settings_ = bounds[0].settings
        if any(b.settings != settings_ for b in bounds):
            raise ValueError("bound requests run together must have equal settings (num_steps, guidance, ...)")
        return _execute_jit(self, settings_, card, tuple(dict(b.slots) for b in bounds))

    def __repr__(self) -> str:
        return f"Program({self.name!r}, nodes={[n.name for n in self.nodes]}, outputs={dict(self.outputs)})"


# --------------------------------------------------------------------------------------------
# Executing a program: pure functions (static: program, settings)
# --------------------------------------------------------------------------------------------


def concat_rows(rows: Sequence[Mapping[str, Any]]) -> Slots:
    """Slots of several requests concatenated along the batch axis (same keys required)."""
    rows = list(rows)
    if len(rows) == 1:
        return {k: jnp.asarray(v) for k, v in rows[0].items()}
    return {k: jnp.concatenate([jnp.asarray(r[k]) for r in rows], axis=0) for k in rows[0]}


def _apply(card: Card, slots: Slots, nodes: Sequence[ComponentNode]) -> Slots:
    slots = dict(slots)
    for node in nodes:
        if all(w in slots for w in node.writes):  # resolved ahead (e.g. from the feature cache)
            continue
        slots.update(node(card, slots))
    return slots


def enter(
    program: Program, index: int, settings_: Settings, card: Card, slots: Slots, state=None, *, schedule=None
) -> tuple[Slots, Any]:
    """Move a batch of requests to loop ``index`` of ``program``: ``(slots, loop state or None)``.

    For ``index > 0`` first binds ``result(state)`` of loop ``index - 1`` to its slot; then runs
    the component nodes before loop ``index`` (skipping nodes whose writes are already present)
    and starts loop ``index``; ``schedule`` (per-row schedules, e.g. padded sigmas ``(B, W+1)``)
    replaces the one ``settings_`` implies, so requests with different step counts can start
    together (``LoopDriver.with_schedule``). For ``index == len(program.loops)`` it runs the
    trailing nodes and returns ``(slots, None)``. Pure; jit it with ``program``, ``index`` and
    ``settings_`` static.
    """
    loops = program.loops
    slots = dict(slots)
    if index > 0:
        done = loops[index - 1]
        slots[done.writes[0]] = done.result(state)
    slots = _apply(card, slots, program.segment(index))
    if index == len(loops):
        return slots, None
    node = loops[index]
    state = node.start(card, {r: slots[r] for r in node.reads}, _config(settings_, node.loop))
    if schedule is not None:
        state = driver(card.spec.loop(node.loop).kind).with_schedule(state, schedule)
    return slots, state


def artifacts(program: Program, slots: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The program's output artifacts ``{name: (B, ...)}`` from its final slots."""
    return {name: slots[slot] for name, slot in program.outputs}


def split_rows(batched: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """``{name: (B, ...)}`` -> the first ``count`` rows as ``[{name: (...)}, ...]`` (inside jit: no extra
    dispatch). An artifact may be a pytree of arrays (e.g. scores per head)."""
    return [{k: jax.tree.map(lambda a: a[i], v) for k, v in batched.items()} for i in range(count)]


def execute(program: Program, settings_: Settings, card: Card, rows: Sequence[Mapping[str, Any]]) -> dict[str, jax.Array]:
    """The whole program on the concatenated ``rows``: batched artifacts ``{name: (B, ...)}``.

    Loops run as their fused runner (``lax.scan``). Pure; jit with ``program`` and ``settings_`` static.
    """
    slots, state = enter(program, 0, settings_, card, concat_rows(rows))
    for i, node in enumerate(program.loops):
        spec = card.spec.loop(node.loop)
        state = driver(spec.kind).run(card, spec, state, _config(settings_, node.loop))
        slots, state = enter(program, i + 1, settings_, card, slots, state)
    return artifacts(program, slots)


_execute_jit = jax.jit(execute, static_argnums=(0, 1))


# --------------------------------------------------------------------------------------------
# Nodes and binding shared by text-conditioned generator cards (flux-t2i, wan-i2v, ...)
# --------------------------------------------------------------------------------------------


def encode_text(card: Card, reads: Mapping[str, Any]) -> Slots:
    """``ids`` ``(B, L)`` -> ``context`` ``(B, L, D)`` and ``context_mask`` ``(B, L)`` (the card's ``text_encoder``)."""
    ids = reads["ids"]
    return {"context": card["text_encoder"](ids), "context_mask": ids != 0}


def encode_null(card: Card, reads: Mapping[str, Any]) -> Slots:
    """``null_ids`` (the empty prompt) -> ``uncond_context``, ``uncond_mask``: the unconditional text of CFG."""
    ids = reads["null_ids"]
    return {"uncond_context": card["text_encoder"](ids), "uncond_mask": ids != 0}


def text_nodes() -> tuple[ComponentNode, ComponentNode]:
    """The two cached text-encoding nodes (prompt and empty prompt) of a text-conditioned card."""
    return (
        ComponentNode("encode_text", encode_text, ("ids",), ("context", "context_mask"), component="text_encoder", cached=True),
        ComponentNode(
            "encode_null", encode_null, ("null_ids",), ("uncond_context", "uncond_mask"), component="text_encoder", cached=True
        ),
    )


def start_denoise(card: Card, reads: Mapping[str, Any], config: denoise.DenoiseConfig) -> denoise.DenoiseState:
    """Start a denoise loop: per-request keys ``jax.random.key(seed)`` from ``seed`` ``(B,)`` uint32, the
    text conditioning (the unconditional half only when ``config.guidance != 1``), an optional
    ``first_frame`` latent ``(B, h, w, C)``, and noise of the card's ``latent_shape``."""
    keys = jax.vmap(jax.random.key)(reads["seed"])
    guided = config.guidance != 1.0
    cond = denoise.Conditioning(
        context=reads["context"],
        context_mask=reads["context_mask"],
        uncond_context=reads["uncond_context"] if guided else None,
        uncond_mask=reads["uncond_mask"] if guided else None,
        first_frame=reads.get("first_frame"),
    )
    return denoise.init(keys, card.spec.config.latent_shape, cond, config)


def loop_config(card: Card, loop_id: str, request: Request) -> Hashable:
    """The card's settings for ``loop_id`` with the request's ``num_steps`` / ``guidance`` (``None`` keeps the default)."""
    changes = {}
    if request.num_steps is not None:
        changes["num_steps"] = request.num_steps
    if request.guidance is not None:
        changes["guidance"] = request.guidance
    base = card.spec.loop(loop_id).config
    return dataclasses.replace(base, **changes) if changes else base


def bind_text(card: Card, request: Request, loop_id: str) -> Bound:
    """Bind the text part of a request: ``ids``/``null_ids`` ``(1, L)`` int32, ``seed`` ``(1,)`` uint32,
    the loop's settings (card defaults overridden by the request) and the ``"text"`` artifact.

    Raises ``ValueError`` on a missing prompt or a word outside the card's vocabulary (listing it).
    """
    if request.prompt is None:
        raise ValueError(f"{card.model_id!r} renders a text prompt: the request needs prompt=...")
    ids = card.spec.tokenizer.encode([request.prompt], card["text_encoder"].cfg.max_len)
    config = loop_config(card, loop_id, request)
    slots = {"ids": ids, "null_ids": np.zeros_like(ids), "seed": np.asarray([request.seed], np.uint32)}
    return Bound(slots=slots, settings=settings(**{loop_id: config}), artifacts={"text": request.prompt})


# --------------------------------------------------------------------------------------------
# A loop-free program for reward cards (loop kind "score")
# --------------------------------------------------------------------------------------------


def _score_node(card: Card, reads: Mapping[str, Any]) -> Slots:
    component = card[card.spec.loop(card.spec.recipe[0]).binds[0]]
    out = component(reads["image"] * 2.0 - 1.0)
    if isinstance(out, Mapping):
        return {"scores": {k: jax.nn.softmax(v, axis=-1) for k, v in out.items()}}
    return {"scores": out}


def _score_bind(card: Card, request: Request) -> Bound:
    if request.image is None:
        raise ValueError(f"{card.model_id!r} scores an image: the request needs image=(H, W, C) in [0, 1]")
    expected = getattr(card.spec.config, "image_shape", None)
    image = jnp.asarray(request.image, jnp.float32)
    if expected is not None and tuple(image.shape) != tuple(expected):
        raise ValueError(f"{card.model_id!r}: image must have shape {tuple(expected)} in [0, 1]; got {tuple(image.shape)}")
    return Bound(slots={"image": image[None]}, settings=())


@functools.cache
def score_program() -> Program:
    """The program of a reward card (a single ``score`` loop binding one component).

    Reads ``image`` ``(H, W, C)`` in [0, 1], runs the component on ``2·image - 1`` and returns the
    artifact ``"scores"``: class probabilities per head (softmax of a dict of logits), or the raw
    output when it is a single array.
    """
    return Program(
        name="score",
        inputs=("image",),
        nodes=(ComponentNode("score", _score_node, reads=("image",), writes=("scores",)),),
        outputs=(("scores", "scores"),),
        bind=_score_bind,
    )
