"""Programs: ordered nodes over ONE card that turn a request into artifacts.

A program passes named **slots** (arrays, or pytrees of arrays, with a leading batch axis) from
node to node:

* a ``ComponentNode`` is a pure function ``fn(card, reads) -> writes`` (encode the text, encode
  the conditioning image, decode the latents ...); one that names a ``loop`` runs that loop whole
  and gets its settings, ``fn(card, reads, config)`` (N stacked refiners decoded as one vmap);
* a ``LoopNode`` starts one of the card's loops from some slots (``start(card, loop spec, reads,
  config) -> loop state``), the loop runs through its kind's driver
  (``jaxpipe.loops.registry``), and ``result(final state)`` is bound to one slot.

Reads and writes are declared and checked when the program is built: a node reading a slot that
no earlier node writes and that is not a request input is an error naming the slot. A host-side
``bind(card, request) -> Bound`` turns a ``Request`` into the input slots (batch axis 1), the
static per-loop settings and any host artifacts (the prompt as ``"text"``).

Two ways to run a program:

* the **fused path**, ``execute`` / ``Program.run``: every node, loops as fused ``lax.scan``s, in
  one jitted function. ``jp.generate`` and the RL rollouts (``execute(..., capture=True)``, which
  also returns every loop's captured trajectory) use it;
* **split at its loops**, the way the engine drives it: ``enter(program, i, ...)`` applies the
  result of loop ``i-1``, runs the component nodes up to loop ``i`` and starts it; the engine then
  calls the loop's pure ``step`` (through its driver) as often as it likes, batching, previewing
  or cancelling between steps; ``enter(program, len(loops), ...)`` finishes.

The two agree within the measured C3 tolerance (``jaxpipe.parity``), not bit for bit: XLA
compiles a fused scan differently from a standalone step. Bit-for-bit guarantees (C1) hold
between runs that take the same path (the engine's serial and interleaved modes both drive the
step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxpipe import validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.loops import registry as loop_kinds
from jaxpipe.request import Request

__all__ = [
    "Bound",
    "ComponentNode",
    "Execution",  # noqa: F822 (jaxpipe.execution, re-exported by __getattr__ below)
    "LoopNode",
    "Program",
    "ProgramError",
    "Settings",
    "artifacts",  # noqa: F822 (jaxpipe.execution, re-exported by __getattr__ below)
    "concat_rows",  # noqa: F822 (jaxpipe.execution, re-exported by __getattr__ below)
    "config_of",
    "driver",
    "enter",  # noqa: F822 (jaxpipe.execution, re-exported by __getattr__ below)
    "execute",  # noqa: F822 (jaxpipe.execution, re-exported by __getattr__ below)
    "final_latents",
    "settings",
    "split_rows",  # noqa: F822 (jaxpipe.execution, re-exported by __getattr__ below)
]

Slots = dict[str, Any]
Settings = tuple[tuple[str, Hashable], ...]
"""Static per-loop settings: ``((loop id, loop config), ...)``; hashable, so jit keys on it."""


class ProgramError(ValueError):
    """A program is inconsistent with itself or with the card it is run on."""


def settings(**configs: Hashable) -> Settings:
    """``Settings`` from ``loop_id=config`` keywords (sorted, hashable).

    Args:
      **configs: loop id -> that loop's (hashable) config.

    Returns:
      ``((loop id, config), ...)`` sorted by loop id.
    """
    return tuple(sorted(configs.items()))


def config_of(settings_: Settings, loop_id: str) -> Hashable:
    """The config ``settings_`` holds for loop ``loop_id``.

    Args:
      settings_: static per-loop settings (``settings(...)``).
      loop_id: the loop.

    Returns:
      That loop's config.

    Raises:
      ProgramError: if ``settings_`` has no entry for ``loop_id``.
    """
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

    Calling the node, ``node(card, slots, settings_)``, runs ``fn`` on its ``reads`` of ``slots`` and
    returns its writes (``ProgramError`` if ``fn`` returns other slots than ``writes``).

    Attributes:
      name: the node's name, unique in its program.
      fn: ``fn(card, reads) -> writes`` (``fn(card, reads, config)`` for a node with a ``loop``).
      reads: the slots it reads.
      writes: the slots it writes (at least one).
      component: the card component the outputs depend on (its weight version keys cached values).
      cached: the outputs of one request depend only on that component's weights and on the request's
        own ``reads`` (no batch coupling), so an engine may cache them per request (a text encoder is;
        a batch-norm would not be); needs ``component``.
      loop: the card loop this node runs whole (fused), if any: ``fn`` is then called
        ``fn(card, reads, config)`` with the request's settings for that loop (which also key its
        cached values).

    Raises:
      ProgramError: on empty slot names, no writes, or ``cached`` without a ``component``.
    """

    name: str
    fn: Callable[..., Mapping[str, Any]]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    component: str | None = None
    cached: bool = False
    loop: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "reads", _names(self.reads, f"node {self.name!r} reads"))
        object.__setattr__(self, "writes", _names(self.writes, f"node {self.name!r} writes"))
        validate.rule(bool(self.writes), f"node {self.name!r} writes no slot", error=ProgramError)
        validate.rule(
            not (self.cached and self.component is None),
            f"node {self.name!r} is cached but names no component (its weight version keys the cache)",
            error=ProgramError,
        )

    def __call__(self, card: Card, slots: Mapping[str, Any], settings_: Settings = ()) -> Slots:
        reads = {r: slots[r] for r in self.reads}
        if self.loop is None:
            out = dict(self.fn(card, reads))
        else:
            out = dict(self.fn(card, reads, config_of(settings_, self.loop)))
        if set(out) != set(self.writes):
            raise ProgramError(f"node {self.name!r} declared writes {list(self.writes)} but returned {sorted(out)}")
        return out


def final_latents(state) -> jax.Array:
    """The default result of a denoise loop: its final latents ``state.x``.

    Args:
      state: the loop's final state (a ``DenoiseState``).

    Returns:
      ``state.x``, ``(B, *latent_shape)``.
    """
    return state.x


@dataclasses.dataclass(frozen=True)
class LoopNode:
    """Start the card's loop ``loop`` from ``reads`` and bind ``result(final state)`` to ``writes[0]``.

    Attributes:
      loop: the card loop's id (also the node's ``name``).
      start: ``start(card, loop_spec, {read: array}, config) -> state`` builds the loop state (e.g.
        ``denoise.init`` with ``loop_spec.latent_shape``); ``config`` is the request's static settings
        for this loop.
      reads: the slots ``start`` reads.
      writes: exactly one slot, bound to ``result(final state)``.
      result: the final state -> the written value (default ``final_latents``).

    Raises:
      ProgramError: on empty slot names or other than one write.
    """

    loop: str
    start: Callable[[Card, LoopSpec, Mapping[str, Any], Hashable], Any]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    result: Callable[[Any], jax.Array] = final_latents

    def __post_init__(self):
        object.__setattr__(self, "reads", _names(self.reads, f"loop node {self.loop!r} reads"))
        object.__setattr__(self, "writes", _names(self.writes, f"loop node {self.loop!r} writes"))
        validate.rule(
            len(self.writes) == 1,
            f"loop node {self.loop!r} must write exactly one slot (got {list(self.writes)})",
            error=ProgramError,
        )

    @property
    def name(self) -> str:
        """The node's name in its program: the loop's id."""
        return self.loop


Node = ComponentNode | LoopNode


# --------------------------------------------------------------------------------------------
# Program
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bound:
    """A request bound to a program (what ``Program.bind`` returns).

    Attributes:
      slots: the input slots, leading batch axis 1 (host or device arrays).
      settings: the static per-loop settings.
      artifacts: host-side artifacts (e.g. ``{"text": prompt}``).
    """

    slots: Mapping[str, Any]
    settings: Settings
    artifacts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """Ordered nodes over one card, validated at construction.

    Attributes:
      name: the program's name (error messages).
      inputs: the slots ``bind`` provides.
      nodes: ``ComponentNode``s and ``LoopNode``s, in execution order.
      outputs: ``((artifact name, slot), ...)``: the artifacts a request gets.
      bind: ``bind(card, request) -> Bound``: validates the request against the card (unknown
        words, image shape, ...) and builds the input slots; host-side, never traced.
      texts: ``((text artifact, ids artifact), ...)``: artifacts of token ids that are also returned
        as text, decoded with the card's tokenizer (``texts_of``), e.g. a refined prompt.

    Programs hash by identity (they are static arguments of jitted functions): build each once,
    e.g. behind ``functools.cache``.

    Raises:
      ProgramError: if a node reads a slot no earlier node or input provides, two nodes share a name or
        write one slot, an output reads an unwritten slot, there are no outputs, or ``texts`` decodes an
        artifact the program does not output.
    """

    name: str
    inputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[str, str], ...]
    bind: Callable[[Card, Request], Bound]
    texts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "inputs", _names(self.inputs, f"program {self.name!r} inputs"))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "outputs", tuple((str(a), str(s)) for a, s in dict(self.outputs).items()))
        available = {slot: "a request input" for slot in self.inputs}
        names = set()
        for node in self.nodes:
            validate.rule(
                isinstance(node, (ComponentNode, LoopNode)),
                f"program {self.name!r}: {node!r} is not a ComponentNode or LoopNode",
                error=ProgramError,
            )
            validate.rule(
                node.name not in names, f"program {self.name!r}: two nodes are named {node.name!r}", error=ProgramError
            )
            names.add(node.name)
            for slot in node.reads:
                validate.rule(
                    slot in available,
                    f"program {self.name!r}: node {node.name!r} reads slot {slot!r}, which no earlier node writes "
                    f"and which is not a request input (inputs: {list(self.inputs)}; "
                    f"written before it: {[s for s in available if s not in self.inputs]})",
                    error=ProgramError,
                )
            for slot in node.writes:
                validate.rule(
                    slot not in available,
                    f"program {self.name!r}: node {node.name!r} writes slot {slot!r}, already {available.get(slot)}",
                    error=ProgramError,
                )
                available[slot] = f"written by {node.name!r}"
        for artifact, slot in self.outputs:
            validate.rule(
                slot in available,
                f"program {self.name!r}: output {artifact!r} reads slot {slot!r}, which nothing writes; "
                f"slots are {sorted(available)}",
                error=ProgramError,
            )
        validate.rule(bool(self.outputs), f"program {self.name!r} has no outputs", error=ProgramError)
        object.__setattr__(self, "texts", tuple((str(t), str(a)) for t, a in dict(self.texts).items()))
        unknown = [a for _, a in self.texts if a not in dict(self.outputs)]
        validate.rule(
            not unknown,
            f"program {self.name!r}: texts decode artifacts {unknown} it does not output",
            error=ProgramError,
        )

    def texts_of(self, card: Card, artifacts: Mapping[str, Any]) -> dict[str, Any]:
        """The text artifacts of ``artifacts``, decoded with the card's tokenizer.

        Args:
          card: the card the program ran on.
          artifacts: the program's artifacts (the ``texts`` sources: ids ``(L,)`` or ``(B, L)``).

        Returns:
          ``{text artifact: str}`` for one request's ``(L,)`` ids, ``{text artifact: [str, ...]}`` for a batch.
        """
        out = {}
        for name, source in self.texts:
            ids = np.asarray(artifacts[source])
            words = card.spec.tokenizer.decode(ids.reshape(-1, ids.shape[-1]))
            out[name] = words[0] if ids.ndim == 1 else words
        return out

    @property
    def loops(self) -> tuple[LoopNode, ...]:
        """The program's ``LoopNode``s, in order."""
        return tuple(n for n in self.nodes if isinstance(n, LoopNode))

    def segment(self, index: int) -> tuple[ComponentNode, ...]:
        """The component nodes after loop ``index - 1`` and before loop ``index``.

        Args:
          index: a loop index in ``[0, len(loops)]`` (``len(loops)``: the trailing nodes).

        Returns:
          Those nodes, in order.
        """
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
        """Checks that every loop and component the program names exists on ``card``.

        Args:
          card: the card to run on.

        Raises:
          ProgramError: if a loop or component is missing, or a loop it steps has no driver.
        """
        for node in self.nodes:
            if node.loop is not None:
                try:
                    spec = card.spec.loop(node.loop)
                except KeyError as err:
                    raise ProgramError(f"program {self.name!r}: {err.args[0]}") from None
                if isinstance(node, LoopNode):
                    driver(spec.kind)
            if isinstance(node, ComponentNode) and node.component is not None and node.component not in card.components:
                raise ProgramError(
                    f"program {self.name!r}: node {node.name!r} uses component {node.component!r}; "
                    f"card {card.model_id!r} has {sorted(card.components)}"
                )

    def run(self, card: Card, bound: Bound | Sequence[Bound]) -> dict[str, jax.Array]:
        """The fused path: every node in one jitted function.

        Args:
          card: the card.
          bound: one ``Bound`` or several with equal settings (their slots are concatenated).

        Returns:
          Batched artifacts ``{name: (B, ...)}``.

        Raises:
          ValueError: if ``bound`` is empty or the requests' settings differ.
        """
        bounds = [bound] if isinstance(bound, Bound) else list(bound)
        if not bounds:
            raise ValueError("run needs at least one bound request")
        settings_ = bounds[0].settings
        if any(b.settings != settings_ for b in bounds):
            raise ValueError("bound requests run together must have equal settings (num_steps, guidance, ...)")
        from jaxpipe import execution  # it builds on this module

        return execution._execute_jit(self, settings_, card, execution.concat_rows([b.slots for b in bounds]))

    def __repr__(self) -> str:
        return f"Program({self.name!r}, nodes={[n.name for n in self.nodes]}, outputs={dict(self.outputs)})"


# --------------------------------------------------------------------------------------------
# Executing a program: jaxpipe.execution (re-exported here)
# --------------------------------------------------------------------------------------------


def driver(kind: str) -> loop_kinds.LoopDriver:
    """The driver of loop kind ``kind``.

    Args:
      kind: a loop kind (``"denoise"``, ``"ar_decode"``, ...).

    Returns:
      Its ``LoopDriver``.

    Raises:
      ProgramError: if the kind has no driver (naming the drivable kinds).
    """
    try:
        return loop_kinds.driver(kind)
    except ValueError as err:
        raise ProgramError(str(err)) from None


_EXECUTION = ("Execution", "artifacts", "concat_rows", "enter", "execute", "split_rows")


def __getattr__(name: str):
    # jaxpipe.execution imports this module, so its names are re-exported lazily (no import cycle).
    if name in _EXECUTION:
        from jaxpipe import execution

        return getattr(execution, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
