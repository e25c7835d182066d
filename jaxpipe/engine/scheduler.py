"""The scheduler: submitted requests, workflow flows and cohorts in flight, advanced one tick at a time.

It owns the requests in flight and nothing else: it reads the registry only through the read-only
``Served`` protocol (look up a served model, bind a request, which cards are held back by a pending
change), prepares a job's slots through the ``prepare`` function it is given (the feature cache), and
leaves how started requests step to its ``Strategy`` (``strategies``: serial, interleaved, batched).
Pending registry changes apply between the two halves of a tick, ``take`` and ``advance``, which the
engine drives (``Engine.tick``); ``in_flight(model_id)`` tells it when a card has drained.

Requests arrive through ``submit`` (any thread: an inbox the next ``take`` empties) and join the
running work at the next tick. Each root request has a ``Handle``; a request whose own work raises (a
workflow stage, a feature-cache node, entering or stepping its loop) fails alone, on its handle, and
the others go on: a cohort prepared together is retried one request at a time before any of them is
failed, and a batched step that raises fails the rows it carried.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from jaxpipe.engine import batch as ops
from jaxpipe.engine.handle import Event, Handle, Progress
from jaxpipe.engine.previews import Previews
from jaxpipe.engine.publish import Resident
from jaxpipe.engine.strategies import Strategy
from jaxpipe.engine.work import MIN_WIDTH, Cohort, Flow, Job, Load, StepEvent, cancelled, num_steps, schedule
from jaxpipe.program import Bound
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow, WorkflowError, initial_state, record_stage

__all__ = ["MIN_WIDTH", "Load", "Scheduler", "Served", "StepEvent"]  # the last three: re-exported from work

_log = logging.getLogger("jaxpipe.engine")


class Served(Protocol):
    """The scheduler's read-only view of the engine's registry."""

    def serves(self, model_id: str) -> bool:
        """Whether ``model_id`` is a served card or workflow."""

    def workflow(self, model_id: str) -> Workflow | None:
        """The workflow ``model_id``, or ``None`` when it is a card."""

    def resident(self, model_id: str) -> Resident:
        """The resident card ``model_id`` (``EngineError`` for an unknown id or a workflow)."""

    def bind(self, request: Request) -> Bound | None:
        """``request`` validated and bound to its card's program (``None`` for a workflow request)."""

    def held(self) -> frozenset[str]:
        """Cards with a pending change: their requests must not start yet."""


class Scheduler:
    """Runs submitted requests with one strategy, a tick at a time; each root request reports on its ``Handle``.

    Arguments:
      served: the registry, read only.
      prepare: ``(resident, bound) -> slots``: the bound slots plus the program's cached nodes' outputs.
      strategy: how started requests step (``strategies.make``).
      on_step: ``run_many``'s hook, called with a ``StepEvent`` after every loop step (``False`` cancels).
    """

    def __init__(
        self,
        served: Served,
        prepare: Callable[[Resident, Bound], dict[str, Any]],
        strategy: Strategy,
        on_step: Callable[[StepEvent], bool | None] | None = None,
    ):
        self.served = served
        self.prepare = prepare
        self.strategy = strategy
        self.on_step = on_step
        self.tick = 0
        self._handles: dict[int, Handle] = {}  # root index -> the handle of an unfinished root request
        self._inbox: deque = deque()  # (handle, bound) from submit, taken by the next tick (deque: thread-safe)
        self._pending: list[Job] = []
        self._cohorts: list[Cohort] = []
        self._flows: list[Flow] = []
        self._roots = itertools.count()
        self._previews = Previews()

    # ---- what the engine calls ------------------------------------------------------------

    def submit(self, handle: Handle, bound: Bound | None) -> None:
        """Queue ``handle``'s request (``bound``: its validated binding, ``None`` for a workflow request);
        it joins the running work at the next tick. Safe from any thread.

        Args:
          handle: the request's handle.
          bound: its binding, or ``None``.
        """
        self._inbox.append((handle, bound))

    @property
    def idle(self) -> bool:
        """Whether nothing is queued or running."""
        return not (self._inbox or self._handles or self._pending or self._cohorts)

    def in_flight(self, model_id: str) -> bool:
        """Whether a started request of card ``model_id`` is unfinished (a pending change waits for it).

        Args:
          model_id: a card id.

        Returns:
          Whether one is.
        """
        return any(cohort.resident.card.model_id == model_id for cohort in self._cohorts)

    def load(self) -> Load:
        """The requests queued and running, and the batch rows stepping."""
        running = sum(handle.status == "running" for handle in self._handles.values())
        rows = self.strategy.rows(self._cohorts)
        return Load(queued=len(self._inbox) + len(self._handles) - running, running=running, rows=rows)

    def take(self) -> None:
        """The first half of a tick: new requests join and cancelled ones leave (pending ones at once, stepping
        ones free their slot)."""
        while self._inbox:
            handle, bound = self._inbox.popleft()
            root = next(self._roots)
            self._handles[root] = handle
            if handle.cancel_requested:
                self._deliver_root(root, cancelled(handle.request))
                continue
            try:
                self._spawn(root, handle.request, bound, flow=None, path="")
            except Exception as err:  # noqa: BLE001 - the request's own error, reported on its handle
                self.fail(root, err)
        self._reap_cancelled()

    def advance(self) -> bool:
        """The second half of a tick: start what may start, advance every running request by one loop step (a
        fused ``Batched``: up to the next scheduling event), and move finished ones on.

        Returns:
          Whether work remains.
        """
        self._start_pending()
        if self._cohorts:
            self.tick += 1
            self.strategy.advance(self._cohorts, self)
            self._settle()
        return not self.idle

    def cancel_all(self) -> None:
        """Cancel everything (``run_many``'s ``cancel``): every unfinished request gets a cancelled ``Output``."""
        while self._inbox:
            handle, _ = self._inbox.popleft()
            handle.finish(cancelled(handle.request), None, self.tick)
        for job in self._pending:
            job.cancelled_at = (0, 0)
            self._finish_job(job, None)
        self._pending = []
        cohorts, self._cohorts = self._cohorts, []
        for cohort in cohorts:
            for job in cohort.jobs:
                job.cancel()
                self._finish_job(job, None)
        self.strategy.clear()
        while self._flows:
            self._deliver_flow_cancel(self._flows[0])
        for root in list(self._handles):
            self._deliver_root(root, cancelled(self._handles[root].request))

    # ---- what the strategy reports (``strategies.Reports``) -----------------------------------

    def stepped(self, job: Job, loop: str, latents: Callable[[], jax.Array]) -> None:
        """``job`` took a step of ``loop``: its handle's ``"step"`` event (with previews: the latents and their
        decoded image), then ``on_step`` (whose ``False`` cancels the job).

        Args:
          job: the job (``job.step`` counts the step).
          loop: the loop id.
          latents: slices the job's latents from the loop state.
        """
        handle = self._handles.get(job.root)
        if handle is None:
            return
        preview = image = None
        if handle.previews:
            preview = np.asarray(latents())
            image = self._previews.decode(job.resident, loop, preview)
        handle.record(
            Event("step", job.path, loop, job.step, job.total, self.tick, preview, image),
            progress=Progress(job.path, loop, job.step, job.total),
        )
        if self.on_step is None:
            return
        event = StepEvent(job.root, job.request, job.path, loop, job.step, job.total, self.tick, latents)
        if self.on_step(event) is False and not job.finished:
            job.cancelled_at = (job.step, job.total)

    def fail(self, root: int, error: BaseException) -> None:
        """Root request ``root`` failed: drop its work everywhere and report ``error`` on its handle.

        Args:
          root: the root request's index.
          error: its error.
        """
        handle = self._handles.pop(root, None)
        self._pending = [job for job in self._pending if job.root != root]
        self._flows = [flow for flow in self._flows if flow.root != root]
        for cohort in self._cohorts:
            for job in cohort.jobs:
                if job.root == root and not job.finished:
                    job.cancelled_at = (job.step, job.total)
        if handle is not None:
            _log.info("request %s (%r) failed: %s", handle.id, handle.request.model, error)
            handle.finish(None, error, self.tick)

    def _reap_cancelled(self) -> None:
        """Requests whose handle asked to cancel stop here: pending ones at once, stepping ones free their slot."""
        roots = {root for root, handle in self._handles.items() if handle.cancel_requested}
        if not roots:
            return
        for job in [job for job in self._pending if job.root in roots]:
            self._pending.remove(job)
            job.cancelled_at = (0, 0)
            self._finish_job(job, None)
        for cohort in self._cohorts:
            for job in cohort.jobs:
                if job.root in roots and not job.finished:
                    job.cancelled_at = (job.step, job.total)
                    self._finish_job(job, None)  # reported now; its row leaves the batch before the next step

    # ---- spawning requests and threading workflows ----------------------------------------

    def _spawn(self, root: int, request: Request, bound: Bound | None, flow: Flow | None, path: str) -> None:
        workflow = self.served.workflow(request.model)
        if workflow is not None:
            ancestry = (flow.ancestry if flow else ()) + (workflow.id,)
            if workflow.id in ancestry[:-1]:
                raise WorkflowError(f"workflow cycle at run time: {' -> '.join(ancestry)}")
            if len(ancestry) > 64:
                raise WorkflowError(f"workflows nested deeper than 64 levels: {' -> '.join(ancestry[:4])} -> ...")
            child = Flow(workflow, request, root, flow, path, ancestry, initial_state(request))
            self._flows.append(child)
            self._next_stage(child)
            return
        if bound is None:
            bound = self.served.bind(request)
        resident = self.served.resident(request.model)
        self._pending.append(Job(root, request, resident, bound, flow, path))

    def _next_stage(self, flow: Flow) -> None:
        stage = flow.workflow.stages[flow.stage]
        request = flow.workflow.build(stage, flow.state)
        if not self.served.serves(request.model):
            raise WorkflowError(
                f"workflow {flow.workflow.id!r}, stage {stage.label!r}: {request.model!r} is no longer served"
            )
        path = f"{flow.path}/{stage.label}" if flow.path else stage.label
        self._spawn(flow.root, request, None, flow, path)

    def _deliver_root(self, root: int, output: Output) -> None:
        handle = self._handles.pop(root, None)
        if handle is not None:
            handle.finish(output, None, self.tick)

    def _deliver(self, job_or_flow: Job | Flow, output: Output) -> None:
        flow = job_or_flow.flow if isinstance(job_or_flow, Job) else job_or_flow.parent
        root = job_or_flow.root
        if root not in self._handles:  # the request failed (or was delivered) already
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
            self._flows.remove(flow)
            artifacts = flow.workflow.finish(flow.state, output)
        except Exception as err:  # noqa: BLE001 - a workflow's own code failed: that request alone
            self.fail(root, err)
            return
        self._deliver(flow, Output(flow.workflow.id, artifacts, flow.request))

    def _deliver_flow_cancel(self, flow: Flow, at: tuple[int, int] | None = None) -> None:
        if flow in self._flows:
            self._flows.remove(flow)
        self._deliver(flow, cancelled(flow.request, at))

    def _finish_job(self, job: Job, artifacts: Mapping[str, Any] | None) -> None:
        if job.root not in self._handles:
            return
        if job.cancelled_at is not None:
            output = cancelled(job.request, job.cancelled_at)
        else:
            try:
                texts = job.resident.program.texts_of(job.resident.card, artifacts)
            except Exception as err:  # noqa: BLE001 - a card's tokenizer failed on this request's ids
                self.fail(job.root, err)
                return
            output = Output(job.request.model, {**artifacts, **texts, **job.bound.artifacts}, job.request)
        self._deliver(job, output)

    # ---- starting jobs and moving cohorts through their loops ------------------------------------

    def _start_pending(self) -> None:
        """Start the pending jobs whose card has no pending change (those wait for it to apply) that the
        strategy lets start; prepare their slots, then enter their cohorts' first loop."""
        waiting = self.served.held()
        ready = self.strategy.ready(
            [job for job in self._pending if job.request.model not in waiting], bool(self._cohorts)
        )
        self._pending = [job for job in self._pending if job not in ready]
        jobs = []
        for job in ready:
            try:
                # the card as it is now: a publish since the job was spawned keeps every static setting (its
                # Bound stays valid); a replacement may not, so the request is bound again to the new card
                resident = self.served.resident(job.request.model)
                if resident.card is not job.resident.card and resident.program is not job.resident.program:
                    job.bound = self.served.bind(job.request)
                job.resident = resident
                job.slots = self.prepare(job.resident, job.bound)
            except Exception as err:  # noqa: BLE001 - this request's own failure
                self.fail(job.root, err)
                continue
            jobs.append(job)
            handle = self._handles.get(job.root)
            if handle is not None and handle.status == "queued":  # the request's first job to start
                handle.record(Event("started", job.path, tick=self.tick), status="running", progress=Progress(job.path))
        for cohort in self.strategy.cohorts(jobs):
            self._start_cohort(cohort)

    def _start_cohort(self, cohort: Cohort) -> None:
        r = cohort.resident
        rows = [job.slots for job in cohort.jobs]
        rows += [rows[-1]] * (cohort.size - len(rows))  # padding rows: copies, dropped at the end
        try:
            first = schedule(cohort, 0)
            slots, state = ops.enter(r.program, 0, cohort.settings, r.treedef, r.leaves, tuple(rows), None, first)
        except Exception as err:  # noqa: BLE001 - find whose request it is: each alone, then fail that one
            if len(cohort.jobs) == 1:
                self.fail(cohort.jobs[0].root, err)
                return
            for job in cohort.jobs:
                size = ops.bucket(1) if cohort.width is not None else 1
                self._start_cohort(Cohort(job.resident, cohort.settings, cohort.width, [job], size))
            return
        for job in cohort.jobs:
            job.slots = None
        self._entered(cohort, slots, state)

    def _entered(self, cohort: Cohort, slots, state) -> None:
        """``cohort`` entered its next loop (``state``), or the program is done (``state is None``: ``slots``
        holds per-row artifacts)."""
        if state is None:
            if cohort in self._cohorts:
                self._cohorts.remove(cohort)
            for job, artifacts in zip(cohort.jobs, slots):
                self._finish_job(job, None if job.cancelled_at else artifacts)
            return
        cohort.slots, cohort.state = slots, state
        for job in cohort.jobs:
            job.step, job.total = 0, num_steps(job, cohort.node)
        if cohort not in self._cohorts:
            self._cohorts.append(cohort)
        self.strategy.entered(cohort)

    def _settle(self) -> None:
        """Cohorts whose every row has finished its loop (and left its group) enter their next loop or finish."""
        for cohort in list(self._cohorts):
            if not all(job.finished for job in cohort.jobs) or cohort.queued:
                continue
            live = [job for job in cohort.jobs if job.cancelled_at is None]
            if not live:
                self._cohorts.remove(cohort)
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
                    schedule(cohort, cohort.loop),
                )
            except Exception as err:  # noqa: BLE001 - the requests prepared together fail together here
                self._cohorts.remove(cohort)
                for job in live:
                    self.fail(job.root, err)
                continue
            self._entered(cohort, slots, state)
