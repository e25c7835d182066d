"""The scheduler of one ``run_many`` call: requests, workflow flows, cohorts and batched groups.

It reaches the engine only through the narrow ``Host`` interface (look up a served model, bind a
request, resolve its cached nodes, hold back cards with a deferred publish), so it never reads
the engine's private state.

Modes: ``serial`` runs one request at a time, ``interleaved`` advances every request one step per
tick; both drive each loop's jitted pure step on one request (same compiled function, same
bits: C1). ``batched`` steps the rows of many requests as one jitted batched step (continuous
batching, C3).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from jaxpipe.engine import batch as ops
from jaxpipe.engine.publish import Resident
from jaxpipe.loops import registry as loop_kinds
from jaxpipe.program import Bound, Program
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow, WorkflowError, initial_state, record_stage

__all__ = ["Host", "Scheduler", "StepEvent", "MIN_WIDTH"]

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

    def release(self, in_flight: Callable[[str], bool]) -> None:
        """Apply the deferred publishes of every card not ``in_flight``."""

    compiled: set
    """``(group layout, capacity)`` pairs whose batched step has run (is compiled) on this engine."""

    wanted: set
    """``(group layout, capacity)`` pairs a group would have shrunk to, in calls so far."""


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
    return treedef, tuple((tuple(np.shape(x))[1:], str(getattr(x, "dtype", None) or np.asarray(x).dtype)) for x in leaves)


class Scheduler:
    """Runs requests to completion in one mode (``run``); outputs by root index in ``outputs``."""

    def __init__(self, host: Host, mode: str, on_step, cancel):
        self.host = host
        self.mode = mode
        self.on_step = on_step
        self.cancel = cancel
        self.outputs: dict[int, Output] = {}
        self.pending: list[_Job] = []
        self.cohorts: list[_Cohort] = []
        self.groups: dict[Any, _Group] = {}
        self.flows: list[_Flow] = []
        self.tick = 0
        self._wanted_before = set(host.wanted)

    # ---- the main loop -------------------------------------------------------------------

    def run(self, roots: Iterable[tuple[int, Request, Bound | None]]) -> None:
        """Runs ``roots`` to completion (or cancellation), filling ``outputs``.

        Args:
          roots: ``(index, request, bound)`` per request (``bound`` ``None`` for a workflow request).

        Raises:
          WorkflowError: on a workflow cycle at run time, or a stage that misbehaves.
        """
        for index, request, bound in roots:
            self._spawn(index, request, bound, flow=None, path="")
        while self.pending or self.cohorts:
            if self._cancelled():
                self._cancel_all()
                break
            self.host.release(self._in_flight)
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
        record_stage(flow.state, stage.label, output)
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
            texts = job.resident.program.texts_of(job.resident.card, artifacts)
            output = Output(job.request.model, {**artifacts, **texts, **job.bound.artifacts}, job.request)
        self._deliver(job, output)

    # ---- preparing cohorts -------------------------------------------------------------------

    def _in_flight(self, model_id: str) -> bool:
        """Whether a started request of card ``model_id`` is unfinished (a deferred publish waits for it)."""
        return any(cohort.resident.card.model_id == model_id for cohort in self.cohorts)

    def _start_pending(self) -> None:
        """Start every pending job whose card has no deferred publish (those wait for the swap)."""
        waiting = self.host.held()
        jobs = [job for job in self.pending if job.request.model not in waiting]
        self.pending = [job for job in self.pending if job.request.model in waiting]
        for job in jobs:
            # the card as it is now (a swap may have applied since the job was spawned); publish
            # keeps every static setting, so the job's Bound is still valid
            job.resident = self.host.resident(job.request.model)
            job.slots = self.host.prepare(job.resident, job.bound)
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
            for lo in range(0, len(members), self.host.max_batch):
                chunk = members[lo : lo + self.host.max_batch]
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
        for job in cohort.jobs:
            job.slots = None
        schedule = self._schedule(cohort, 0)
        slots, state = ops.enter(r.program, 0, cohort.settings, r.treedef, r.leaves, tuple(rows), None, schedule)
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
        """Serial and interleaved: every unfinished request advances one step (its own jitted step)."""
        for cohort in self.cohorts:
            job = cohort.jobs[0]
            if job.finished:
                continue
            r = cohort.resident
            cohort.state = ops.step(cohort.kind, cohort.node.loop, cohort.config, r.treedef, r.leaves, cohort.state)
            job.step += 1
            state, drive = cohort.state, loop_kinds.driver(cohort.kind)
            self._event(job, cohort.node.loop, lambda: drive.latents(state)[0])

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
            group = _Group(cohort.kind, cohort.node.loop, drive.batch_key(cohort.config), cohort.resident,
                           capacity, batch, [None] * capacity, deque(), layout)
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
            group.batch = ops.steps(group.kind, group.loop, group.config, r.treedef, r.leaves, group.batch, count)
            self.host.compiled.add((group.layout, group.capacity))
            batch, drive = group.batch, loop_kinds.driver(group.kind)
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
            slots, state = ops.enter(r.program, cohort.loop, cohort.settings, r.treedef, r.leaves,
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


