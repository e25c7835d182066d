"""The engine: resident cards and workflows by id, and the loop that serves requests.

``Engine`` is the public facade of two parts behind one lock: a resident ``Registry``
(``registry.py``: each registered card with its program and per-component weight versions, its
roles, the registered workflows; a publish, replacement or removal is a change value applied
between ticks) and the ``Scheduler``s that run requests on it (``scheduler.py``: the requests in
flight, reading the registry through a read-only protocol; a mode is a ``strategies`` object). It
runs requests:

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

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxpipe import validate
from jaxpipe.cache import FeatureCache
from jaxpipe.card import Card
from jaxpipe.engine import features, strategies
from jaxpipe.engine.errors import EngineError
from jaxpipe.engine.handle import Handle
from jaxpipe.engine.registry import ROLE_SEP, Registry
from jaxpipe.engine.scheduler import Scheduler
from jaxpipe.engine.strategies import MODES
from jaxpipe.engine.work import Load, StepEvent
from jaxpipe.program import Bound, Program
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow

__all__ = ["Engine", "MODES", "ROLE_SEP"]


class Engine:
    """Serves registered cards (through their programs) and workflows, by id: a resident ``Registry`` and the
    ``Scheduler`` that runs requests on it, behind one lock.

    Arguments:
      max_batch: the most requests one batched step carries (``mode="batched"``).
      cache: the feature cache (a fresh ``FeatureCache`` by default).
      mode: how ``submit`` / ``tick`` serve (``MODES``; ``run_many`` takes its own).
    """

    def __init__(self, *, max_batch: int = 64, cache: FeatureCache | None = None, mode: str = "batched"):
        self._max_batch = max_batch
        validate.counts(self, "max_batch")
        self._mode = mode
        self.cache = FeatureCache() if cache is None else cache
        self._registry = Registry(self.cache)
        # guards the registry and the schedulers' state: publish, register and submit may come from any thread
        self._lock = threading.RLock()
        self._compiled: set = set()  # (batched group layout, capacity) pairs already compiled, merged after each tick
        self._wanted: set = set()  # (batched group layout, capacity) pairs a group wanted to shrink to
        self._live = self._scheduler(mode, cohort_rows=1)
        self._active: list[Scheduler] = [self._live]  # the live scheduler and those of run_many calls in flight

    @property
    def max_batch(self) -> int:
        """The most requests one batched step carries."""
        return self._max_batch

    @property
    def mode(self) -> str:
        """How ``submit`` / ``tick`` serve: ``"serial"``, ``"interleaved"`` or ``"batched"``."""
        return self._mode

    @property
    def _workflows(self):  # the registered workflows (a test smuggles a cycle in through here)
        return self._registry.workflow_registry

    # ---- registry -------------------------------------------------------------------------

    @classmethod
    def default(cls, **kwargs) -> Engine:
        """An engine serving every bundled card (``jp.cards.available()``) and every bundled
        workflow whose cards are bundled (``image_video.t2i_i2v``, its extended variant).

        Args:
          **kwargs: ``Engine``'s arguments.

        Returns:
          The engine.
        """
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
            self._registry.register(card, program, model_id, replace, busy=self._serving())

    def add_role(self, model_id: str, role: str, components: str | Sequence[str]) -> str:
        """Serve a role of resident card ``model_id``: a copy of its ``components`` (e.g. the
        transformer of a trainer's old policy or EMA) tracked on its own, as the card
        ``"<model_id>@<role>"`` (returned). The role starts as the card's current weights; its
        scoped components start at version 0 and move only when published to the role; the
        components outside its scope mirror the card's publishes (their versions follow the
        card's). Raises ``EngineError`` for a role of a role, a taken name or an unknown component.
        """
        with self._lock:
            return self._registry.add_role(model_id, role, components)

    def roles(self, model_id: str) -> dict[str, tuple[str, ...]]:
        """The roles of resident card ``model_id``: role name -> the components it tracks (``{}``: none)."""
        return self._registry.roles(model_id)

    def register_workflow(self, workflow: Workflow, *, replace: bool = False) -> None:
        """Serve ``workflow`` under its dotted id. Rejects (``WorkflowError``, nothing changed) an id that
        collides with a card or workflow, a stage model that is not served, and a cycle. Requests of a
        replaced workflow already running finish as they started."""
        with self._lock:
            self._registry.register_workflow(workflow, replace)

    def unregister(self, model_id: str) -> None:
        """Stop serving a card (and its roles), a role, or a workflow (refused while a registered workflow requires it).

        While the card has requests started, it drains first: they finish, and requests for it that
        have not started fail with an ``EngineError``; new submissions for it are refused at once.
        """
        with self._lock:
            self._registry.unregister(model_id, busy=self._serving())

    def serves(self, model_id: str) -> bool:
        """Whether ``model_id`` names a registered card or workflow."""
        return self._registry.serves(model_id)

    def models(self) -> list[str]:
        """Every id the engine serves, cards and workflows, sorted (a card being unregistered is left out)."""
        return self._registry.models()

    def cards(self) -> list[str]:
        """The ids of the resident cards (roles included), sorted."""
        return sorted(self._registry.state.residents)

    def workflows(self) -> list[str]:
        """The ids of the registered workflows, sorted."""
        return self._registry.workflow_registry.ids()

    def compiled_batches(self) -> frozenset:
        """The ``(group layout, batch capacity)`` pairs whose batched step this engine has compiled: a later batch
        of the same layout and capacity runs without compiling (``jaxpipe.serve.warmup`` fills it at start-up)."""
        with self._lock:
            return frozenset(self._compiled)

    def card(self, model_id: str, *, pending: bool = False) -> Card:
        """The resident card ``model_id``. During ``run_many`` a deferred publish shows only once
        it applies; ``pending=True`` gives the card as it will be after the deferred publishes."""
        if not pending:
            return self._registry.card(model_id)
        with self._lock:
            return self._registry.card(model_id, pending=True)

    def program(self, model_id: str) -> Program:
        """The ``Program`` the resident card ``model_id`` is served with (``EngineError`` if ``model_id`` is not
        served, or is a workflow)."""
        return self._registry.resident(model_id).program

    def workflow(self, model_id: str) -> Workflow:
        """The registered ``Workflow`` ``model_id`` (``EngineError`` if ``model_id`` is not served, or is a card)."""
        self._registry.lookup(model_id)
        workflow = self._registry.workflow(model_id)
        if workflow is None:
            raise EngineError(f"{model_id!r} is a card, not a workflow")
        return workflow

    def versions(self, model_id: str) -> dict[str, int]:
        """Per-component weight versions of the resident card ``model_id``; a stacked component
        (``experts``) reports one version per expert (``refiner_0``, ...) instead of its own."""
        return dict(self._registry.resident(model_id).versions)

    def experts(self, model_id: str) -> dict[str, tuple[str, ...]]:
        """The resident card's stacked components -> their experts' names in axis order (``{}``: none)."""
        return dict(self._registry.resident(model_id).experts)

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
            return self._registry.publish(model_id, components, busy=self._serving())

    def pending_publishes(self) -> dict[str, dict[str, int]]:
        """Publishes (and replacements) deferred until their card drains (only while work is in flight):
        card id -> the versions the card will have once they apply. Empty when none."""
        with self._lock:
            return self._registry.pending()

    def _serving(self) -> bool:
        """Whether any scheduler (the live one, a ``run_many`` call) holds unfinished work."""
        return any(not s.idle for s in self._active) or len(self._active) > 1

    def _release(self) -> None:
        """Apply the pending changes of every card no scheduler has a started request of."""
        self._registry.apply(lambda model_id: not any(s.in_flight(model_id) for s in self._active))

    # ---- running ----------------------------------------------------------------------------

    def check(self, request: Request) -> Bound | None:
        """Validate ``request`` (raising a clear error) without running it: the card's ``Bound``,
        or ``None`` for a workflow request (checked by the workflow's own ``check``)."""
        return self._registry.bind(request)

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

    def _scheduler(self, mode: str, on_step=None, *, fuse: bool = False, cohort_rows: int | None = None) -> Scheduler:
        """A scheduler on this engine's registry and feature cache, stepping as ``mode`` says."""
        strategy = strategies.make(
            mode,
            self._max_batch,
            fuse=fuse,
            cohort_rows=cohort_rows,
            compiled=self._compiled.__contains__,
            wanted=frozenset(self._wanted),
        )
        return Scheduler(self._registry, functools.partial(features.resolve, self.cache), strategy, on_step)

    def _tick(self, scheduler: Scheduler) -> bool:
        """One tick of ``scheduler``: requests join and leave, the pending changes that can apply do, every running
        request steps, and the cards that drained take their changes (now, not a tick later). Under the lock."""
        try:
            scheduler.take()
            self._release()
            scheduler.advance()
            self._release()
        finally:
            compiled, wanted = scheduler.strategy.learned()
            self._compiled |= compiled
            self._wanted |= wanted
        return not scheduler.idle

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
        scheduler = self._scheduler(mode, on_step, fuse=on_step is None and cancel is None)
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
                    self._tick(scheduler)
        finally:
            with self._lock:
                self._active.remove(scheduler)
                self._release()
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
        if request.model in self._registry.leaving():
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
            return self._tick(self._live)

    @property
    def idle(self) -> bool:
        """Whether no submitted request is queued or running."""
        return self._live.idle

    def load(self) -> Load:
        """The submitted requests queued and running, and the batch rows stepping."""
        with self._lock:
            return self._live.load()
