"""The scheduler's units of work: a card request in flight (``Job``), a workflow request (``Flow``), requests
prepared together (``Cohort``) and the slots of one batched step (``Group``), plus what the engine reports of
them (``StepEvent`` to ``on_step``, ``Load``).

A ``Job`` is one card request from its start to its artifacts; a ``Cohort`` carries one or more jobs through a
program's loops (one row each, padded to ``size``); in the batched strategy a cohort's rows step inside a
``Group`` with the rows of other cohorts of the same card, loop and shapes. The functions below read a job's
loop driver and settings: the step count, the schedule width of a batched cohort and each row's schedule.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxpipe.engine import batch as ops
from jaxpipe.engine.publish import Resident
from jaxpipe.loops import registry as loop_kinds
from jaxpipe.program import Bound, Program
from jaxpipe.request import Output, Request
from jaxpipe.workflow import Workflow

__all__ = [
    "Cohort",
    "Flow",
    "Group",
    "Job",
    "Load",
    "MIN_WIDTH",
    "StepEvent",
    "batch_settings",
    "cancelled",
    "num_steps",
    "row_layout",
    "schedule",
    "width",
]

MIN_WIDTH = 64
"""Batched loops pad schedules to at least this many steps, so nearly all step counts share a group."""


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
class Flow:
    """A workflow request in flight: its state and the stage it waits on."""

    workflow: Workflow
    request: Request
    root: int
    parent: Flow | None
    path: str
    ancestry: tuple[str, ...]
    state: dict
    stage: int = 0


@dataclasses.dataclass(eq=False)
class Job:
    """A card request in flight: its root request, card, binding, loop steps done of ``total``."""

    root: int
    request: Request
    resident: Resident
    bound: Bound
    flow: Flow | None
    path: str
    slots: dict | None = None
    step: int = 0
    total: int = 0
    cancelled_at: tuple[int, int] | None = None

    @property
    def finished(self) -> bool:
        """Whether the job is cancelled or has run its loop's steps."""
        return self.cancelled_at is not None or self.step >= self.total

    def cancel(self) -> None:
        """Mark the job cancelled where it is (a job already cancelled keeps its first position)."""
        if self.cancelled_at is None:
            self.cancelled_at = (self.step, self.total)


@dataclasses.dataclass(eq=False)
class Cohort:
    """Jobs prepared together (same card, program, settings up to step counts, and shapes): ``size``
    rows, the first ``len(jobs)`` real. Holds their slots and loop state between loops.
    ``settings`` are the cohort's (in batched mode each loop's config has ``num_steps = width``
    and every row gets its own schedule); each job keeps its own in ``job.bound.settings``."""

    resident: Resident
    settings: Any
    width: int | None
    jobs: list[Job]
    size: int
    loop: int = 0
    slots: Any = None
    state: Any = None
    queued: int = 0  # rows admitted into / waiting for a group and not yet retired

    @property
    def program(self) -> Program:
        """The program the cohort runs."""
        return self.resident.program

    @property
    def node(self):
        """The loop node the cohort is in."""
        return self.program.loops[self.loop]

    @property
    def config(self):
        """The cohort's config of its current loop."""
        return dict(self.settings)[self.node.loop]

    @property
    def kind(self) -> str:
        """Its current loop's kind (``loops.registry``)."""
        return self.resident.card.spec.loop(self.node.loop).kind


@dataclasses.dataclass(eq=False)
class Group:
    """Slots of one batched step: cohorts' rows with equal card, loop, batch key and row shapes."""

    kind: str
    loop: str
    config: Any
    resident: Resident
    capacity: int
    batch: Any
    slots: list  # slot -> (cohort, row) or None
    queue: deque
    layout: tuple = ()  # what its compiled step depends on besides the capacity (the engine's compiled keys)

    @property
    def active(self) -> int:
        """The slots holding a row."""
        return sum(s is not None for s in self.slots)


def row_layout(slot: Any) -> tuple:
    """What must agree for two requests' slot to share a batch: its tree, per-row shapes and dtypes.

    Args:
      slot: one slot's value (a pytree with a leading row axis).

    Returns:
      ``(treedef, ((row shape, dtype), ...))``.
    """
    leaves, treedef = jax.tree.flatten(slot)
    return treedef, tuple(
        (tuple(np.shape(x))[1:], str(getattr(x, "dtype", None) or np.asarray(x).dtype)) for x in leaves
    )


def _driver(job: Job, node):
    return loop_kinds.driver(job.resident.card.spec.loop(node.loop).kind)


def _config(job: Job, node):
    return dict(job.bound.settings)[node.loop]


def num_steps(job: Job, node) -> int:
    """The steps ``job`` runs in the loop of ``node`` (its own settings).

    Args:
      job: the job.
      node: a loop node of its program.

    Returns:
      The step count.
    """
    return _driver(job, node).num_steps(_config(job, node))


def width(job: Job) -> int | None:
    """The schedule width of the job's batched loops: a power of two >= every loop's steps (min ``MIN_WIDTH``).

    Args:
      job: the job.

    Returns:
      The width, or ``None`` for a program without loops.
    """
    steps = [num_steps(job, node) for node in job.resident.program.loops]
    return max(MIN_WIDTH, ops.pow2(max(steps))) if steps else None


def batch_settings(job: Job, wide: int | None):
    """The job's settings with every loop config widened to ``wide`` steps (``LoopDriver.batch_config``).

    Args:
      job: the job.
      wide: the schedule width (``width``).

    Returns:
      The settings, as ``job.bound.settings`` holds them.
    """
    loops = {node.loop: node for node in job.resident.program.loops}
    return tuple(
        (key, _driver(job, loops[key]).batch_config(config, wide) if key in loops else config)
        for key, config in job.bound.settings
    )


def schedule(cohort: Cohort, index: int):
    """Per-row schedules ``(size, ...)`` for loop ``index`` (batched cohorts), else ``None``.

    Args:
      cohort: the cohort.
      index: the loop's index in its program.

    Returns:
      The stacked schedules, padded with copies of the last row, or ``None``.
    """
    if cohort.width is None or index >= len(cohort.program.loops):
        return None
    node = cohort.program.loops[index]
    rows = [_driver(job, node).schedule(_config(job, node), cohort.width) for job in cohort.jobs]
    rows += [rows[-1]] * (cohort.size - len(rows))
    return np.stack(rows)


def cancelled(request: Request, at: tuple[int, int] | None = None) -> Output:
    """The ``Output`` of a request cancelled at ``at`` (``(0, 0)``: before it started).

    Args:
      request: the request.
      at: ``(steps done, steps)`` where it stopped.

    Returns:
      The ``Output``, with no artifacts.
    """
    return Output(request.model, {}, request, cancelled_at=at or (0, 0))
