"""The engine: resident cards and workflows by id, and the loop that serves requests.

``Engine`` keeps each registered card resident with its program and per-component weight
versions, keeps the registered workflows, and runs requests:

* ``run(request)`` / ``run_many(requests, mode="serial")``: each request to completion. A card
  request is the program's fast path (one jitted function, loops as fused ``lax.scan``s) after
  its text encodings are looked up in the feature cache.
* ``mode="interleaved"``: every request advances one loop step per tick, the engine calling the
  loop's pure ``step`` per request. Same bits as serial (``parity.interleave_gate``).
* ``mode="batched"``: requests on the same card and loop with compatible settings and shapes
  advance together as ONE jitted batched step, even at different step indices (continuous
  batching). Requests whose settings differ only in ``num_steps`` are prepared together (cached
  text, image encoding, loop start) as one **cohort**, each row with its own sigma schedule
  padded with zeros to a common width (see ``program.DenoiseDriver``). A **group** holds
  ``capacity`` slots (2^k or 3·2^k, up to ``max_batch``); rows are admitted into free slots,
  step together, and are retired after their own last step, when waiting rows take their slots;
  the capacity follows the number of rows (one gather when it changes). Between scheduling events (a request finishing) the
  engine fuses the steps into one call. Finished cohorts are decoded together. Results match
  serial within a measured tolerance, not bit for bit (``parity.batch_invariance``, C3).

Workflows run as a chain of stage requests through the same machinery, so in the interleaved
and batched modes the stages of many workflow requests interleave or batch with each other and
with plain card requests.

Optional hooks: ``on_step(event)`` is called after every loop step of every request (a
streaming preview: ``event.latents``); returning ``False`` cancels that request at this step
boundary. ``cancel`` (a ``threading.Event`` or a callable returning ``bool``) cancels every
unfinished request at the next step boundary. Cancelled requests get an ``Output`` with
``cancelled_at`` set; the engine stays usable.

Weight sync: ``publish(model_id, {name: module})`` swaps trained components into a resident card
and bumps only their weight versions, dropping only their feature-cache entries. During
``run_many`` (from a callback or another thread) it drains first: requests already started on
that card finish on the old weights, bit for bit as without the publish; its requests not yet
started wait until the card has drained, then the swap applies and they start on the new
weights; other cards keep running. The training side calls it through
``jaxpipe.training.weight_sync.publish`` (the engine never imports training).

Stacked experts: a component stored stacked on a leading expert axis (declared by its card
family, see ``jaxpipe.cards.stacked_components``; e.g. the ``multi-expert`` card's ``refiners``)
is versioned per expert (``refiner_0``, ``refiner_1``, ...): ``publish(model_id, {"refiner_2":
lm})`` writes only that slice and bumps only that expert's version; publishing the stacked
component bumps them all. Cache entries computed by a stacked component are keyed by the sum of
its experts' versions, so any expert's publish retires them (and drops them).

Bad input (unknown model id, bad steps, wrong image shape, unknown words, a published component
of another layout) raises before any request starts and before any engine state (cache,
versions, registry) changes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import program as programs
from jaxpipe.cache import CacheKey, FeatureCache, content_hash
from jaxpipe.card import Card
from jaxpipe.program import Bound, Program
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow, WorkflowError, WorkflowRegistry, initial_state, publish

__all__ = ["Engine", "EngineError", "UnknownComponentError", "StepEvent", "MODES"]

MODES = ("serial", "interleaved", "batched")
MIN_WIDTH = 64
"""Batched loops pad schedules to at least this many steps, so nearly all step counts share a group."""


class EngineError(ValueError):
    """A request or registration the engine cannot serve (the message names the problem and what is allowed)."""


class UnknownComponentError(EngineError, KeyError):
    """A publish names a component the card does not have (also a ``KeyError``, as ``Card.replace`` raises)."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


# --------------------------------------------------------------------------------------------
# Jitted pieces. A resident card travels as (treedef, leaves): flattening a Card of NNX modules
# walks the module graph in Python (~0.4 ms); a flat list of arrays is the C++ fast path.
# --------------------------------------------------------------------------------------------


def _card(treedef, leaves) -> Card:
    return jax.tree.unflatten(treedef, leaves)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _run_whole(program: Program, settings, treedef, leaves, rows):
    """The fast path on ``rows`` (per-request slots, batch axis 1): per-request artifacts."""
    out = programs.execute(program, settings, _card(treedef, leaves), rows)
    return programs.split_rows(out, len(rows))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _enter(program: Program, index: int, settings, treedef, leaves, slots, state, schedule):
    """``program.enter`` (rows are concatenated at index 0); at the end: per-row artifacts."""
    if index == 0:
        slots = programs.concat_rows(slots)
    slots, state = programs.enter(program, index, settings, _card(treedef, leaves), slots, state, schedule=schedule)
    if state is None:
        out = programs.artifacts(program, slots)
        return programs.split_rows(out, jax.tree.leaves(out)[0].shape[0]), None
    return slots, state


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _node(program: Program, name: str, treedef, leaves, reads):
    node = next(n for n in program.nodes if n.name == name)
    return node(_card(treedef, leaves), reads)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _step(kind: str, loop_id: str, config, treedef, leaves, state):
    """One pure step of the loop (all rows)."""
    card = _card(treedef, leaves)
    return programs.driver(kind).step(card, card.spec.loop(loop_id), state, config)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _steps(kind: str, loop_id: str, config, treedef, leaves, state, count):
    """``count`` (traced) pure steps of the loop on the whole batch: one dispatch between scheduling events."""
    card = _card(treedef, leaves)
    loop, drive = card.spec.loop(loop_id), programs.driver(kind)
    return jax.lax.fori_loop(0, count, lambda _, s: drive.step(card, loop, s, config), state)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _empty(kind: str, capacity: int, like):
    return programs.driver(kind).empty(like, capacity)


@functools.partial(jax.jit, static_argnums=(0,))
def _admit(kind: str, batch, source, slots, rows):
    """Copy ``source`` rows ``rows`` into ``batch`` slots ``slots`` (out-of-range slots are skipped)."""
    rows = jnp.clip(rows, 0, jax.tree.leaves(source)[0].shape[0] - 1)
    return jax.tree.map(lambda b, s: b.at[slots].set(s[rows], mode="drop"), batch, source)


@functools.partial(jax.jit, static_argnums=(0,))
def _retire(kind: str, batch, target, slots, rows):
    """Copy ``batch`` slots ``slots`` back into ``target`` rows ``rows`` and make those slots inert."""
    capacity = jax.tree.leaves(batch)[0].shape[0]
    taken = jnp.clip(slots, 0, capacity - 1)
    target = jax.tree.map(lambda t, b: t.at[rows].set(b[taken], mode="drop"), target, batch)
    mask = jnp.zeros((capacity,), bool).at[slots].set(True, mode="drop")
    return programs.driver(kind).deactivate(batch, mask), target


@functools.partial(jax.jit, static_argnums=(0, 1))
def _resize(kind: str, capacity: int, batch, keep):
    """A batch of ``capacity`` slots holding old slots ``keep`` (``-1``: an inert slot)."""
    empty = programs.driver(kind).empty(batch, capacity)
    taken = jax.tree.map(lambda b: b[jnp.clip(keep, 0)], batch)
    pick = lambda e, t: jnp.where((keep >= 0).reshape((-1,) + (1,) * (t.ndim - 1)), t, e)
    return jax.tree.map(pick, empty, taken)


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _bucket(n: int) -> int:
    """The smallest batch size >= ``n`` of the form 2^k or 3·2^k (1, 2, 3, 4, 6, 8, 12, 16, 24, ...):
    few distinct shapes to compile, at most a third of a batch wasted on inert rows."""
    p = _pow2(n)
    return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


# --------------------------------------------------------------------------------------------
# Residents, events
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Resident:
    """A served card: its program, its flat leaves, and weight ``versions`` by versioned name (a
    component's name, or, for a component in ``experts`` (stacked component -> expert names),
    each expert's name)."""

    card: Card
    program: Program
    treedef: Any
    leaves: list
    versions: dict[str, int]
    experts: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, card: Card, program: Program, versions: dict[str, int], experts: dict[str, tuple[str, ...]]) -> "_Resident":
        leaves, treedef = jax.tree.flatten(card)
        return cls(card, program, treedef, leaves, versions, experts)

    def version(self, component: str) -> int:
        """The weight version keying ``component``'s cache entries (a stacked one: its experts' sum,
        which every expert publish raises)."""
        if component in self.experts:
            return sum(self.versions[e] for e in self.experts[component])
        return self.versions[component]

    def owners(self) -> dict[str, tuple[str, int]]:
        """Expert name -> (its stacked component, its index on the expert axis)."""
        return {e: (c, i) for c, names in self.experts.items() for i, e in enumerate(names)}


@dataclasses.dataclass(frozen=True, eq=False)
class _Publish:
    """A checked publish: whole ``components`` (name -> module), expert ``slices`` (stacked component
    -> {index: module of one expert}) and the versioned names it ``bumps``."""

    components: dict[str, Any]
    slices: dict[str, dict[int, Any]]
    bumps: tuple[str, ...]

    @property
    def touched(self) -> set[str]:
        """The components whose weights (hence cache entries) it changes."""
        return set(self.components) | set(self.slices)

    def apply(self, card: Card) -> Card:
        """``card`` with the publish applied (slices written into the stacked components of ``card``)."""
        new = dict(self.components)
        for name, slices in self.slices.items():
            rows = sorted(slices)
            new[name] = _set_rows(card[name], jnp.asarray(rows, jnp.int32), tuple(slices[i] for i in rows))
        return card.replace(**new) if new else card


@jax.jit
def _set_rows(stacked, rows, experts):
    """``stacked`` with expert rows ``rows`` replaced by the one-expert modules ``experts`` (in that order)."""
    values = jax.tree.map(lambda *xs: jnp.stack(xs), *experts)
    return jax.tree.map(lambda s, v: s.at[rows].set(v), stacked, values)


@dataclasses.dataclass(eq=False)
class StepEvent:
    """One loop step of one request, as ``on_step`` sees it.

    ``index``: the request's position in ``run_many``; ``request``: the card request stepping
    (a workflow's stage request for workflow requests); ``stage``: the stage path (``"i2v"``,
    ``"base/t2i"``; ``""`` for a plain card request); ``loop``: the loop id; ``step`` of
    ``num_steps`` steps are done; ``tick``: the engine's tick counter of this ``run_many`` call
    (requests stepped in one batched call share a tick). ``latents`` is the request's current
    loop-state latents ``(T, h, w, C)`` (sliced on first access only).
    """

    index: int
    request: Request
    stage: str
    loop: str
    step: int
    num_steps: int
    tick: int
    _latents: Callable[[], jax.Array]

    @property
    def latents(self) -> jax.Array:
        return self._latents()


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


class Engine:
    """Serves registered cards (through their programs) and workflows, by id.

    Arguments:
      max_batch: the most requests one batched step carries (``mode="batched"``).
      cache: the feature cache (a fresh ``FeatureCache`` by default).
    """

    def __init__(self, *, max_batch: int = 64, cache: FeatureCache | None = None):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch <= 0:
            raise ValueError(f"max_batch must be a positive int (got {max_batch!r})")
        self.max_batch = max_batch
        self.cache = FeatureCache() if cache is None else cache
        self._cards: dict[str, _Resident] = {}
        self._workflows = WorkflowRegistry()
        self._busy = False
        self._lock = threading.RLock()  # guards _busy and _swaps: publish may come from another thread
        self._swaps: list[tuple[str, _Publish]] = []  # deferred publishes, in order

    # ---- registry -------------------------------------------------------------------------

    @classmethod
    def default(cls, **kwargs) -> "Engine":
        """An engine serving every bundled card (``jp.cards.available()``) and every bundled
        workflow whose cards are bundled (``image_video.t2i_i2v``, its extended variant)."""
        from jaxpipe import cards
        from jaxpipe import workflow as workflows

        engine = cls(**kwargs)
        for model_id in cards.available():
            engine.register(cards.load(model_id))
        for wf in workflows.bundled():
            if all(engine.serves(m) for m in wf.requires):
                engine.register_workflow(wf)
        return engine

    def register(self, card: Card, program: Program | None = None, *, replace: bool = False) -> None:
        """Serve ``card`` under its model id with ``program`` (default: its family's ``program()``).

        Replacing a resident card (``replace=True``) bumps every component's (and expert's) weight
        version and drops its cache entries. Raises ``EngineError`` / ``ProgramError`` before
        changing anything.
        """
        self._idle("register")
        if not isinstance(card, Card):
            raise TypeError(f"register takes a Card (got {type(card).__name__})")
        model_id = card.model_id
        if model_id in self._workflows:
            raise EngineError(f"card id {model_id!r} collides with a registered workflow of the same id")
        if model_id in self._cards and not replace:
            raise EngineError(f"card {model_id!r} is already registered (pass replace=True to replace it)")
        program = _default_program(card) if program is None else program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a Program (got {type(program).__name__})")
        program.check(card)
        experts = _stacked(card)
        old = self._cards.get(model_id)
        names = [n for c in card.components for n in experts.get(c, (c,))]
        versions = {name: (old.versions.get(name, -1) + 1 if old else 0) for name in names}
        resident = _Resident.of(card, program, versions, experts)
        if old is not None:
            self.cache.invalidate(model_id)
        self._cards[model_id] = resident

    def register_workflow(self, workflow: Workflow, *, replace: bool = False) -> None:
        """Serve ``workflow`` under its dotted id. Rejects (``WorkflowError``, nothing changed) an id that
        collides with a card or workflow, a stage model that is not served, and a cycle."""
        self._idle("register_workflow")
        self._workflows.add(workflow, self._cards, replace=replace)

    def unregister(self, model_id: str) -> None:
        """Stop serving a card or workflow (refused while a registered workflow requires it)."""
        self._idle("unregister")
        self._lookup(model_id)
        users = self._workflows.dependents(model_id)
        if users:
            raise EngineError(f"cannot unregister {model_id!r}: workflows {users} require it")
        if model_id in self._cards:
            del self._cards[model_id]
            self.cache.invalidate(model_id)
        else:
            self._workflows.remove(model_id)

    def serves(self, model_id: str) -> bool:
        """Whether ``model_id`` names a registered card or workflow."""
        return model_id in self._cards or model_id in self._workflows

    def models(self) -> list[str]:
        """Every id the engine serves, cards and workflows, sorted."""
        return sorted([*self._cards, *self._workflows.ids()])

    def cards(self) -> list[str]:
        return sorted(self._cards)

    def workflows(self) -> list[str]:
        return self._workflows.ids()

    def card(self, model_id: str, *, pending: bool = False) -> Card:
        """The resident card ``model_id``. During ``run_many`` a deferred publish shows only once
        it applies; ``pending=True`` gives the card as it will be after the deferred publishes."""
        with self._lock:
            card = self._resident(model_id).card
            if pending:
                for m, update in self._swaps:
                    if m == model_id:
                        card = update.apply(card)
            return card

    def program(self, model_id: str) -> Program:
        return self._resident(model_id).program

    def workflow(self, model_id: str) -> Workflow:
        self._lookup(model_id)
        if model_id not in self._workflows:
            raise EngineError(f"{model_id!r} is a card, not a workflow")
        return self._workflows[model_id]

    def versions(self, model_id: str) -> dict[str, int]:
        """Per-component weight versions of the resident card ``model_id``; a stacked component
        (``experts``) reports one version per expert (``refiner_0``, ...) instead of its own."""
        return dict(self._resident(model_id).versions)

    def experts(self, model_id: str) -> dict[str, tuple[str, ...]]:
        """The resident card's stacked components -> their experts' names in axis order (``{}``: none)."""
        return dict(self._resident(model_id).experts)

    def publish(self, model_id: str, components: Mapping[str, Any]) -> dict[str, int]:
        """Swap some components of a resident card (e.g. freshly trained weights): drain, then swap.

        ``components`` maps component names to modules with the resident ones' layout (same tree
        structure and static configuration, same leaf shapes and dtypes); they are checked first
        and anything else raises ``EngineError`` (``UnknownComponentError`` for a name the card
        lacks) with nothing changed. The swap bumps only those components' weight versions and
        drops only their feature-cache entries (e.g. a new transformer keeps the text encoder's
        version and its cached encodings).

        An expert of a stacked component (``experts``) is published by its own name with a module
        of one expert's layout (``{"refiner_2": lm}``): only that slice is written and only that
        expert's version moves; the stacked component's cache entries are dropped. Publishing the
        stacked component by its name bumps every expert; naming both it and one of its experts
        in one publish is refused.

        Between runs the swap applies at once. While ``run_many`` is in flight (called from an
        ``on_step`` or ``cancel`` callback, or from another thread) it is **deferred** for that
        card: requests already started on the card (prepared, stepping, or waiting for a batch
        slot) finish on the old weights, bit for bit as without the publish; the card's requests
        not started yet (later requests, later workflow stages) wait until the card has drained,
        then the swap applies and they start on the new weights. Other cards keep running.
        Until the swap, ``versions`` and ``card`` report the old ones and ``pending_publishes``
        lists it; swaps still pending when ``run_many`` returns (or raises) apply then.

        Returns the card's versions after this publish: the new ones, or, when deferred, the ones
        the swap will produce (counting earlier pending publishes of the card).
        """
        with self._lock:
            resident = self._resident(model_id)
            update = _checked_components(resident, components)
            if not self._busy:
                if update.bumps:
                    self._swap(model_id, update)
                return dict(self._cards[model_id].versions)
            if update.bumps:
                self._swaps.append((model_id, update))
            return self._projected(model_id)

    def pending_publishes(self) -> dict[str, dict[str, int]]:
        """Publishes deferred until their card drains (only while ``run_many`` is in flight):
        card id -> the versions the card will have once they apply. Empty when none."""
        with self._lock:
            return {m: self._projected(m) for m in dict.fromkeys(m for m, _ in self._swaps)}

    def _projected(self, model_id: str) -> dict[str, int]:
        versions = dict(self._cards[model_id].versions)
        for m, update in self._swaps:
            if m == model_id:
                versions.update({n: versions[n] + 1 for n in update.bumps})
        return versions

    def _swap(self, model_id: str, update: _Publish) -> None:
        resident = self._cards[model_id]
        card = update.apply(resident.card)
        versions = {n: v + (n in update.bumps) for n, v in resident.versions.items()}
        self.cache.invalidate(model_id, update.touched)
        self._cards[model_id] = _Resident.of(card, resident.program, versions, resident.experts)

    def _apply_swaps(self, in_flight: Callable[[str], bool] = lambda model_id: False) -> None:
        """Apply the deferred publishes, in publish order, of every card not ``in_flight``."""
        with self._lock:
            keep = []
            for model_id, update in self._swaps:
                if in_flight(model_id):
                    keep.append((model_id, update))
                else:
                    self._swap(model_id, update)
            self._swaps = keep

    def _deferred(self) -> set[str]:
        """Cards with a deferred publish: their requests must not start yet."""
        with self._lock:
            return {m for m, _ in self._swaps}

    def _lookup(self, model_id: str) -> None:
        if not self.serves(model_id):
            raise EngineError(f"unknown model {model_id!r}; this engine serves {self.models()}")

    def _resident(self, model_id: str) -> _Resident:
        self._lookup(model_id)
        if model_id not in self._cards:
            raise EngineError(f"{model_id!r} is a workflow, not a card")
        return self._cards[model_id]

    def _idle(self, what: str) -> None:
        if self._busy:
            raise EngineError(f"{what}: the engine is running requests; call it between run/run_many calls")

    # ---- running ----------------------------------------------------------------------------

    def check(self, request: Request) -> Bound | None:
        """Validate ``request`` (raising a clear error) without running it: the card's ``Bound``,
        or ``None`` for a workflow request (checked by the workflow's own ``check``)."""
        if not isinstance(request, Request):
            raise TypeError(f"expected a jaxpipe Request (got {type(request).__name__})")
        self._lookup(request.model)
        if request.model in self._workflows:
            workflow = self._workflows[request.model]
            if workflow.check is not None:
                workflow.check(request)
            return None
        resident = self._cards[request.model]
        return resident.program.bind(resident.card, request)

    def run(
        self,
        request: Request,
        *,
        on_step: Callable[[StepEvent], bool | None] | None = None,
        cancel: Any = None,
    ) -> Output:
        """Run one request to completion: its ``Output`` (artifacts by name)."""
        return self.run_many([request], mode="serial", on_step=on_step, cancel=cancel)[0]

    def run_many(
        self,
        requests: Sequence[Request],
        mode: str = "serial",
        *,
        on_step: Callable[[StepEvent], bool | None] | None = None,
        cancel: Any = None,
    ) -> list[Output]:
        """Run ``requests``: their ``Output``s in request order (see the module docstring for modes).

        Every request is validated first; nothing runs and nothing changes if any is bad.
        """
        if mode not in MODES:
            raise EngineError(f"mode must be one of {MODES} (got {mode!r})")
        if isinstance(requests, Request):
            raise TypeError("run_many takes a sequence of requests; use run(request) for one")
        requests = list(requests)
        bounds = [self.check(r) for r in requests]
        if cancel is not None and not (callable(cancel) or hasattr(cancel, "is_set")):
            raise TypeError("cancel must be a threading.Event-like object (is_set()) or a callable returning bool")
        with self._lock:
            self._idle("run_many")
            self._busy = True
        try:
            scheduler = _Scheduler(self, mode, on_step, cancel)
            if mode == "serial":
                for i, (request, bound) in enumerate(zip(requests, bounds)):
                    scheduler.run([(i, request, bound)])
            else:
                scheduler.run(list(zip(range(len(requests)), requests, bounds)))
            return [scheduler.outputs[i] for i in range(len(requests))]
        finally:
            with self._lock:
                self._busy = False
                self._apply_swaps()  # nothing is in flight any more

    # ---- feature cache ------------------------------------------------------------------------

    def _resolve_cached(self, resident: _Resident, bound: Bound) -> dict[str, Any]:
        """The bound slots plus the outputs of the program's cached nodes, looked up per request."""
        slots = dict(bound.slots)
        model_id = resident.card.model_id
        for node in resident.program.cached_nodes:
            reads = {r: slots[r] for r in node.reads}
            key = CacheKey(model_id, node.component, resident.version(node.component), content_hash(node.name, reads))
            value = self.cache.get(key)
            if value is None:
                value = _node(resident.program, node.name, resident.treedef, resident.leaves, reads)
                self.cache.put(key, value)
            slots.update(value)
        return slots


def _checked_components(resident: _Resident, components: Mapping[str, Any]) -> _Publish:
    """``components`` checked against the resident card's (names, then each one's layout; an expert
    against one slice of its stacked component), as a snapshot: a shallow pytree copy, so later
    in-place changes to the caller's modules cannot leak into a deferred swap. Raises
    ``EngineError`` naming the first problem."""
    model_id = resident.card.model_id
    if not isinstance(components, Mapping):
        raise TypeError(f"publish takes a mapping component name -> module (got {type(components).__name__})")
    have, owners = resident.card.components, resident.owners()
    unknown = sorted(str(n) for n in components if n not in have and n not in owners)
    if unknown:
        experts = "".join(f"; stacked {c!r} has experts {list(e)}" for c, e in resident.experts.items())
        raise UnknownComponentError(f"publish: card {model_id!r} has no component(s) {unknown}; it has {sorted(have)}{experts}")
    whole, slices, bumps = {}, {}, []
    for name, new in components.items():
        if name in have:
            _check_layout(f"publish: card {model_id!r}, component {name!r}", have[name], new)
            whole[name] = jax.tree.map(lambda x: x, new)
            bumps.extend(resident.experts.get(name, (name,)))
        else:
            stacked, index = owners[name]
            where = f"publish: card {model_id!r}, expert {name!r} (slice {index} of stacked {stacked!r})"
            _check_layout(where, _expert_layout(have[stacked]), new)
            slices.setdefault(stacked, {})[index] = jax.tree.map(lambda x: x, new)
            bumps.append(name)
    both = sorted(set(whole) & set(slices))
    if both:
        raise EngineError(
            f"publish: card {model_id!r}: {both[0]!r} is published both whole and by expert "
            f"({sorted(n for n in components if n in owners and owners[n][0] == both[0])}); publish one or the other"
        )
    resident.program.check(resident.card.replace(**whole))
    return _Publish(whole, slices, tuple(bumps))


def _expert_layout(stacked: Any) -> Any:
    """One expert of a stacked module, abstractly (leaves ``ShapeDtypeStruct`` without the expert axis)."""
    def row(x):
        x = x if hasattr(x, "dtype") else np.asarray(x)
        return jax.ShapeDtypeStruct(tuple(x.shape)[1:], x.dtype)

    return jax.tree.map(row, stacked)


def _stacked(card: Card) -> dict[str, tuple[str, ...]]:
    """``jaxpipe.cards.stacked_components(card)``, checked: expert names unique and clashing with no
    component, every leaf of a stacked component with a leading axis of one row per expert."""
    from jaxpipe.cards import stacked_components

    experts = stacked_components(card)
    names = [e for es in experts.values() for e in es]
    clash = sorted({e for e in names if names.count(e) > 1 or e in card.components})
    if clash:
        raise EngineError(f"card {card.model_id!r}: expert names {clash} are repeated or name a component")
    for component, es in experts.items():
        if component not in card.components:
            raise EngineError(f"card {card.model_id!r}: stacked component {component!r} is missing")
        bad = [np.shape(x) for x in jax.tree.leaves(card[component]) if np.shape(x)[:1] != (len(es),)]
        if bad:
            raise EngineError(
                f"card {card.model_id!r}: stacked component {component!r} has {len(es)} experts, but leaves "
                f"of shape {bad[0]} have no leading expert axis of that size"
            )
    return experts


def _check_layout(where: str, old: Any, new: Any) -> None:
    """Raise ``EngineError`` unless ``new`` has ``old``'s type, leaf paths, shapes, dtypes and static settings."""
    if type(new) is not type(old):
        raise EngineError(f"{where}: expected a {type(old).__name__} like the resident one (got {type(new).__name__})")
    old_leaves, old_def = jax.tree_util.tree_flatten_with_path(old)
    new_leaves, new_def = jax.tree_util.tree_flatten_with_path(new)
    old_paths = [jax.tree_util.keystr(p) for p, _ in old_leaves]
    new_paths = [jax.tree_util.keystr(p) for p, _ in new_leaves]
    if old_paths != new_paths:
        missing = sorted(set(old_paths) - set(new_paths))[:3]
        extra = sorted(set(new_paths) - set(old_paths))[:3]
        raise EngineError(
            f"{where}: tree structure differs from the resident one (missing leaves {missing}, extra leaves {extra})"
        )
    for path, (_, a), (_, b) in zip(old_paths, old_leaves, new_leaves):
        old_sig, new_sig = _signature(a), _signature(b)
        if old_sig != new_sig:
            raise EngineError(
                f"{where}: leaf {path} has shape {new_sig[0]} and dtype {new_sig[1]}; "
                f"the resident one has shape {old_sig[0]} and dtype {old_sig[1]}"
            )
    if old_def != new_def:
        raise EngineError(f"{where}: static settings (module configuration) differ from the resident one's")


def _signature(leaf: Any) -> tuple[tuple[int, ...], str]:
    if not hasattr(leaf, "dtype"):
        leaf = np.asarray(leaf)
    return tuple(leaf.shape), str(leaf.dtype)


def _default_program(card: Card) -> Program:
    from jaxpipe.programs import default_program

    return default_program(card)


# --------------------------------------------------------------------------------------------
# The scheduler of one run_many call
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Flow:
    """A workflow request in flight: its state and the stage it waits on."""

    workflow: Workflow
    request: Request
    root: int
    parent: "_Flow | None"
    path: str
    ancestry: tuple[str, ...]
    state: dict
    stage: int = 0


@dataclasses.dataclass(eq=False)
class _Job:
    """A card request in flight."""

    root: int
    request: Request
    resident: _Resident
    bound: Bound
    flow: _Flow | None
    path: str
    slots: dict | None = None
    step: int = 0
    total: int = 0
    cancelled_at: tuple[int, int] | None = None

    @property
    def finished(self) -> bool:
        return self.cancelled_at is not None or self.step >= self.total


@dataclasses.dataclass(eq=False)
class _Cohort:
    """Jobs prepared together (same card, program, settings up to step counts, and shapes): ``size``
    rows, the first ``len(jobs)`` real. Holds their slots and loop state between loops.
    ``settings`` are the cohort's (in batched mode each loop's config has ``num_steps = width``
    and every row gets its own schedule); each job keeps its own in ``job.bound.settings``."""

    resident: _Resident
    settings: Any
    width: int | None
    jobs: list[_Job]
    size: int
    loop: int = 0
    slots: Any = None
    state: Any = None
    queued: int = 0  # rows admitted into / waiting for a group and not yet retired

    @property
    def program(self) -> Program:
        return self.resident.program

    @property
    def node(self):
        return self.program.loops[self.loop]

    @property
    def spec(self):
        return self.resident.card.spec.loop(self.node.loop)

    @property
    def config(self):
        return dict(self.settings)[self.node.loop]

    @property
    def kind(self) -> str:
        return self.spec.kind


@dataclasses.dataclass(eq=False)
class _Group:
    """Slots of one batched step: cohorts' rows with equal card, loop, batch key and row shapes."""

    kind: str
    loop: str
    config: Any
    resident: _Resident
    capacity: int
    batch: Any
    slots: list  # slot -> (cohort, row) or None
    queue: deque

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.slots)


class _Scheduler:
    def __init__(self, engine: Engine, mode: str, on_step, cancel):
        self.engine = engine
        self.mode = mode
        self.on_step = on_step
        self.cancel = cancel
        self.hooks = on_step is not None or cancel is not None
        self.outputs: dict[int, Output] = {}
        self.pending: list[_Job] = []
        self.cohorts: list[_Cohort] = []
        self.groups: dict[Any, _Group] = {}
        self.flows: list[_Flow] = []
        self.tick = 0

    # ---- the main loop -------------------------------------------------------------------

    def run(self, roots: Iterable[tuple[int, Request, Bound | None]]) -> None:
        for index, request, bound in roots:
            self._spawn(index, request, bound, flow=None, path="")
        while self.pending or self.cohorts:
            if self._cancelled():
                self._cancel_all()
                break
            self.engine._apply_swaps(self._in_flight)
            self._start_pending()
            if not self.cohorts:
                continue
            self.tick += 1
            if self.mode == "batched":
                self._tick_batched()
            else:
                self._tick_each()
            self._settle()
        while self.flows:  # only left when everything was cancelled
            self._deliver_flow_cancel(self.flows[0])

    def _cancelled(self) -> bool:
        if self.cancel is None:
            return False
        return bool(self.cancel.is_set() if hasattr(self.cancel, "is_set") else self.cancel())

    # ---- spawning requests and threading workflows ----------------------------------------

    def _spawn(self, root: int, request: Request, bound: Bound | None, flow: _Flow | None, path: str) -> None:
        engine = self.engine
        if request.model in engine._workflows:
            workflow = engine._workflows[request.model]
            ancestry = (flow.ancestry if flow else ()) + (workflow.id,)
            if workflow.id in ancestry[:-1]:
                raise WorkflowError(f"workflow cycle at run time: {' -> '.join(ancestry)}")
            if len(ancestry) > 64:
                raise WorkflowError(f"workflows nested deeper than 64 levels: {' -> '.join(ancestry[:4])} -> ...")
            child = _Flow(workflow, request, root, flow, path, ancestry, initial_state(request))
            self.flows.append(child)
            self._next_stage(child)
            return
        if bound is None:
            bound = engine.check(request)
        resident = engine._cards[request.model]
        self.pending.append(_Job(root, request, resident, bound, flow, path))

    def _next_stage(self, flow: _Flow) -> None:
        stage = flow.workflow.stages[flow.stage]
        request = flow.workflow.build(stage, flow.state)
        if not self.engine.serves(request.model):
            raise WorkflowError(
                f"workflow {flow.workflow.id!r}, stage {stage.label!r}: {request.model!r} is no longer served"
            )
        path = f"{flow.path}/{stage.label}" if flow.path else stage.label
        self._spawn(flow.root, request, None, flow, path)

    def _deliver(self, job_or_flow, output: Output) -> None:
        flow = job_or_flow.flow if isinstance(job_or_flow, _Job) else job_or_flow.parent
        root = job_or_flow.root
        if flow is None:
            self.outputs[root] = output
            return
        if output.cancelled:
            self._deliver_flow_cancel(flow, output.cancelled_at)
            return
        stage = flow.workflow.stages[flow.stage]
        publish(flow.state, stage.label, output)
        flow.stage += 1
        if flow.stage < len(flow.workflow.stages):
            self._next_stage(flow)
            return
        self.flows.remove(flow)
        artifacts = flow.workflow.finish(flow.state, output)
        self._deliver(flow, Output(flow.workflow.id, artifacts, flow.request))

    def _deliver_flow_cancel(self, flow: _Flow, at: tuple[int, int] | None = None) -> None:
        if flow in self.flows:
            self.flows.remove(flow)
        self._deliver(flow, Output(flow.workflow.id, {}, flow.request, cancelled_at=at or (0, 0)))

    def _finish_job(self, job: _Job, artifacts: Mapping[str, Any] | None) -> None:
        if job.cancelled_at is not None:
            output = Output(job.request.model, {}, job.request, cancelled_at=job.cancelled_at)
        else:
            output = Output(job.request.model, {**artifacts, **job.bound.artifacts}, job.request)
        self._deliver(job, output)

    # ---- preparing cohorts -------------------------------------------------------------------

    def _in_flight(self, model_id: str) -> bool:
        """Whether a started request of card ``model_id`` is unfinished (a deferred publish waits for it)."""
        return any(cohort.resident.card.model_id == model_id for cohort in self.cohorts)

    def _start_pending(self) -> None:
        """Start every pending job whose card has no deferred publish (those wait for the swap)."""
        waiting = self.engine._deferred()
        jobs = [job for job in self.pending if job.request.model not in waiting]
        self.pending = [job for job in self.pending if job.request.model in waiting]
        for job in jobs:
            # the card as it is now (a swap may have applied since the job was spawned); publish
            # keeps every static setting, so the job's Bound is still valid
            job.resident = self.engine._cards[job.request.model]
            job.slots = self.engine._resolve_cached(job.resident, job.bound)
        if self.mode == "serial" and not self.hooks:
            for job in jobs:
                r = job.resident
                out = _run_whole(r.program, job.bound.settings, r.treedef, r.leaves, (job.slots,))[0]
                self._finish_job(job, out)
            return
        if self.mode != "batched":
            for job in jobs:
                self._start_cohort(_Cohort(job.resident, job.bound.settings, None, [job], 1))
            return
        buckets: dict[Any, list[_Job]] = {}
        for job in jobs:
            width = self._width(job)
            shapes = tuple((k, tuple(np.shape(v))[1:], str(getattr(v, "dtype", None) or np.asarray(v).dtype))
                           for k, v in sorted(job.slots.items()))
            key = (id(job.resident), self._batch_settings(job, width), width, shapes)
            buckets.setdefault(key, []).append(job)
        for (_, settings, width, _), members in buckets.items():
            for lo in range(0, len(members), self.engine.max_batch):
                chunk = members[lo : lo + self.engine.max_batch]
                self._start_cohort(_Cohort(chunk[0].resident, settings, width, chunk, _bucket(len(chunk))))

    def _width(self, job: _Job) -> int | None:
        """The schedule width of the job's batched loops: a power of two >= every loop's steps (min ``MIN_WIDTH``)."""
        steps = [self._driver(job, node).num_steps(self._config(job, node)) for node in job.resident.program.loops]
        return max(MIN_WIDTH, _pow2(max(steps))) if steps else None

    def _batch_settings(self, job: _Job, width: int | None):
        """The job's settings with every loop config widened to ``width`` steps (``LoopDriver.batch_config``)."""
        loops = {node.loop: node for node in job.resident.program.loops}
        return tuple(
            (key, self._driver(job, loops[key]).batch_config(config, width) if key in loops else config)
            for key, config in job.bound.settings
        )

    @staticmethod
    def _driver(job: _Job, node):
        return programs.driver(job.resident.card.spec.loop(node.loop).kind)

    @staticmethod
    def _config(job: _Job, node):
        return dict(job.bound.settings)[node.loop]

    def _schedule(self, cohort: _Cohort, index: int):
        """Per-row schedules ``(size, ...)`` for loop ``index`` (batched cohorts), else ``None``."""
        if cohort.width is None or index >= len(cohort.program.loops):
            return None
        node = cohort.program.loops[index]
        rows = [self._driver(job, node).schedule(self._config(job, node), cohort.width) for job in cohort.jobs]
        rows += [rows[-1]] * (cohort.size - len(rows))
        return np.stack(rows)

    def _start_cohort(self, cohort: _Cohort) -> None:
        r = cohort.resident
        rows = [job.slots for job in cohort.jobs]
        rows += [rows[-1]] * (cohort.size - len(rows))  # padding rows: copies, dropped at the end
        for job in cohort.jobs:
            job.slots = None
        schedule = self._schedule(cohort, 0)
        slots, state = _enter(r.program, 0, cohort.settings, r.treedef, r.leaves, tuple(rows), None, schedule)
        self._after_enter(cohort, slots, state)

    def _after_enter(self, cohort: _Cohort, slots, state) -> None:
        if state is None:  # the program is done: slots holds per-row artifacts
            for job, artifacts in zip(cohort.jobs, slots):
                self._finish_job(job, artifacts)
            if cohort in self.cohorts:
                self.cohorts.remove(cohort)
            return
        cohort.slots, cohort.state = slots, state
        for job in cohort.jobs:
            job.step, job.total = 0, self._driver(job, cohort.node).num_steps(self._config(job, cohort.node))
        if cohort not in self.cohorts:
            self.cohorts.append(cohort)
        if self.mode == "batched":
            self._enqueue(cohort)

    # ---- stepping ---------------------------------------------------------------------------

    def _event(self, job: _Job, loop: str, latents: Callable[[], jax.Array]) -> None:
        if self.on_step is None:
            return
        event = StepEvent(job.root, job.request, job.path, loop, job.step, job.total, self.tick, latents)
        if self.on_step(event) is False and not job.finished:
            job.cancelled_at = (job.step, job.total)

    def _tick_each(self) -> None:
        """Interleaved (or serial with hooks): every unfinished request advances one step."""
        for cohort in self.cohorts:
            job = cohort.jobs[0]
            if job.finished:
                continue
            r = cohort.resident
            cohort.state = _step(cohort.kind, cohort.node.loop, cohort.config, r.treedef, r.leaves, cohort.state)
            job.step += 1
            state, drive = cohort.state, programs.driver(cohort.kind)
            self._event(job, cohort.node.loop, lambda: drive.latents(state)[0])

    def _enqueue(self, cohort: _Cohort) -> None:
        drive = programs.driver(cohort.kind)
        shapes = tuple((a.shape[1:], str(a.dtype)) for a in jax.tree.leaves(cohort.state))
        key = (id(cohort.resident), cohort.node.loop, drive.batch_key(cohort.config), shapes)
        group = self.groups.get(key)
        rows = [(cohort, i) for i, job in enumerate(cohort.jobs) if job.cancelled_at is None]
        if group is None:
            capacity = min(self.engine.max_batch, _bucket(len(rows)))
            batch = _empty(cohort.kind, capacity, cohort.state)
            group = _Group(cohort.kind, cohort.node.loop, drive.batch_key(cohort.config), cohort.resident,
                           capacity, batch, [None] * capacity, deque())
            self.groups[key] = group
        group.queue.extend(rows)
        cohort.queued += len(rows)

    def _tick_batched(self) -> None:
        for group in self.groups.values():
            self._admit(group)
        live = [g for g in self.groups.values() if g.active]
        if not live:
            return
        remaining = [job.total - job.step for g in live for c, i in filter(None, g.slots) for job in [c.jobs[i]]]
        count = 1 if self.on_step is not None or self.cancel is not None else max(1, min(remaining))
        for group in live:
            r = group.resident
            group.batch = _steps(group.kind, group.loop, group.config, r.treedef, r.leaves, group.batch, count)
            batch, drive = group.batch, programs.driver(group.kind)
            for slot, entry in enumerate(group.slots):
                if entry is None:
                    continue
                cohort, row = entry
                job = cohort.jobs[row]
                job.step += count
                self._event(job, group.loop, lambda slot=slot: drive.latents(batch)[slot])
            self._retire(group)
        for key in [k for k, g in self.groups.items() if not g.active and not g.queue]:
            del self.groups[key]

    def _admit(self, group: _Group) -> None:
        want = min(self.engine.max_batch, _bucket(group.active + len(group.queue)))
        if want != group.capacity:
            self._resize(group, want)
        free = [s for s, entry in enumerate(group.slots) if entry is None]
        admitted: dict[int, tuple[_Cohort, list, list]] = {}
        while free and group.queue:
            cohort, row = group.queue.popleft()
            if cohort.jobs[row].cancelled_at is not None:
                cohort.queued -= 1
                continue
            slot = free.pop(0)
            group.slots[slot] = (cohort, row)
            admitted.setdefault(id(cohort), (cohort, [], []))
            admitted[id(cohort)][1].append(slot)
            admitted[id(cohort)][2].append(row)
        for cohort, slots, rows in admitted.values():
            s, r = _padded(slots, rows, group.capacity, cohort.size)
            group.batch = _admit(group.kind, group.batch, cohort.state, s, r)

    def _resize(self, group: _Group, capacity: int) -> None:
        if capacity == group.capacity:
            return
        occupied = [s for s, entry in enumerate(group.slots) if entry is not None]
        keep = np.full((capacity,), -1, np.int32)
        keep[: len(occupied)] = occupied
        group.batch = _resize(group.kind, capacity, group.batch, keep)
        group.slots = [group.slots[s] for s in occupied] + [None] * (capacity - len(occupied))
        group.capacity = capacity

    def _retire(self, group: _Group) -> None:
        leaving: dict[int, tuple[_Cohort, list, list]] = {}
        for slot, entry in enumerate(group.slots):
            if entry is None:
                continue
            cohort, row = entry
            if cohort.jobs[row].finished:
                group.slots[slot] = None
                leaving.setdefault(id(cohort), (cohort, [], []))
                leaving[id(cohort)][1].append(slot)
                leaving[id(cohort)][2].append(row)
        for cohort, slots, rows in leaving.values():
            s, r = _padded(slots, rows, group.capacity, cohort.size)
            group.batch, cohort.state = _retire(group.kind, group.batch, cohort.state, s, r)
            cohort.queued -= len(rows)

    # ---- cohorts leaving a loop ----------------------------------------------------------------

    def _settle(self) -> None:
        for cohort in list(self.cohorts):
            if not all(job.finished for job in cohort.jobs) or cohort.queued:
                continue
            live = [job for job in cohort.jobs if job.cancelled_at is None]
            if not live:
                self.cohorts.remove(cohort)
                for job in cohort.jobs:
                    self._finish_job(job, None)
                continue
            r = cohort.resident
            cohort.loop += 1
            slots, state = _enter(r.program, cohort.loop, cohort.settings, r.treedef, r.leaves,
                                  cohort.slots, cohort.state, self._schedule(cohort, cohort.loop))
            if state is None:
                self.cohorts.remove(cohort)
                for job, artifacts in zip(cohort.jobs, slots):
                    self._finish_job(job, None if job.cancelled_at else artifacts)
            else:
                self._after_enter(cohort, slots, state)

    def _cancel_all(self) -> None:
        for job in self.pending:
            job.cancelled_at = (0, 0)
            self._finish_job(job, None)
        self.pending = []
        cohorts, self.cohorts = self.cohorts, []
        for cohort in cohorts:
            for job in cohort.jobs:
                if job.cancelled_at is None:
                    job.cancelled_at = (job.step, job.total)
                self._finish_job(job, None)
        self.groups = {}


def _padded(slots: list[int], rows: list[int], capacity: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays of fixed length ``capacity`` (one compile per shape); padding entries point
    out of range and are dropped by the scatters."""
    s = np.full((capacity,), capacity, np.int32)
    r = np.full((capacity,), size, np.int32)
    s[: len(slots)] = slots
    r[: len(rows)] = rows
    return s, r
