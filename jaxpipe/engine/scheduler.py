"""The scheduler: submitted requests, workflow flows, cohorts and batched groups, advanced one ``tick`` at a time.

It reaches the engine only through the narrow ``Host`` interface (look up a served model, bind a
request, resolve its cached nodes, hold back cards with a deferred publish), so it never reads
the engine's private state.

Modes: ``serial`` runs one request at a time, ``interleaved`` advances every request one step per
tick; both drive each loop's jitted pure step on one request (same compiled function, same
bits: C1). ``batched`` steps the rows of many requests as one jitted batched step (continuous
batching, C3).

Requests arrive through ``submit`` (any thread: an inbox the next ``tick`` takes from) and join
the running work at the next tick. Each root request has a ``Handle``; a request whose own work
raises (a workflow stage, a feature-cache node, entering or stepping its loop) fails alone, on its
handle, and the others go on: a cohort prepared together is retried one request at a time before
any of them is failed, and a batched step that raises fails the rows it carried.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from jaxpipe.engine import batch as ops
from jaxpipe.engine.handle import Event, Handle, Progress
from jaxpipe.engine.publish import Resident
from jaxpipe.loops import registry as loop_kinds
from jaxpipe.program import Bound, ComponentNode, LoopNode, Program
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow, WorkflowError, initial_state, record_stage

__all__ = ["Host", "Load", "Scheduler", "StepEvent", "MIN_WIDTH"]

_log = logging.getLogger("jaxpipe.engine")

MIN_WIDTH = 64
"""Batched loops pad schedules to at least this many steps, so nearly all step counts share a group."""


class Host(Protocol):
    """What the scheduler needs from the engine."""

    max_batch: int

    def serves(self, model_id: str) -> bool:
        """Whether ``model_id`` is a served card or workflow."""

    def workflow(self, model_id: str) -> Workflow | None:
        """The workflow ``model_id``, or ``None`` when it is a card."""

    def resident(self, model_id: str) -> Resident:
        """The resident card ``model_id`` (``EngineError`` for an unknown id or a workflow)."""

    def bind(self, request: Request) -> Bound:
        """The card request ``request`` validated and bound to its program (``Engine.check``)."""

    def prepare(self, resident: Resident, bound: Bound) -> dict[str, Any]:
        """The bound slots plus the program's cached nodes' outputs (feature cache)."""

    def held(self) -> set[str]:
        """Cards with a deferred publish: their requests must not start yet."""

    def release(self) -> None:
        """Apply the deferred changes (publishes, replacements, removals) of every card no scheduler has in flight."""

    compiled: set
    """``(group layout, capacity)`` pairs whose batched step has run (is compiled) on this engine."""

    wanted: set
    """``(group layout, capacity)`` pairs a group would have shrunk to, in calls so far."""


@dataclasses.dataclass(frozen=True)
class Load:
    """What a scheduler holds: requests ``queued`` (not started), ``running`` (started, unfinished) and the
    batch ``rows`` stepping (one per running request outside the batched mode)."""

    queued: int = 0
    running: int = 0
    rows: int = 0


@dataclasses.dataclass(eq=False)
class StepEvent:
    """One loop step of one request, as ``on_step`` sees it.

    Attributes:
      index: the request's position in ``run_many``.
      request: the card request stepping (a workflow's stage request for workflow requests).
      stage: the stage path (``"i2v"``, ``"base/t2i"``; ``""`` for a plain card request).
      loop: the loop id.
      step: how many of ``num_steps`` steps are done.
      num_steps: the loop's step count for this request.
      tick: the engine's tick counter of this ``run_many`` call (requests stepped in one batched call
        share a tick).
      latents: the request's current loop-state latents ``(T, h, w, C)`` (sliced on first access only).
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
        """The request's current loop-state latents ``(T, h, w, C)``, sliced from the batch on first access."""
        return self._latents()


@dataclasses.dataclass(eq=False)
class _Flow:
    """A workflow request in flight: its state and the stage it waits on."""

    workflow: Workflow
    request: Request
    root: int
    parent: _Flow | None
    path: str
    ancestry: tuple[str, ...]
    state: dict
    stage: int = 0


@dataclasses.dataclass(eq=False)
class _Job:
    """A card request in flight."""

    root: int
    request: Request
    resident: Resident
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

    resident: Resident
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
    resident: Resident
    capacity: int
    batch: Any
    slots: list  # slot -> (cohort, row) or None
    queue: deque
    layout: tuple = ()  # what its compiled step depends on besides the capacity (``Host.compiled`` keys)

    @property
    def active(self) -> int:
        return sum(s is not None for s in self.slots)


def _row_layout(slot: Any) -> tuple:
    """What must agree for two requests' slot to share a batch: its tree, per-row shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(slot)
    return treedef, tuple(
        (tuple(np.shape(x))[1:], str(getattr(x, "dtype", None) or np.asarray(x).dtype)) for x in leaves
    )


class Scheduler:
    """Runs submitted requests in one mode, a ``tick`` at a time; each root request reports on its ``Handle``.

    Arguments:
      host: the engine, through its narrow ``Host`` view.
      mode: ``"serial"``, ``"interleaved"`` or ``"batched"``.
      on_step: ``run_many``'s hook, called with a ``StepEvent`` after every loop step (``False`` cancels).
      fuse: in batched mode, run the steps between scheduling events as one call (``run_many`` without
        hooks: nothing can join or watch in between). A live engine steps once per tick.
      cohort_rows: the most requests prepared together as one cohort in batched mode (``None``: ``max_batch``).
        A live engine prepares each request alone (1): arrivals come in every count, and each distinct
        cohort size would compile its own entry, decode and row moves against every batch capacity; alone,
        one compiled entry serves them all, and the rows still step together.
    """

    def __init__(self, host: Host, mode: str, on_step=None, *, fuse: bool = False, cohort_rows: int | None = None):
        self.host = host
        self.mode = mode
        self.on_step = on_step
        self.fuse = fuse
        self.cohort_rows = cohort_rows
        self.handles: dict[int, Handle] = {}  # root index -> the handle of an unfinished root request
        self.inbox: deque = deque()  # (handle, bound) from submit, taken by the next tick (deque: thread-safe)
        self.pending: list[_Job] = []
        self.cohorts: list[_Cohort] = []
        self.groups: dict[Any, _Group] = {}
        self.flows: list[_Flow] = []
        self.tick = 0
        self._roots = itertools.count()
        self._decoders: dict = {}
        self._wanted_before = set(host.wanted)

    # ---- the main loop -------------------------------------------------------------------

    def submit(self, handle: Handle, bound: Bound | None) -> None:
        """Queue ``handle``'s request (``bound``: its validated binding, ``None`` for a workflow request);
        it joins the running work at the next ``tick``. Safe from any thread."""
        self.inbox.append((handle, bound))

    @property
    def idle(self) -> bool:
        """Whether nothing is queued or running."""
        return not (self.inbox or self.handles or self.pending or self.cohorts)

    def load(self) -> Load:
        """The requests queued and running, and the batch rows stepping."""
        running = sum(handle.status == "running" for handle in self.handles.values())
        if self.mode == "batched":
            rows = sum(g.active for g in self.groups.values())
        else:
            rows = sum(not c.jobs[0].finished for c in self.cohorts)
        return Load(queued=len(self.inbox) + len(self.handles) - running, running=running, rows=rows)

    def step(self) -> bool:
        """One tick: take new requests, apply cancellations and the deferred changes that can apply, start
        what may start, advance every running request by one loop step (``fuse``: up to the next
        scheduling event), and move finished ones on. Returns whether work remains."""
        while self.inbox:
            handle, bound = self.inbox.popleft()
            root = next(self._roots)
            self.handles[root] = handle
            if handle.cancel_requested:
                self._deliver_root(root, _cancelled(handle.request))
                continue
            try:
                self._spawn(root, handle.request, bound, flow=None, path="")
            except Exception as err:  # noqa: BLE001 - the request's own error, reported on its handle
                self._fail(root, err)
        self._reap_cancelled()
        self.host.release()
        self._start_pending()
        if self.cohorts:
            self.tick += 1
            if self.mode == "batched":
                self._tick_batched()
            else:
                self._tick_each()
            self._settle()
        self.host.release()  # a card that just drained takes its deferred change now, not a tick later
        return not self.idle

    def _reap_cancelled(self) -> None:
        """Requests whose handle asked to cancel stop here: pending ones at once, stepping ones free their slot."""
        roots = {root for root, handle in self.handles.items() if handle.cancel_requested}
        if not roots:
            return
        for job in [job for job in self.pending if job.root in roots]:
            self.pending.remove(job)
            job.cancelled_at = (0, 0)
            self._finish_job(job, None)
        for cohort in self.cohorts:
            for job in cohort.jobs:
                if job.root in roots and not job.finished:
                    job.cancelled_at = (job.step, job.total)
                    self._finish_job(job, None)  # reported now; its row leaves the batch before the next step

    def _fail(self, root: int, error: BaseException) -> None:
        """Root request ``root`` failed: drop its work everywhere and report ``error`` on its handle."""
        handle = self.handles.pop(root, None)
        self.pending = [job for job in self.pending if job.root != root]
        self.flows = [flow for flow in self.flows if flow.root != root]
        for cohort in self.cohorts:
            for job in cohort.jobs:
                if job.root == root and not job.finished:
                    job.cancelled_at = (job.step, job.total)
        if handle is not None:
            _log.info("request %s (%r) failed: %s", handle.id, handle.request.model, error)
            handle._finish(None, error, self.tick)

    def cancel_all(self) -> None:
        """Cancel everything (``run_many``'s ``cancel``): every unfinished request gets a cancelled ``Output``."""
        while self.inbox:
            handle, _ = self.inbox.popleft()
            handle._finish(_cancelled(handle.request), None, self.tick)
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
        while self.flows:
            self._deliver_flow_cancel(self.flows[0])
        for root in list(self.handles):
            handle = self.handles[root]
            self._deliver_root(root, _cancelled(handle.request))

    # ---- spawning requests and threading workflows ----------------------------------------

    def _spawn(self, root: int, request: Request, bound: Bound | None, flow: _Flow | None, path: str) -> None:
        workflow = self.host.workflow(request.model)
        if workflow is not None:
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
            bound = self.host.bind(request)
        resident = self.host.resident(request.model)
        self.pending.append(_Job(root, request, resident, bound, flow, path))

    def _next_stage(self, flow: _Flow) -> None:
        stage = flow.workflow.stages[flow.stage]
        request = flow.workflow.build(stage, flow.state)
        if not self.host.serves(request.model):
            raise WorkflowError(
                f"workflow {flow.workflow.id!r}, stage {stage.label!r}: {request.model!r} is no longer served"
            )
        path = f"{flow.path}/{stage.label}" if flow.path else stage.label
        self._spawn(flow.root, request, None, flow, path)

    def _deliver_root(self, root: int, output: Output) -> None:
        handle = self.handles.pop(root, None)
        if handle is not None:
            handle._finish(output, None, self.tick)

    def _deliver(self, job_or_flow, output: Output) -> None:
        flow = job_or_flow.flow if isinstance(job_or_flow, _Job) else job_or_flow.parent
        root = job_or_flow.root
        if root not in self.handles:  # the request failed (or was delivered) already
            return
        if flow is None:
            self._deliver_root(root, output)
            return
        if output.cancelled:
            self._deliver_flow_cancel(flow, output.cancelled_at)
            return
        try:
            stage = flow.workflow.stages[flow.stage]
            record_stage(flow.state, stage.label, output)
            flow.stage += 1
            if flow.stage < len(flow.workflow.stages):
                self._next_stage(flow)
                return
            self.flows.remove(flow)
            artifacts = flow.workflow.finish(flow.state, output)
        except Exception as err:  # noqa: BLE001 - a workflow's own code failed: that request alone
            self._fail(root, err)
            return
        self._deliver(flow, Output(flow.workflow.id, artifacts, flow.request))

    def _deliver_flow_cancel(self, flow: _Flow, at: tuple[int, int] | None = None) -> None:
        if flow in self.flows:
            self.flows.remove(flow)
        self._deliver(flow, Output(flow.workflow.id, {}, flow.request, cancelled_at=at or (0, 0)))

    def _finish_job(self, job: _Job, artifacts: Mapping[str, Any] | None) -> None:
        if job.root not in self.handles:
            return
        if job.cancelled_at is not None:
            output = Output(job.request.model, {}, job.request, cancelled_at=job.cancelled_at)
        else:
            try:
                texts = job.resident.program.texts_of(job.resident.card, artifacts)
            except Exception as err:  # noqa: BLE001 - a card's tokenizer failed on this request's ids
                self._fail(job.root, err)
                return
            output = Output(job.request.model, {**artifacts, **texts, **job.bound.artifacts}, job.request)
        self._deliver(job, output)

    # ---- preparing cohorts -------------------------------------------------------------------

    def _in_flight(self, model_id: str) -> bool:
        """Whether a started request of card ``model_id`` is unfinished (a deferred publish waits for it)."""
        return any(cohort.resident.card.model_id == model_id for cohort in self.cohorts)

    def _start_pending(self) -> None:
        """Start every pending job whose card has no deferred change (those wait for it to apply); serial:
        only the earliest request's, once nothing else runs."""
        waiting = self.host.held()
        ready = [job for job in self.pending if job.request.model not in waiting]
        if self.mode == "serial" and ready:
            first = min(job.root for job in ready)
            ready = [] if self.cohorts else [job for job in ready if job.root == first]
        self.pending = [job for job in self.pending if job not in ready]
        jobs = []
        for job in ready:
            try:
                # the card as it is now: a publish since the job was spawned keeps every static setting (its
                # Bound stays valid); a replacement may not, so the request is bound again to the new card
                resident = self.host.resident(job.request.model)
                if resident.card is not job.resident.card and resident.program is not job.resident.program:
                    job.bound = self.host.bind(job.request)
                job.resident = resident
                job.slots = self.host.prepare(job.resident, job.bound)
            except Exception as err:  # noqa: BLE001 - this request's own failure
                self._fail(job.root, err)
                continue
            jobs.append(job)
            handle = self.handles.get(job.root)
            if handle is not None and handle.status == "queued":  # the request's first job to start
                handle._emit(Event("started", job.path, tick=self.tick), status="running", progress=Progress(job.path))
        if self.mode != "batched":
            for job in jobs:
                self._start_cohort(_Cohort(job.resident, job.bound.settings, None, [job], 1))
            return
        buckets: dict[Any, list[_Job]] = {}
        for job in jobs:
            width = self._width(job)
            shapes = tuple((k, _row_layout(v)) for k, v in sorted(job.slots.items()))
            key = (id(job.resident), self._batch_settings(job, width), width, shapes)
            buckets.setdefault(key, []).append(job)
        for (_, settings, width, _), members in buckets.items():
            rows = min(self.host.max_batch, self.cohort_rows or self.host.max_batch)
            for lo in range(0, len(members), rows):
                chunk = members[lo : lo + rows]
                self._start_cohort(_Cohort(chunk[0].resident, settings, width, chunk, ops.bucket(len(chunk))))

    def _width(self, job: _Job) -> int | None:
        """The schedule width of the job's batched loops: a power of two >= every loop's steps (min ``MIN_WIDTH``)."""
        steps = [self._driver(job, node).num_steps(self._config(job, node)) for node in job.resident.program.loops]
        return max(MIN_WIDTH, ops.pow2(max(steps))) if steps else None

    def _batch_settings(self, job: _Job, width: int | None):
        """The job's settings with every loop config widened to ``width`` steps (``LoopDriver.batch_config``)."""
        loops = {node.loop: node for node in job.resident.program.loops}
        return tuple(
            (key, self._driver(job, loops[key]).batch_config(config, width) if key in loops else config)
            for key, config in job.bound.settings
        )

    @staticmethod
    def _driver(job: _Job, node):
        return loop_kinds.driver(job.resident.card.spec.loop(node.loop).kind)

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
        try:
            schedule = self._schedule(cohort, 0)
            slots, state = ops.enter(r.program, 0, cohort.settings, r.treedef, r.leaves, tuple(rows), None, schedule)
        except Exception as err:  # noqa: BLE001 - find whose request it is: each alone, then fail that one
            if len(cohort.jobs) == 1:
                self._fail(cohort.jobs[0].root, err)
                return
            for job in cohort.jobs:
                size = ops.bucket(1) if cohort.width is not None else 1
                self._start_cohort(_Cohort(job.resident, cohort.settings, cohort.width, [job], size))
            return
        for job in cohort.jobs:
            job.slots = None
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
        handle = self.handles.get(job.root)
        if handle is None:
            return
        preview = image = None
        if handle.previews:
            preview = np.asarray(latents())
            image = self._decoded(job, loop, preview)
        handle._emit(
            Event("step", job.path, loop, job.step, job.total, self.tick, preview, image),
            progress=Progress(job.path, loop, job.step, job.total),
        )
        if self.on_step is None:
            return
        event = StepEvent(job.root, job.request, job.path, loop, job.step, job.total, self.tick, latents)
        if self.on_step(event) is False and not job.finished:
            job.cancelled_at = (job.step, job.total)

    def _decoded(self, job: _Job, loop: str, latents: np.ndarray):
        """A preview of ``latents`` decoded by the program's own decoder of ``loop``'s result (the first node
        after the loop that reads only that slot and writes an image or video), else ``None``."""
        program = job.resident.program
        key = (id(program), loop)
        if key not in self._decoders:
            self._decoders[key] = _decoder_of(program, loop)
        found = self._decoders[key]
        if found is None:
            return None
        name, slot, output = found
        r = job.resident
        try:
            out = ops.node(program, name, (), r.treedef, r.leaves, {slot: latents[None]})
        except Exception:  # noqa: BLE001 - a preview is best effort: the request itself goes on
            return None
        return np.clip(np.asarray(out[output][0]), 0.0, 1.0)

    def _tick_each(self) -> None:
        """Serial and interleaved: every unfinished request advances one step (its own jitted step)."""
        for cohort in self.cohorts:
            job = cohort.jobs[0]
            if job.finished:
                continue
            r = cohort.resident
            try:
                cohort.state = ops.step(cohort.kind, cohort.node.loop, cohort.config, r.treedef, r.leaves, cohort.state)
            except Exception as err:  # noqa: BLE001 - this request's step failed: it alone
                self._fail(job.root, err)
                continue
            job.step += 1
            state, drive = cohort.state, loop_kinds.driver(cohort.kind)
            self._event(job, cohort.node.loop, lambda state=state, drive=drive: drive.latents(state)[0])

    def _enqueue(self, cohort: _Cohort) -> None:
        drive = loop_kinds.driver(cohort.kind)
        shapes = tuple((a.shape[1:], str(a.dtype)) for a in jax.tree.leaves(cohort.state))
        key = (id(cohort.resident), cohort.node.loop, drive.batch_key(cohort.config), shapes)
        group = self.groups.get(key)
        rows = [(cohort, i) for i, job in enumerate(cohort.jobs) if job.cancelled_at is None]
        if group is None:
            capacity = min(self.host.max_batch, ops.bucket(len(rows)))
            batch = ops.empty(cohort.kind, capacity, cohort.state)
            layout = (cohort.resident.card.model_id, cohort.node.loop, drive.batch_key(cohort.config), shapes)
            group = _Group(
                cohort.kind,
                cohort.node.loop,
                drive.batch_key(cohort.config),
                cohort.resident,
                capacity,
                batch,
                [None] * capacity,
                deque(),
                layout,
            )
            self.groups[key] = group
        group.queue.extend(rows)
        cohort.queued += len(rows)

    def _tick_batched(self) -> None:
        for group in self.groups.values():
            self._retire(group)  # rows cancelled since the last tick free their slots first
            self._admit(group)
        live = [g for g in self.groups.values() if g.active]
        if not live:
            return
        remaining = [job.total - job.step for g in live for c, i in filter(None, g.slots) for job in [c.jobs[i]]]
        count = max(1, min(remaining)) if self.fuse else 1
        for group in live:
            r = group.resident
            try:
                group.batch = ops.steps(group.kind, group.loop, group.config, r.treedef, r.leaves, group.batch, count)
            except Exception as err:  # noqa: BLE001 - the rows this step carried fail; other groups go on
                self._drop_group(group, err)
                continue
            self.host.compiled.add((group.layout, group.capacity))
            batch, drive = group.batch, loop_kinds.driver(group.kind)
            for slot, entry in enumerate(group.slots):
                if entry is None:
                    continue
                cohort, row = entry
                job = cohort.jobs[row]
                job.step += count
                self._event(job, group.loop, lambda slot=slot, batch=batch, drive=drive: drive.latents(batch)[slot])
            self._retire(group)
        for key in [k for k, g in self.groups.items() if not g.active and not g.queue]:
            del self.groups[key]

    def _drop_group(self, group: _Group, error: BaseException) -> None:
        """A batched step raised: fail every request it carried and forget the group's rows."""
        for cohort, row in [*filter(None, group.slots), *group.queue]:
            cohort.queued -= 1
            self._fail(cohort.jobs[row].root, error)
        group.slots = [None] * group.capacity
        group.queue.clear()

    def _admit(self, group: _Group) -> None:
        want = min(self.host.max_batch, ops.bucket(group.active + len(group.queue)))
        # Growing is needed; shrinking only saves compute, so a first (cold) call never pays a compile for
        # it: the group moves to a smaller capacity once its batched step exists, or when an earlier call
        # wanted it too (a repeated workload compiles it once, then runs at the better size).
        smaller = (group.layout, want)
        if want < group.capacity and smaller not in self.host.compiled and smaller not in self._wanted_before:
            self.host.wanted.add(smaller)
        elif want != group.capacity:
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
            s, r = ops.padded(slots, rows, group.capacity, cohort.size)
            group.batch = ops.admit(group.batch, cohort.state, s, r)

    def _resize(self, group: _Group, capacity: int) -> None:
        if capacity == group.capacity:
            return
        occupied = [s for s, entry in enumerate(group.slots) if entry is not None]
        keep = np.full((capacity,), -1, np.int32)
        keep[: len(occupied)] = occupied
        group.batch = ops.resize(group.kind, capacity, group.batch, keep)
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
            s, r = ops.padded(slots, rows, group.capacity, cohort.size)
            group.batch, cohort.state = ops.retire(group.kind, group.batch, cohort.state, s, r)
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
            try:
                slots, state = ops.enter(
                    r.program,
                    cohort.loop,
                    cohort.settings,
                    r.treedef,
                    r.leaves,
                    cohort.slots,
                    cohort.state,
                    self._schedule(cohort, cohort.loop),
                )
            except Exception as err:  # noqa: BLE001 - the requests prepared together fail together here
                self.cohorts.remove(cohort)
                for job in live:
                    self._fail(job.root, err)
                continue
            if state is None:
                self.cohorts.remove(cohort)
                for job, artifacts in zip(cohort.jobs, slots):
                    self._finish_job(job, None if job.cancelled_at else artifacts)
            else:
                self._after_enter(cohort, slots, state)


def _cancelled(request: Request) -> Output:
    """The ``Output`` of a request cancelled before it started."""
    return Output(request.model, {}, request, cancelled_at=(0, 0))


def _decoder_of(program: Program, loop: str) -> tuple[str, str, str] | None:
    """``(node name, slot, output)`` of the node decoding ``loop``'s result into an image / video, or ``None``."""
    nodes = list(program.nodes)
    at = next((i for i, n in enumerate(nodes) if isinstance(n, LoopNode) and n.loop == loop), None)
    if at is None:
        return None
    written = tuple(nodes[at].writes)
    for node in nodes[at + 1 :]:
        if not isinstance(node, ComponentNode) or node.loop is not None:
            continue
        out = next((w for w in node.writes if w in ("image", "video")), None)
        if out is not None and tuple(node.reads) == written:
            return node.name, written[0], out
    return None
