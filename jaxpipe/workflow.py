"""Workflows: stages across registered cards *or* workflows, artifacts threaded stage to stage.

A ``Workflow`` has a dotted, namespaced id (``image_video.t2i_i2v``) in the same namespace as
card ids, so ``engine.run(Request(workflow_id, ...))`` works exactly like a card request. Each
``Stage`` declares the model it runs and builds its ``Request`` from the accumulated **state**:

* the initial inputs: ``"request"`` (the workflow's own request), ``"prompt"``, ``"seed"``,
  ``"num_steps"``, ``"guidance"``, ``"image"`` and every entry of ``request.inputs``;
* every earlier stage's artifacts under ``"<label>:<name>"`` (``"t2i:image"``), and
* ``"prev"``: the previous stage's ``Output``.

A stage whose request names a different model than it declares is an error. ``outputs``
picks the workflow's own artifacts from the final state (default: the last stage's); the
``Output`` also carries every stage's artifacts under ``"<label>:<name>"``.

``WorkflowRegistry`` rejects an id that collides with a served card or workflow, a stage whose
model is not served, and a cycle (a workflow reaching itself through its stages), each with a
message naming the problem; the engine guards against cycles at run time as well.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from jaxpipe import validate
from jaxpipe.request import Output, Request

__all__ = [
    "Stage",
    "Workflow",
    "WorkflowError",
    "WorkflowRegistry",
    "initial_state",
    "record_stage",
    "BUNDLED",
    "register_bundled",
    "bundled",
]

_ID = re.compile(r"^[a-z0-9][a-z0-9_\-]*(\.[a-z0-9][a-z0-9_\-]*)+$")
_LABEL = re.compile(r"^[A-Za-z0-9_\-]+$")


class WorkflowError(ValueError):
    """A workflow is ill-formed, cannot be registered, or a stage misbehaved at run time."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a workflow.

    Attributes:
      label: the stage's name (letters, digits, ``_``, ``-``); its artifacts are published as
        ``"<label>:<name>"``.
      model: the card or workflow id it runs.
      build: ``build(state) -> Request`` for that model, from the accumulated (read-only) state.

    Raises:
      WorkflowError: on a bad label or an empty model id.
    """

    label: str
    model: str
    build: Callable[[Mapping[str, Any]], Request]

    def __post_init__(self):
        validate.rule(
            isinstance(self.label, str) and bool(_LABEL.match(self.label)),
            f"stage label must be letters, digits, '_' or '-' (got {self.label!r})",
            error=WorkflowError,
        )
        validate.rule(
            isinstance(self.model, str) and bool(self.model),
            f"stage {self.label!r}: model must be a model id (got {self.model!r})",
            error=WorkflowError,
        )


@dataclasses.dataclass(frozen=True)
class Workflow:
    """Stages over registered cards or workflows (see the module docstring).

    Attributes:
      id: dotted, namespaced id, e.g. ``"image_video.t2i_i2v"``.
      stages: the stages, run in order.
      outputs: ``outputs(state) -> {artifact: value}``: the workflow's own artifacts (default: the
        last stage's artifacts under their plain names).
      check: ``check(request)``: raise ``ValueError`` on bad input before anything runs (optional).
      description: one line for ``engine.models()`` listings and errors.

    Raises:
      WorkflowError: on an id that is not dotted and namespaced, no stages, or duplicate stage labels.
    """

    id: str
    stages: tuple[Stage, ...]
    outputs: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    check: Callable[[Request], None] | None = None
    description: str = ""

    def __post_init__(self):
        validate.rule(
            isinstance(self.id, str) and bool(_ID.match(self.id)),
            f"workflow id must be dotted and namespaced, lowercase, like 'image_video.t2i_i2v' (got {self.id!r})",
            error=WorkflowError,
        )
        object.__setattr__(self, "stages", tuple(self.stages))
        validate.rule(bool(self.stages), f"workflow {self.id!r} has no stages", error=WorkflowError)
        labels = [s.label for s in self.stages]
        dupes = sorted({label for label in labels if labels.count(label) > 1})
        validate.rule(not dupes, f"workflow {self.id!r}: duplicate stage labels {dupes}", error=WorkflowError)

    @property
    def requires(self) -> tuple[str, ...]:
        """The model ids its stages run, in order, without repeats."""
        return tuple(dict.fromkeys(s.model for s in self.stages))

    def build(self, stage: Stage, state: Mapping[str, Any]) -> Request:
        """Stage ``stage``'s request from ``state``.

        Args:
          stage: one of the workflow's stages.
          state: the accumulated state (passed to ``stage.build`` read-only).

        Returns:
          The stage's ``Request``.

        Raises:
          WorkflowError: if ``build`` returns something other than a ``Request``, or one for another model.
        """
        request = stage.build(MappingProxyType(dict(state)))
        if not isinstance(request, Request):
            raise WorkflowError(
                f"workflow {self.id!r}, stage {stage.label!r}: build must return a Request (got {type(request).__name__})"
            )
        if request.model != stage.model:
            raise WorkflowError(
                f"workflow {self.id!r}, stage {stage.label!r} declares model {stage.model!r} "
                f"but built a request for {request.model!r}"
            )
        return request

    def finish(self, state: Mapping[str, Any], last: Output) -> dict[str, Any]:
        """The workflow's artifacts: ``outputs(state)`` (or the last stage's), then every stage's namespaced ones.

        Args:
          state: the final state.
          last: the last stage's ``Output``.

        Returns:
          ``{artifact: value}``, the own artifacts plus every ``"<label>:<name>"`` entry of ``state``.
        """
        own = dict(last) if self.outputs is None else dict(self.outputs(MappingProxyType(dict(state))))
        staged = {k: v for k, v in state.items() if ":" in k}
        return {**own, **staged}


def initial_state(request: Request) -> dict[str, Any]:
    """The state a workflow's first stage sees: the request, its fields and its extra ``inputs``.

    Args:
      request: the workflow's request.

    Returns:
      ``{"request", "prompt", "seed", "num_steps", "guidance", "image", **request.inputs}``.
    """
    state = {
        "request": request,
        "prompt": request.prompt,
        "seed": request.seed,
        "num_steps": request.num_steps,
        "guidance": request.guidance,
        "image": request.image,
    }
    state.update(request.inputs)
    return state


def record_stage(state: dict[str, Any], label: str, output: Output) -> None:
    """Adds a finished stage's artifacts to ``state`` as ``"<label>:<name>"``, and its output as ``"prev"``.

    Args:
      state: the accumulated state, updated in place.
      label: the stage's label.
      output: the stage's ``Output``.
    """
    for name, value in output.items():
        state[f"{label}:{name}"] = value
    state["prev"] = output


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------


class WorkflowRegistry:
    """Workflows by id, validated against the ids of the cards being served."""

    def __init__(self):
        self._workflows: dict[str, Workflow] = {}

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._workflows

    def __getitem__(self, model_id: str) -> Workflow:
        return self._workflows[model_id]

    def ids(self) -> list[str]:
        """The registered workflow ids, sorted."""
        return sorted(self._workflows)

    def remove(self, model_id: str) -> None:
        """Unregisters workflow ``model_id`` (``KeyError`` if it is not registered)."""
        del self._workflows[model_id]

    def dependents(self, model_id: str) -> list[str]:
        """Workflows with a stage that runs ``model_id``."""
        return sorted(w.id for w in self._workflows.values() if model_id in w.requires)

    def validate(self, workflow: Workflow, cards: Iterable[str], *, replace: bool = False) -> None:
        """Checks that ``workflow`` could be registered; nothing is changed.

        Args:
          workflow: the workflow.
          cards: the ids of the cards being served.
          replace: allow replacing a registered workflow of the same id.

        Raises:
          TypeError: if ``workflow`` is not a ``Workflow``.
          WorkflowError: if its id collides with a card or (without ``replace``) a workflow, it forms a
            cycle, or a stage runs a model that is not served.
        """
        if not isinstance(workflow, Workflow):
            raise TypeError(f"register_workflow takes a Workflow (got {type(workflow).__name__})")
        cards = set(cards)
        if workflow.id in cards:
            raise WorkflowError(f"workflow id {workflow.id!r} collides with a registered card of the same id")
        if workflow.id in self._workflows and not replace:
            raise WorkflowError(f"workflow {workflow.id!r} is already registered (pass replace=True to replace it)")
        graph = {w.id: w.requires for w in self._workflows.values()}
        graph[workflow.id] = workflow.requires
        cycle = _find_cycle(graph, workflow.id)
        if cycle:
            raise WorkflowError(f"workflow {workflow.id!r} forms a cycle: {' -> '.join(cycle)}")
        served = cards | set(graph)
        for stage in workflow.stages:
            if stage.model not in served:
                raise WorkflowError(
                    f"workflow {workflow.id!r}, stage {stage.label!r} requires {stage.model!r}, which is not registered; "
                    f"served models are {sorted(served - {workflow.id})}"
                )

    def add(self, workflow: Workflow, cards: Iterable[str], *, replace: bool = False) -> None:
        """Registers ``workflow`` after ``validate`` (same arguments, same errors)."""
        self.validate(workflow, cards, replace=replace)
        self._workflows[workflow.id] = workflow


def _find_cycle(graph: Mapping[str, tuple[str, ...]], start: str) -> list[str] | None:
    """A path ``start -> ... -> start`` through workflow ids in ``graph``, or ``None``."""
    path: list[str] = []
    seen: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for child in graph.get(node, ()):
            if child == start:
                return path + [start]
            if child in graph and child not in seen:
                seen.add(child)
                found = visit(child)
                if found:
                    return found
        path.pop()
        return None

    return visit(start)


# --------------------------------------------------------------------------------------------
# Bundled workflows
# --------------------------------------------------------------------------------------------

BUNDLED: dict[str, Callable[[], Workflow]] = {}
"""Workflow id -> a function building it: the workflows the worlds ship (``register_bundled``)."""


def register_bundled(workflow_id: str, factory: Callable[[], Workflow]) -> None:
    """Ships workflow ``workflow_id``, built by ``factory()``, with ``Engine.default()``.

    A world's ``register`` calls this. Re-registering an id replaces its factory.

    Args:
      workflow_id: a dotted id like ``"group.name"``.
      factory: builds the ``Workflow``.

    Raises:
      WorkflowError: if the id is not dotted and namespaced.
    """
    if not _ID.match(workflow_id):
        raise WorkflowError(f"workflow id must look like 'group.name' (got {workflow_id!r})")
    BUNDLED[workflow_id] = factory


def factory(workflow_id: str) -> Callable[..., Workflow]:
    """The function that builds bundled workflow ``workflow_id`` (after the worlds register theirs); a world's
    factory may take arguments (``image_video.t2i_i2v``: the ids of its two cards).

    Args:
      workflow_id: a bundled workflow's id.

    Returns:
      Its factory.

    Raises:
      WorkflowError: if no world ships ``workflow_id``.
    """
    from jaxpipe import worlds

    worlds.load()
    if workflow_id not in BUNDLED:
        raise WorkflowError(f"no bundled workflow {workflow_id!r}; bundled: {sorted(BUNDLED)}")
    return BUNDLED[workflow_id]


def bundled() -> tuple[Workflow, ...]:
    """The workflows ``Engine.default()`` registers (each where its cards are served), after the bundled
    worlds register theirs (``jaxpipe.worlds``)."""
    from jaxpipe import worlds  # the worlds sit above this module and register into it

    worlds.load()
    return tuple(factory() for factory in BUNDLED.values())
