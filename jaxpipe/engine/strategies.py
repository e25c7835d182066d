"""How a scheduler steps the requests it has started: ``Serial``, ``Interleaved`` and ``Batched`` (fused or not).

A strategy decides which ready jobs may start (``ready``), how started jobs are prepared together
(``cohorts``), what happens when a cohort enters a loop (``entered``) and how one tick advances the running
cohorts (``advance``); it reports each step and each failure back through the scheduler's ``Reports``.

* ``Serial`` runs one request at a time, ``Interleaved`` advances every request one step per tick; both drive
  each loop's jitted pure step on one request (the same compiled function, the same bits: C1).
* ``Batched`` steps the rows of many requests as one jitted batched step (continuous batching, C3): rows join
  a ``Group`` of slots, step together, and leave after their own last step. With ``fuse`` the steps between
  scheduling events run as one call (``run_many`` without hooks: nothing can join or watch in between).

``make(mode, ...)`` gives the strategy a mode name stands for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from jaxpipe.engine import batch as ops
from jaxpipe.engine.errors import EngineError
from jaxpipe.engine.work import Cohort, Group, Job, batch_settings, row_layout, width
from jaxpipe.loops import registry as loop_kinds

__all__ = ["MODES", "Batched", "Interleaved", "Reports", "Serial", "Strategy", "make"]

MODES = ("serial", "interleaved", "batched")
"""The mode names ``make`` (and ``Engine(mode=...)``, ``run_many(mode=...)``) accept."""


class Reports(Protocol):
    """What a strategy tells its scheduler."""

    def stepped(self, job: Job, loop: str, latents: Callable[[], jax.Array]) -> None:
        """``job`` took a step of ``loop`` (``job.step`` already counts it); ``latents()`` slices its state."""

    def fail(self, root: int, error: BaseException) -> None:
        """Root request ``root`` failed with ``error``: drop its work and report it."""


class Strategy(Protocol):
    """How a scheduler starts and steps requests (``Serial``, ``Interleaved``, ``Batched``)."""

    name: str

    def ready(self, jobs: list[Job], running: bool) -> list[Job]:
        """Which of the ready ``jobs`` start now (``running``: whether any cohort is in flight)."""

    def cohorts(self, jobs: list[Job]) -> list[Cohort]:
        """The started ``jobs`` prepared together, as cohorts to enter their first loop."""

    def entered(self, cohort: Cohort) -> None:
        """``cohort`` entered a loop (its state is set)."""

    def advance(self, cohorts: list[Cohort], reports: Reports) -> None:
        """One tick: every running cohort's rows take their step(s)."""

    def rows(self, cohorts: list[Cohort]) -> int:
        """The batch rows stepping."""

    def clear(self) -> None:
        """Forget every row (everything was cancelled)."""

    def learned(self) -> tuple[frozenset, frozenset]:
        """``(group layout, capacity)`` pairs compiled, and those a group wanted to shrink to, so far."""


def _every(jobs: list[Job], running: bool) -> list[Job]:
    """Every ready job starts (``ready`` of ``Interleaved`` and ``Batched``).

    Args:
      jobs: the ready jobs.
      running: whether anything runs.

    Returns:
      ``jobs``.
    """
    return jobs


class Interleaved:
    """Every started request advances one step per tick, through its own jitted step (C1 with ``Serial``)."""

    name = "interleaved"

    ready = staticmethod(_every)

    def cohorts(self, jobs: list[Job]) -> list[Cohort]:
        """One cohort per job.

        Args:
          jobs: the started jobs.

        Returns:
          The cohorts.
        """
        return [Cohort(job.resident, job.bound.settings, None, [job], 1) for job in jobs]

    def entered(self, cohort: Cohort) -> None:
        """Nothing to do: the cohort steps alone.

        Args:
          cohort: the cohort.
        """

    def advance(self, cohorts: list[Cohort], reports: Reports) -> None:
        """Every unfinished request advances one step (its own jitted step).

        Args:
          cohorts: the running cohorts (one job each).
          reports: the scheduler.
        """
        for cohort in cohorts:
            job = cohort.jobs[0]
            if job.finished:
                continue
            r = cohort.resident
            try:
                cohort.state = ops.step(cohort.kind, cohort.node.loop, cohort.config, r.treedef, r.leaves, cohort.state)
            except Exception as err:  # noqa: BLE001 - this request's step failed: it alone
                reports.fail(job.root, err)
                continue
            job.step += 1
            state, drive = cohort.state, loop_kinds.driver(cohort.kind)
            reports.stepped(job, cohort.node.loop, lambda state=state, drive=drive: drive.latents(state)[0])

    def rows(self, cohorts: list[Cohort]) -> int:
        """One row per unfinished request.

        Args:
          cohorts: the running cohorts.

        Returns:
          The count.
        """
        return sum(not c.jobs[0].finished for c in cohorts)

    def clear(self) -> None:
        """Nothing held."""

    def learned(self) -> tuple[frozenset, frozenset]:
        """Nothing: no batched steps."""
        return frozenset(), frozenset()


class Serial(Interleaved):
    """One request at a time, to completion: ``Interleaved`` with only the earliest request's jobs started,
    once nothing else runs."""

    name = "serial"

    def ready(self, jobs: list[Job], running: bool) -> list[Job]:
        """The earliest request's ready jobs, once nothing runs.

        Args:
          jobs: the ready jobs.
          running: whether anything runs.

        Returns:
          The jobs to start.
        """
        if not jobs or running:
            return []
        first = min(job.root for job in jobs)
        return [job for job in jobs if job.root == first]


class Batched:
    """Rows of many requests step as one jitted batched step (continuous batching).

    Arguments:
      max_batch: the most rows one batched step carries.
      fuse: run the steps between scheduling events as one call.
      cohort_rows: the most requests prepared together as one cohort (``None``: ``max_batch``). A live engine
        prepares each request alone (1): arrivals come in every count, and each distinct cohort size would
        compile its own entry, decode and row moves against every batch capacity; alone, one compiled entry
        serves them all, and the rows still step together.
      compiled: whether the engine has compiled a ``(group layout, capacity)`` pair (read only).
      wanted: the pairs a group of an earlier call wanted to shrink to.
    """

    name = "batched"

    def __init__(
        self,
        max_batch: int,
        *,
        fuse: bool = False,
        cohort_rows: int | None = None,
        compiled: Callable[[tuple], bool] = lambda key: False,
        wanted: frozenset = frozenset(),
    ):
        self.max_batch = max_batch
        self.fuse = fuse
        self.cohort_rows = cohort_rows
        self._known = compiled
        self._wanted_before = frozenset(wanted)
        self._compiled: set = set()  # pairs this strategy's steps compiled
        self._wanted: set = set()  # pairs its groups wanted to shrink to
        self._groups: dict[Any, Group] = {}

    ready = staticmethod(_every)

    def cohorts(self, jobs: list[Job]) -> list[Cohort]:
        """Jobs of one card, settings up to step counts, schedule width and slot shapes, in cohorts of at most
        ``cohort_rows`` (each padded to a batch size).

        Args:
          jobs: the started jobs (their slots prepared).

        Returns:
          The cohorts.
        """
        buckets: dict[Any, list[Job]] = {}
        for job in jobs:
            wide = width(job)
            shapes = tuple((k, row_layout(v)) for k, v in sorted(job.slots.items()))
            key = (id(job.resident), batch_settings(job, wide), wide, shapes)
            buckets.setdefault(key, []).append(job)
        cohorts = []
        for (_, settings, wide, _), members in buckets.items():
            rows = min(self.max_batch, self.cohort_rows or self.max_batch)
            for lo in range(0, len(members), rows):
                chunk = members[lo : lo + rows]
                cohorts.append(Cohort(chunk[0].resident, settings, wide, chunk, ops.bucket(len(chunk))))
        return cohorts

    def entered(self, cohort: Cohort) -> None:
        """Queue the cohort's live rows for the group of its card, loop, batch key and state shapes.

        Args:
          cohort: the cohort, its loop state set.
        """
        drive = loop_kinds.driver(cohort.kind)
        shapes = tuple((a.shape[1:], str(a.dtype)) for a in jax.tree.leaves(cohort.state))
        config = drive.batch_key(cohort.config)
        key = (id(cohort.resident), cohort.node.loop, config, shapes)
        group = self._groups.get(key)
        rows = [(cohort, i) for i, job in enumerate(cohort.jobs) if job.cancelled_at is None]
        if group is None:
            capacity = min(self.max_batch, ops.bucket(len(rows)))
            batch = ops.empty(cohort.kind, capacity, cohort.state)
            layout = (cohort.resident.card.model_id, cohort.node.loop, config, shapes)
            group = Group(
                cohort.kind,
                cohort.node.loop,
                config,
                cohort.resident,
                capacity,
                batch,
                [None] * capacity,
                deque(),
                layout,
            )
            self._groups[key] = group
        group.queue.extend(rows)
        cohort.queued += len(rows)

    def advance(self, cohorts: list[Cohort], reports: Reports) -> None:
        """Retire finished rows, admit waiting ones, then one batched step per group (``fuse``: up to the
        next row's last step), retiring the rows it finished.

        Args:
          cohorts: the running cohorts (their rows are in the groups).
          reports: the scheduler.
        """
        for group in self._groups.values():
            self._retire(group)  # rows cancelled since the last tick free their slots first
            self._admit(group)
        live = [g for g in self._groups.values() if g.active]
        if not live:
            return
        remaining = [job.total - job.step for g in live for c, i in filter(None, g.slots) for job in [c.jobs[i]]]
        count = max(1, min(remaining)) if self.fuse else 1
        for group in live:
            r = group.resident
            try:
                group.batch = ops.steps(group.kind, group.loop, group.config, r.treedef, r.leaves, group.batch, count)
            except Exception as err:  # noqa: BLE001 - the rows this step carried fail; other groups go on
                self._drop(group, err, reports)
                continue
            self._compiled.add((group.layout, group.capacity))
            batch, drive = group.batch, loop_kinds.driver(group.kind)
            for slot, entry in enumerate(group.slots):
                if entry is None:
                    continue
                cohort, row = entry
                job = cohort.jobs[row]
                job.step += count
                reports.stepped(job, group.loop, lambda slot=slot, batch=batch, drive=drive: drive.latents(batch)[slot])
            self._retire(group)
        for key in [k for k, g in self._groups.items() if not g.active and not g.queue]:
            del self._groups[key]

    def rows(self, cohorts: list[Cohort]) -> int:
        """The slots holding a row, over every group.

        Args:
          cohorts: the running cohorts.

        Returns:
          The count.
        """
        return sum(g.active for g in self._groups.values())

    def clear(self) -> None:
        """Forget every group."""
        self._groups = {}

    def learned(self) -> tuple[frozenset, frozenset]:
        """The pairs this strategy compiled, and those its groups wanted to shrink to."""
        return frozenset(self._compiled), frozenset(self._wanted)

    def _compiled_or_known(self, key: tuple) -> bool:
        return key in self._compiled or self._known(key)

    def _drop(self, group: Group, error: BaseException, reports: Reports) -> None:
        """A batched step raised: fail every request it carried and forget the group's rows."""
        for cohort, row in [*filter(None, group.slots), *group.queue]:
            cohort.queued -= 1
            reports.fail(cohort.jobs[row].root, error)
        group.slots = [None] * group.capacity
        group.queue.clear()

    def _admit(self, group: Group) -> None:
        want = min(self.max_batch, ops.bucket(group.active + len(group.queue)))
        # Growing is needed; shrinking only saves compute, so a first (cold) call never pays a compile for
        # it: the group moves to a smaller capacity once its batched step exists, or when an earlier call
        # wanted it too (a repeated workload compiles it once, then runs at the better size).
        smaller = (group.layout, want)
        if want < group.capacity and not self._compiled_or_known(smaller) and smaller not in self._wanted_before:
            self._wanted.add(smaller)
        elif want != group.capacity:
            _resize(group, want)
        free = [s for s, entry in enumerate(group.slots) if entry is None]
        admitted: dict[int, tuple[Cohort, list, list]] = {}
        while free and group.queue:
            cohort, row = group.queue.popleft()
            if cohort.jobs[row].cancelled_at is not None:
                cohort.queued -= 1
                continue
            slot = free.pop(0)
            group.slots[slot] = (cohort, row)
            _note(admitted, cohort, slot, row)
        for cohort, slots, rows in admitted.values():
            s, r = ops.padded(slots, rows, group.capacity, cohort.size)
            group.batch = ops.admit(group.batch, cohort.state, s, r)

    def _retire(self, group: Group) -> None:
        leaving: dict[int, tuple[Cohort, list, list]] = {}
        for slot, entry in enumerate(group.slots):
            if entry is None:
                continue
            cohort, row = entry
            if cohort.jobs[row].finished:
                group.slots[slot] = None
                _note(leaving, cohort, slot, row)
        for cohort, slots, rows in leaving.values():
            s, r = ops.padded(slots, rows, group.capacity, cohort.size)
            group.batch, cohort.state = ops.retire(group.kind, group.batch, cohort.state, s, r)
            cohort.queued -= len(rows)


def _note(moves: dict, cohort: Cohort, slot: int, row: int) -> None:
    """Record that ``cohort``'s ``row`` moves through batch ``slot`` (grouped per cohort, in order)."""
    moves.setdefault(id(cohort), (cohort, [], []))
    moves[id(cohort)][1].append(slot)
    moves[id(cohort)][2].append(row)


def _resize(group: Group, capacity: int) -> None:
    """Move the group's rows into a batch of ``capacity`` slots (occupied slots first, in order)."""
    occupied = [s for s, entry in enumerate(group.slots) if entry is not None]
    keep = np.full((capacity,), -1, np.int32)
    keep[: len(occupied)] = occupied
    group.batch = ops.resize(group.kind, capacity, group.batch, keep)
    group.slots = [group.slots[s] for s in occupied] + [None] * (capacity - len(occupied))
    group.capacity = capacity


def make(
    mode: str,
    max_batch: int,
    *,
    fuse: bool = False,
    cohort_rows: int | None = None,
    compiled: Callable[[tuple], bool] = lambda key: False,
    wanted: frozenset | Sequence = frozenset(),
) -> Strategy:
    """The strategy ``mode`` names.

    Args:
      mode: one of ``MODES``.
      max_batch: the most rows one batched step carries.
      fuse: ``Batched``: run the steps between scheduling events as one call.
      cohort_rows: ``Batched``: the most requests prepared together.
      compiled: ``Batched``: the engine's compiled ``(layout, capacity)`` lookup.
      wanted: ``Batched``: the pairs earlier calls wanted to shrink to.

    Returns:
      The strategy.

    Raises:
      EngineError: for a mode outside ``MODES``.
    """
    if mode not in MODES:
        raise EngineError(f"mode must be one of {MODES} (got {mode!r})")
    if mode == "batched":
        return Batched(max_batch, fuse=fuse, cohort_rows=cohort_rows, compiled=compiled, wanted=frozenset(wanted))
    return Serial() if mode == "serial" else Interleaved()
