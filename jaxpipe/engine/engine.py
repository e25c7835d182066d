"""The engine: resident cards and workflows by id, and the loop that serves requests.

``Engine`` keeps each registered card resident with its program and per-component weight
versions, keeps the registered workflows, and runs requests:

* ``run(request)`` / ``run_many(requests, mode="serial")``: each request to completion, one at a
  time: its cached nodes are looked up in the feature cache, then the engine enters the program,
  drives each loop's jitted pure ``step`` and finishes it.
* ``mode="interleaved"``: every request advances one loop step per tick, through the same jitted
  functions on the same shapes as serial, hence the same bits (C1 by construction,
  ``parity.interleave_gate``). The fused path (``jp.generate``, one jitted ``lax.scan`` per loop)
  is faster for a batch but compiled differently: it agrees with the engine within the C3
  tolerance, not bit for bit.
* ``mode="batched"``: requests on the same card and loop with compatible settings and shapes
  advance together as ONE jitted batched step, even at different step indices (continuous
  batching). Requests whose settings differ only in ``num_steps`` are prepared together (cached
  text, image encoding, loop start) as one **cohort**, each row with its own sigma schedule
  padded with zeros to a common width (see ``loops.denoise.Driver``). A **group** holds
  ``capacity`` slots (2^k or 3·2^k, up to ``max_batch``); rows are admitted into free slots,
  step together, and are retired after their own last step, when waiting rows take their slots;
  the capacity grows with the number of rows, and shrinks with them only to a capacity whose
  batched step this engine has compiled or wanted in an earlier call (a cold call never pays a
  compile to save compute; a repeated workload pays it once; one gather when it changes). Between scheduling
  events (a request finishing) the engine fuses the steps into one call. Finished cohorts are decoded together. Results match
  serial within a measured tolerance, not bit for bit (``parity.batch_invariance``, C3).

The request lifecycle: ``submit(request) -> Handle`` queues a request (validated at once) for the
engine's own ``mode``; each ``tick()`` (one thread drives it: a loop of yours, or the server's
front) lets new requests join the running work, advances every running request by one step (the
batched mode: one batched step per group, so a request submitted mid-run joins the next step's
batch), and finishes the ones done. A handle reports ``status``, ``progress``, ``result()``,
``events()`` (``for`` / ``async for``; with ``previews=True`` the latents and decoded images) and
``cancel()`` (its slot is freed at the next tick). A request whose own work raises fails alone,
on its handle. ``run`` / ``run_many`` are the same core on a scheduler of their own, ticked to the
end. Registering a replacement, publishing or unregistering while work is in flight drains the
affected card first (below); registering new ids applies at once.

Workflows run as a chain of stage requests through the same machinery, so in the interleaved
and batched modes the stages of many workflow requests interleave or batch with each other and
with plain card requests.

Optional hooks: ``on_step(event)`` is called after every loop step of every request (a
streaming preview: ``event.latents``); returning ``False`` cancels that request at this step
boundary. ``cancel`` (a ``threading.Event`` or a callable returning ``bool``) cancels every
unfinished request at the next step boundary. Cancelled requests get an ``Output`` with
``cancelled_at`` set; the engine stays usable.

Weight sync: ``publish(model_id, {name: module})`` swaps trained components into a resident card
and bumps only their weight versions, dropping only their feature-cache entries. While work is in
flight (``run_many``, or submitted requests; from a callback or another thread) it drains first: requests already started on
that card finish on the old weights, bit for bit as without the publish; its requests not yet
started wait until the card has drained, then the swap applies and they start on the new
weights; other cards keep running. The training side calls it through
``jaxpipe.training.weight_sync.publish`` (the engine never imports training).

Roles: ``add_role(model_id, role, components)`` serves a tracked copy of some of a card's
components (an EMA or a trainer's old policy, say) as its own card ``"<model_id>@<role>"``. A role
is published to like any card, but only within its scope, and its scoped components keep their
own weight versions; the components outside its scope follow the card (a publish of the card's
text encoder reaches its roles too, each draining on its own). Requests to ``"flux-t2i@old"``
render with the role's weights.

Stacked experts: a component stored stacked on a leading expert axis (declared by its card
family, see ``jaxpipe.cards.registry.stacked_components``; e.g. the ``multi-expert`` card's ``refiners``)
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
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxpipe.cache import CacheKey, FeatureCache, content_hash
from jaxpipe.card import Card
from jaxpipe.engine import batch as ops
from jaxpipe.engine.errors import EngineError, UnknownComponentError
from jaxpipe.engine.handle import Handle
from jaxpipe.engine.publish import Resident, checked, stacked
from jaxpipe.engine.scheduler import Load, Scheduler, StepEvent
from jaxpipe.program import Bound, Program, config_of
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow, WorkflowRegistry

__all__ = ["Engine", "MODES", "ROLE_SEP"]

MODES = ("serial", "interleaved", "batched")
ROLE_SEP = "@"
"""Separates a card's id from a role's name in the role's served id (``"flux-t2i@old"``)."""


class Engine:
    """Serves registered cards (through their programs) and workflows, by id.

    Arguments:
      max_batch: the most requests one batched step carries (``mode="batched"``).
      cache: the feature cache (a fresh ``FeatureCache`` by default).
      mode: how ``submit`` / ``tick`` serve (``MODES``; ``run_many`` takes its own).
    """

    def __init__(self, *, max_batch: int = 64, cache: FeatureCache | None = None, mode: str = "batched"):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch <= 0:
            raise ValueError(f"max_batch must be a positive int (got {max_batch!r})")
        if mode not in MODES:
            raise EngineError(f"mode must be one of {MODES} (got {mode!r})")
        self.max_batch = max_batch
        self.mode = mode
        self.cache = FeatureCache() if cache is None else cache
        self._cards: dict[str, Resident] = {}
        self._workflows = WorkflowRegistry()
        # guards the registry, _swaps and the schedulers' state: publish, register and submit may come from any thread
        self._lock = threading.RLock()
        self._swaps: list[tuple[str, Any]] = []  # deferred changes (Publish, _Replace, _Remove), in order
        self._roles: dict[str, dict[str, str]] = {}  # card id -> {role name: the role's served id}
        self._compiled: set = set()  # (batched group layout, capacity) pairs already compiled
        self._wanted: set = set()  # (batched group layout, capacity) pairs a group wanted to shrink to
        self._live = Scheduler(_Host(self), mode, cohort_rows=1)
        self._active: list[Scheduler] = [self._live]  # the live scheduler and those of run_many calls in flight

    # ---- registry -------------------------------------------------------------------------

    @classmethod
    def default(cls, **kwargs) -> Engine:
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

    def register(
        self, card: Card, program: Program | None = None, *, model_id: str | None = None, replace: bool = False
    ) -> None:
        """Serve ``card`` under its model id (or ``model_id``: e.g. a trained card next to the card it
        was trained from) with ``program`` (default: its family's).

        Replacing a resident card (``replace=True``) bumps every component's (and expert's) weight
        version and drops its cache entries. While the engine has work in flight, a replacement waits
        for the card to drain (its started requests finish on the old card; its later ones start on
        the new one, bound again). Raises ``EngineError`` / ``ProgramError`` before changing anything.
        """
        with self._lock:
            self._register(card, program, model_id, replace)

    def _register(self, card: Card, program: Program | None, model_id: str | None, replace: bool) -> None:
        if not isinstance(card, Card):
            raise TypeError(f"register takes a Card (got {type(card).__name__})")
        if model_id is not None:
            card = card.with_id(model_id)
        model_id = card.model_id
        if model_id in self._workflows:
            raise EngineError(f"card id {model_id!r} collides with a registered workflow of the same id")
        if model_id in self._cards and not replace:
            raise EngineError(f"card {model_id!r} is already registered (pass replace=True to replace it)")
        program = _default_program(card) if program is None else program
        if not isinstance(program, Program):
            raise TypeError(f"program must be a Program (got {type(program).__name__})")
        program.check(card)
        old = self._cards.get(model_id)
        if old is not None and old.base is not None:
            raise EngineError(f"{model_id!r} is a role of {old.base!r}: publish to it, or remove it with unregister")
        if old is not None and self._serving():
            self._swaps.append((model_id, _Replace(card, program)))
            return
        self._install(card, program)

    def _install(self, card: Card, program: Program) -> None:
        model_id = card.model_id
        experts = stacked(card)
        old = self._cards.get(model_id)
        names = [n for c in card.components for n in experts.get(c, (c,))]
        versions = {name: (old.versions.get(name, -1) + 1 if old else 0) for name in names}
        if old is not None:
            self.cache.invalidate(model_id)
            self._drop_roles(model_id)
        self._cards[model_id] = Resident.of(card, program, versions, experts)

    def add_role(self, model_id: str, role: str, components: str | Sequence[str]) -> str:
        """Serve a role of resident card ``model_id``: a copy of its ``components`` (e.g. the
        transformer of a trainer's old policy or EMA) tracked on its own, as the card
        ``"<model_id>@<role>"`` (returned). The role starts as the card's current weights; its
        scoped components start at version 0 and move only when published to the role; the
        components outside its scope mirror the card's publishes (their versions follow the
        card's). Raises ``EngineError`` for a role of a role, a taken name or an unknown component.
        """
        with self._lock:
            return self._add_role(model_id, role, components)

    def _add_role(self, model_id: str, role: str, components: str | Sequence[str]) -> str:
        base = self._resident(model_id)
        if base.base is not None:
            raise EngineError(f"{model_id!r} is itself a role of {base.base!r}; add the role to {base.base!r}")
        if not isinstance(role, str) or not role or ROLE_SEP in role:
            raise ValueError(f"a role is a non-empty name without {ROLE_SEP!r} (got {role!r})")
        names = (components,) if isinstance(components, str) else tuple(components)
        unknown = sorted(str(n) for n in names if n not in base.card.components)
        if not names or unknown:
            raise UnknownComponentError(
                f"add_role: card {model_id!r} has no component(s) {unknown or '(none given)'}; it has {sorted(base.card.components)}"
            )
        role_id = f"{model_id}{ROLE_SEP}{role}"
        if self.serves(role_id):
            raise EngineError(f"{role_id!r} is already served (remove it with unregister first)")
        scope = tuple(dict.fromkeys(names))
        owned = {n for c in scope for n in base.experts.get(c, (c,))}
        versions = {n: 0 if n in owned else v for n, v in base.versions.items()}
        self._cards[role_id] = Resident.of(
            base.card.with_id(role_id), base.program, versions, base.experts, model_id, scope
        )
        self._roles.setdefault(model_id, {})[role] = role_id
        return role_id

    def roles(self, model_id: str) -> dict[str, tuple[str, ...]]:
        """The roles of resident card ``model_id``: role name -> the components it tracks (``{}``: none)."""
        self._resident(model_id)
        return {role: self._cards[rid].scope for role, rid in self._roles.get(model_id, {}).items()}

    def _drop_roles(self, model_id: str) -> None:
        for role_id in self._roles.pop(model_id, {}).values():
            del self._cards[role_id]
            self.cache.invalidate(role_id)

    def register_workflow(self, workflow: Workflow, *, replace: bool = False) -> None:
        """Serve ``workflow`` under its dotted id. Rejects (``WorkflowError``, nothing changed) an id that
        collides with a card or workflow, a stage model that is not served, and a cycle. Requests of a
        replaced workflow already running finish as they started."""
        with self._lock:
            self._workflows.add(workflow, self._cards, replace=replace)

    def unregister(self, model_id: str) -> None:
        """Stop serving a card (and its roles), a role, or a workflow (refused while a registered workflow requires it).

        While the card has requests started, it drains first: they finish, and requests for it that
        have not started fail with an ``EngineError``; new submissions for it are refused at once.
        """
        with self._lock:
            self._lookup(model_id)
            if model_id in self._leaving():
                return
            users = [
                u for m in (model_id, *self._roles.get(model_id, {}).values()) for u in self._workflows.dependents(m)
            ]
            if users:
                raise EngineError(f"cannot unregister {model_id!r}: workflows {users} require it")
            if model_id in self._cards and self._serving():
                self._swaps.append((model_id, _Remove()))
            else:
                self._remove(model_id)

    def _remove(self, model_id: str) -> None:
        if model_id in self._cards:
            resident = self._cards.pop(model_id)
            self.cache.invalidate(model_id)
            if resident.base is not None:
                self._roles[resident.base] = {r: i for r, i in self._roles[resident.base].items() if i != model_id}
            self._drop_roles(model_id)
        else:
            self._workflows.remove(model_id)

    def serves(self, model_id: str) -> bool:
        """Whether ``model_id`` names a registered card or workflow."""
        return model_id in self._cards or model_id in self._workflows

    def models(self) -> list[str]:
        """Every id the engine serves, cards and workflows, sorted (a card being unregistered is left out)."""
        leaving = self._leaving()
        return sorted(m for m in [*self._cards, *self._workflows.ids()] if m not in leaving)

    def cards(self) -> list[str]:
        """The ids of the resident cards (roles included), sorted."""
        return sorted(self._cards)

    def workflows(self) -> list[str]:
        """The ids of the registered workflows, sorted."""
        return self._workflows.ids()

    def compiled_batches(self) -> frozenset:
        """The ``(group layout, batch capacity)`` pairs whose batched step this engine has compiled: a later batch
        of the same layout and capacity runs without compiling (``jaxpipe.serve.warmup`` fills it at start-up)."""
        with self._lock:
            return frozenset(self._compiled)

    def card(self, model_id: str, *, pending: bool = False) -> Card:
        """The resident card ``model_id``. During ``run_many`` a deferred publish shows only once
        it applies; ``pending=True`` gives the card as it will be after the deferred publishes."""
        if not pending:
            return self._resident(model_id).card
        with self._lock:
            card = self._resident(model_id).card
            for m, update in self._swaps:
                if m == model_id:
                    card = update.apply(card)
            return card

    def program(self, model_id: str) -> Program:
        """The program the resident card ``model_id`` is served with.

        Args:
          model_id: a served card's id.

        Returns:
          Its ``Program``.

        Raises:
          EngineError: if ``model_id`` is not served, or is a workflow.
        """
        return self._resident(model_id).program

    def workflow(self, model_id: str) -> Workflow:
        """The registered workflow ``model_id``.

        Args:
          model_id: a served workflow's id.

        Returns:
          Its ``Workflow``.

        Raises:
          EngineError: if ``model_id`` is not served, or is a card.
        """
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

        A role (``add_role``) takes only components within its scope; a publish to a card also
        publishes its components outside each role's scope to that role (drained on its own).

        Returns the card's versions after this publish: the new ones, or, when deferred, the ones
        the swap will produce (counting earlier pending publishes of the card).
        """
        with self._lock:
            resident = self._resident(model_id)
            update = checked(resident, components)
            if resident.base is not None:
                outside = sorted(set(update.bumps) - resident.scoped(update.bumps))
                if outside:
                    raise EngineError(
                        f"publish: {outside} are outside role {model_id!r}'s scope {list(resident.scope)}; "
                        f"publish them to {resident.base!r} (its roles follow)"
                    )
            updates = [(model_id, update)] if update.bumps else []
            for role_id in self._roles.get(model_id, {}).values():
                role = self._cards[role_id]
                mirrored = {n: m for n, m in components.items() if not role.scoped((n,))}
                if mirrored:
                    updates.append((role_id, checked(role, mirrored)))
            busy = self._serving()
            for target, part in updates:
                if busy:
                    self._swaps.append((target, part))
                else:
                    self._swap(target, part)
            return self._projected(model_id) if busy else dict(self._cards[model_id].versions)

    def pending_publishes(self) -> dict[str, dict[str, int]]:
        """Publishes (and replacements) deferred until their card drains (only while work is in flight):
        card id -> the versions the card will have once they apply. Empty when none."""
        with self._lock:
            return {m: self._projected(m) for m, u in dict(self._swaps).items() if not isinstance(u, _Remove)}

    def _projected(self, model_id: str) -> dict[str, int]:
        versions = dict(self._cards[model_id].versions)
        for m, update in self._swaps:
            if m == model_id and not isinstance(update, _Remove):
                bumps = versions if isinstance(update, _Replace) else update.bumps
                versions.update({n: versions[n] + 1 for n in bumps})
        return versions

    def _swap(self, model_id: str, update: Any) -> None:
        if isinstance(update, _Replace):
            self._install(update.card, update.program)
            return
        if isinstance(update, _Remove):
            self._remove(model_id)
            return
        resident = self._cards[model_id]
        card = update.apply(resident.card)
        versions = {n: v + (n in update.bumps) for n, v in resident.versions.items()}
        self.cache.invalidate(model_id, update.touched)
        self._cards[model_id] = Resident.of(
            card, resident.program, versions, resident.experts, resident.base, resident.scope
        )

    def _apply_swaps(self) -> None:
        """Apply the deferred changes, in order, of every card no scheduler has a started request of."""
        with self._lock:
            keep = []
            for model_id, update in self._swaps:
                if any(s._in_flight(model_id) for s in self._active) or any(m == model_id for m, _ in keep):
                    keep.append((model_id, update))
                else:
                    self._swap(model_id, update)
            self._swaps = keep

    def _deferred(self) -> set[str]:
        """Cards with a deferred change: their requests must not start yet."""
        with self._lock:
            return {m for m, _ in self._swaps}

    def _leaving(self) -> set[str]:
        """Cards whose unregistering waits for them to drain."""
        return {m for m, u in self._swaps if isinstance(u, _Remove)}

    def _serving(self) -> bool:
        """Whether any scheduler (the live one, a ``run_many`` call) holds unfinished work."""
        return any(not s.idle for s in self._active) or len(self._active) > 1

    def _lookup(self, model_id: str) -> None:
        if not self.serves(model_id):
            raise EngineError(f"unknown model {model_id!r}; this engine serves {self.models()}")

    def _resident(self, model_id: str) -> Resident:
        self._lookup(model_id)
        if model_id not in self._cards:
            raise EngineError(f"{model_id!r} is a workflow, not a card")
        return self._cards[model_id]

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

    def _checked(self, index: int, request: Request, count: int) -> Bound | None:
        """``check(request)``; with several requests, the error names the bad one's index."""
        try:
            return self.check(request)
        except (ValueError, TypeError) as err:
            if count == 1:
                raise
            model = getattr(request, "model", None)
            message = err.args[0] if err.args and isinstance(err.args[0], str) else str(err)
            raise type(err)(f"request {index} of {count} ({model!r}): {message}") from err

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

        Every request is validated first; nothing runs and nothing changes if any is bad (the error
        names the bad request's index).
        """
        if mode not in MODES:
            raise EngineError(f"mode must be one of {MODES} (got {mode!r})")
        if isinstance(requests, Request):
            raise TypeError("run_many takes a sequence of requests; use run(request) for one")
        requests = list(requests)
        bounds = [self._checked(i, request, len(requests)) for i, request in enumerate(requests)]
        if cancel is not None and not (callable(cancel) or hasattr(cancel, "is_set")):
            raise TypeError("cancel must be a threading.Event-like object (is_set()) or a callable returning bool")
        scheduler = Scheduler(_Host(self), mode, on_step, fuse=on_step is None and cancel is None)
        handles = [Handle(request) for request in requests]
        for handle, bound in zip(handles, bounds):
            scheduler.submit(handle, bound)
        with self._lock:
            self._active.append(scheduler)
        try:
            while not scheduler.idle:
                if cancel is not None and (cancel.is_set() if hasattr(cancel, "is_set") else cancel()):
                    with self._lock:
                        scheduler.cancel_all()
                    break
                with self._lock:
                    scheduler.step()
        finally:
            with self._lock:
                self._active.remove(scheduler)
                self._apply_swaps()
        for handle in handles:
            if handle.status == "failed":
                raise handle.exception(0)
        return [handle.result(0) for handle in handles]

    # ---- the request lifecycle ------------------------------------------------------------------

    def submit(self, request: Request, *, previews: bool = False) -> Handle:
        """Queue ``request`` for the live scheduler (``mode``): its ``Handle`` at once. Safe from any thread.

        It is validated here (a bad request raises, nothing is queued) and joins the running work at
        the next ``tick``. With ``previews``, its ``"step"`` events carry the loop's latents (and a
        decoded image where the program decodes its loop by itself).
        """
        # No engine lock here: a tick holds it for a whole step, and a ticking thread that takes it straight
        # back would starve submitters (one admitted per tick). The inbox is a thread-safe deque; a card
        # unregistered between this check and the next tick fails the request alone, at that tick.
        bound = self.check(request)
        if request.model in self._leaving():
            raise EngineError(f"{request.model!r} is being unregistered; this engine serves {self.models()}")
        handle = Handle(request, previews=previews)
        self._live.submit(handle, bound)
        return handle

    def tick(self) -> bool:
        """Advance the submitted requests by one step: new ones join, cancelled ones leave, deferred changes
        apply once their card drains, every running request takes one loop step (one batched step per
        group in the batched mode), finished ones get their results. Call it from one thread.

        Returns:
          Whether work remains.
        """
        with self._lock:
            return self._live.step()

    @property
    def idle(self) -> bool:
        """Whether no submitted request is queued or running."""
        return self._live.idle

    def load(self) -> Load:
        """The submitted requests queued and running, and the batch rows stepping."""
        with self._lock:
            return self._live.load()

    # ---- feature cache ------------------------------------------------------------------------

    def _resolve_cached(self, resident: Resident, bound: Bound) -> dict[str, Any]:
        """The bound slots plus the outputs of the program's cached nodes, looked up per request."""
        slots = dict(bound.slots)
        model_id = resident.card.model_id
        for node in resident.program.cached_nodes:
            reads = {r: slots[r] for r in node.reads}
            # a node that runs a loop depends on that loop's settings too: they key its entries
            settings = ((node.loop, config_of(bound.settings, node.loop)),) if node.loop else ()
            digest = content_hash(f"{node.name}|{settings!r}" if settings else node.name, reads)
            key = CacheKey(model_id, node.component, resident.version(node.component), digest)
            value = self.cache.get(key)
            if value is None:
                value = ops.node(resident.program, node.name, settings, resident.treedef, resident.leaves, reads)
                self.cache.put(key, value)
            slots.update(value)
        return slots


class _Host:
    """The scheduler's narrow view of an engine (``scheduler.Host``)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self.max_batch = engine.max_batch
        self.compiled = engine._compiled
        self.wanted = engine._wanted

    def serves(self, model_id: str) -> bool:
        return self._engine.serves(model_id)

    def workflow(self, model_id: str) -> Workflow | None:
        workflows = self._engine._workflows
        return workflows[model_id] if model_id in workflows else None

    def resident(self, model_id: str) -> Resident:
        return self._engine._resident(model_id)

    def bind(self, request: Request) -> Bound:
        return self._engine.check(request)

    def prepare(self, resident: Resident, bound: Bound) -> dict[str, Any]:
        return self._engine._resolve_cached(resident, bound)

    def held(self) -> set[str]:
        return self._engine._deferred()

    def release(self) -> None:
        self._engine._apply_swaps()


@dataclasses.dataclass(frozen=True, eq=False)
class _Replace:
    """A deferred ``register(..., replace=True)``: the new card and program."""

    card: Card
    program: Program

    def apply(self, card: Card) -> Card:
        return self.card


class _Remove:
    """A deferred ``unregister``."""

    def apply(self, card: Card) -> Card:
        return card


def _default_program(card: Card) -> Program:
    from jaxpipe.cards.registry import default_program  # the engine sits above the cards

    return default_program(card)
