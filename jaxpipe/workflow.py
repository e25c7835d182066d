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

from jaxpipe.request import MAX_SEED, Output, Request

__all__ = [
    "Stage",
    "Workflow",
    "WorkflowError",
    "WorkflowRegistry",
    "initial_state",
    "record_stage",
    "t2i_i2v",
    "t2i_i2v_extended",
    "t2v_continue",
    "bundled",
]

_ID = re.compile(r"^[a-z0-9][a-z0-9_\-]*(\.[a-z0-9][a-z0-9_\-]*)+$")
_LABEL = re.compile(r"^[A-Za-z0-9_\-]+$")


class WorkflowError(ValueError):
    """A workflow is ill-formed, cannot be registered, or a stage misbehaved at run time."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: ``label`` (artifacts are published as ``"<label>:<name>"``), the ``model`` (card
    or workflow id) it runs, and ``build(state) -> Request`` for that model."""

    label: str
    model: str
    build: Callable[[Mapping[str, Any]], Request]

    def __post_init__(self):
        if not isinstance(self.label, str) or not _LABEL.match(self.label):
            raise WorkflowError(f"stage label must be letters, digits, '_' or '-' (got {self.label!r})")
        if not isinstance(self.model, str) or not self.model:
            raise WorkflowError(f"stage {self.label!r}: model must be a model id (got {self.model!r})")


@dataclasses.dataclass(frozen=True)
class Workflow:
    """Stages over registered cards or workflows (see the module docstring).

    Arguments:
      id: dotted, namespaced id, e.g. ``"image_video.t2i_i2v"``.
      stages: the stages, run in order.
      outputs: ``outputs(state) -> {artifact: value}``: the workflow's own artifacts (default: the
        last stage's artifacts under their plain names).
      check: ``check(request)``: raise ``ValueError`` on bad input before anything runs (optional).
      description: one line for ``engine.models()`` listings and errors.
    """

    id: str
    stages: tuple[Stage, ...]
    outputs: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    check: Callable[[Request], None] | None = None
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.id, str) or not _ID.match(self.id):
            raise WorkflowError(
                f"workflow id must be dotted and namespaced, lowercase, like 'image_video.t2i_i2v' (got {self.id!r})"
            )
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise WorkflowError(f"workflow {self.id!r} has no stages")
        labels = [s.label for s in self.stages]
        dupes = sorted({l for l in labels if labels.count(l) > 1})
        if dupes:
            raise WorkflowError(f"workflow {self.id!r}: duplicate stage labels {dupes}")

    @property
    def requires(self) -> tuple[str, ...]:
        """The model ids its stages run, in order, without repeats."""
        return tuple(dict.fromkeys(s.model for s in self.stages))

    def build(self, stage: Stage, state: Mapping[str, Any]) -> Request:
        """Stage ``stage``'s request from ``state``; ``WorkflowError`` if it names another model."""
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
        """The workflow's artifacts: ``outputs(state)`` (or the last stage's), then every stage's namespaced ones."""
        own = dict(last) if self.outputs is None else dict(self.outputs(MappingProxyType(dict(state))))
        staged = {k: v for k, v in state.items() if ":" in k}
        return {**own, **staged}


def initial_state(request: Request) -> dict[str, Any]:
    """The state a workflow's first stage sees: the request, its fields and its extra ``inputs``."""
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
    """Add a finished stage's artifacts to ``state`` as ``"<label>:<name>"`` and as ``"prev"``."""
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
        return sorted(self._workflows)

    def remove(self, model_id: str) -> None:
        del self._workflows[model_id]

    def dependents(self, model_id: str) -> list[str]:
        """Workflows with a stage that runs ``model_id``."""
        return sorted(w.id for w in self._workflows.values() if model_id in w.requires)

    def validate(self, workflow: Workflow, cards: Iterable[str], *, replace: bool = False) -> None:
        """Raise ``WorkflowError`` unless ``workflow`` could be registered (nothing is changed)."""
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


def _parts(prompt: str | None) -> tuple[str, str]:
    """The image prompt and the motion prompt (``"<digit> still"`` when the prompt has no motion)."""
    from jaxpipe.data import split_prompt

    if prompt is None:
        raise ValueError("image_video workflows need a prompt, e.g. prompt='seven thick moving right'")
    image, motion = split_prompt(prompt)
    if motion is None:
        motion = split_prompt(f"{image} still")[1]
    return image, motion


def _check_prompt(request: Request) -> None:
    _parts(request.prompt)


def _settings(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"seed": state["seed"], "num_steps": state["num_steps"], "guidance": state["guidance"]}


def _text_to_image(state: Mapping[str, Any]) -> Request:
    return Request("flux-t2i", prompt=_parts(state["prompt"])[0], **_settings(state))


def _image_to_video(state: Mapping[str, Any]) -> Request:
    return Request("wan-i2v", prompt=_parts(state["prompt"])[1], image=state["t2i:image"], **_settings(state))


def _t2i_i2v_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    return {"video": state["i2v:video"], "image": state["t2i:image"]}


def t2i_i2v(t2i: str = "flux-t2i", i2v: str = "wan-i2v", workflow_id: str = "image_video.t2i_i2v") -> Workflow:
    """Text -> image -> video across two cards.

    ``t2i`` renders the image part of the prompt (``split_prompt``); ``i2v`` animates that image
    with the motion part (``"<digit> still"`` if the prompt names no motion). Artifacts:
    ``"video"`` ``(T, H, W, C)`` and ``"image"`` ``(H, W, C)``, both in [0, 1], plus the stages'
    own (``"t2i:text"``, ``"i2v:latents"``, ...).
    """
    text_to_image = _text_to_image if t2i == "flux-t2i" else (lambda s: _text_to_image(s).replace(model=t2i))
    image_to_video = _image_to_video if i2v == "wan-i2v" else (lambda s: _image_to_video(s).replace(model=i2v))
    return Workflow(
        id=workflow_id,
        stages=(Stage("t2i", t2i, text_to_image), Stage("i2v", i2v, image_to_video)),
        outputs=_t2i_i2v_outputs,
        check=_check_prompt,
        description=f"text -> image ({t2i}) -> video ({i2v})",
    )


def _extend(state: Mapping[str, Any]) -> Request:
    last = state["base:video"][-1]
    return Request("wan-i2v", prompt=_parts(state["prompt"])[1], image=last, **{**_settings(state), "seed": (state["seed"] + 1) % (MAX_SEED + 1)})


def _extended_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    import jax.numpy as jnp

    video = jnp.concatenate([state["base:video"], state["more:video"][1:]], axis=0)
    return {"video": video, "image": state["base:image"]}


def t2i_i2v_extended(base: str = "image_video.t2i_i2v", workflow_id: str = "image_video.t2i_i2v_extended") -> Workflow:
    """A nested workflow: run ``base`` (text -> image -> video), then animate its last frame again
    with the same motion and join the clips: ``"video"`` ``(2T - 1, H, W, C)``."""
    return Workflow(
        id=workflow_id,
        stages=(Stage("base", base, lambda s: Request(base, prompt=s["prompt"], **_settings(s))), Stage("more", "wan-i2v", _extend)),
        outputs=_extended_outputs,
        check=_check_prompt,
        description=f"{base}, then its last frame animated again (twice as long)",
    )


def _continue(state: Mapping[str, Any]) -> Request:
    inputs = {"video": state["t2v:video"]}
    if state.get("chunks") is not None:
        inputs["chunks"] = state["chunks"]
    return Request("wan-causal", prompt=state["prompt"], inputs=inputs, **{**_settings(state), "seed": (state["seed"] + 1) % (MAX_SEED + 1)})


def _continued_outputs(state: Mapping[str, Any]) -> dict[str, Any]:
    import jax.numpy as jnp

    first = state["t2v:video"]
    return {"video": jnp.concatenate([first, state["more:video"][first.shape[0] :]], axis=0)}


def _check_video_prompt(request: Request) -> None:
    if request.prompt is None:
        raise ValueError("video.t2v_continue needs a prompt, e.g. prompt='seven moving right'")


def t2v_continue(t2v: str = "wan-t2v", causal: str = "wan-causal", workflow_id: str = "video.t2v_continue") -> Workflow:
    """Video continuation: ``t2v`` renders a video from the prompt, then ``causal`` extends it by more chunks
    conditioned on all of its frames (prefilled into its chunk KV cache). ``inputs={"chunks": n}`` sets
    how many (default the causal card's). Artifacts: ``"video"`` ``(T + n·F, H, W, C)`` in [0, 1] (the
    first video's frames exactly, then the new ones), plus ``"t2v:video"``, ``"more:video"`` ...
    """
    first = (lambda s: Request(t2v, prompt=s["prompt"], **_settings(s)))
    more = _continue if causal == "wan-causal" else (lambda s: _continue(s).replace(model=causal))
    return Workflow(
        id=workflow_id,
        stages=(Stage("t2v", t2v, first), Stage("more", causal, more)),
        outputs=_continued_outputs,
        check=_check_video_prompt,
        description=f"text -> video ({t2v}), then continued chunk by chunk ({causal})",
    )


def bundled() -> tuple[Workflow, ...]:
    """The workflows ``Engine.default()`` registers (those whose cards are bundled)."""
    return (t2i_i2v(), t2i_i2v_extended(), t2v_continue())
