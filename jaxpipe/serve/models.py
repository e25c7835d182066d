"""What each id a server serves is: the card its program ends in, what it makes, its loops, the model list."""

from __future__ import annotations

from typing import Any

from jaxpipe import io
from jaxpipe.engine import Engine
from jaxpipe.serve.errors import APIError

__all__ = ["check_served", "check_size", "final_card", "makes", "served_models"]


def final_card(engine: Engine, model_id: str, seen: tuple[str, ...] = ()) -> str | None:
    """The card whose artifacts a model's output ends with: itself, or a workflow's last stage's (recursively).

    Args:
      engine: the engine.
      model_id: a served card or workflow id.
      seen: the workflows already followed (a cycle ends in ``None``).

    Returns:
      The card id, or ``None``.
    """
    if model_id not in engine.workflows():
        return model_id
    stages = engine.workflow(model_id).stages
    if not stages or model_id in seen:
        return None
    return final_card(engine, stages[-1].model, (*seen, model_id))


def makes(engine: Engine, model_id: str) -> str:
    """What a served card or workflow makes: ``"video"``, ``"image"``, ``"scores"`` or ``"text"``.

    Read from the program's outputs (a workflow: its last stage's card): a ``video`` artifact makes a
    video, else an ``image`` an image, else ``scores`` / ``probabilities`` scores, else text.

    Args:
      engine: the engine serving it.
      model_id: a served id.

    Returns:
      The kind of artifact.
    """
    card = final_card(engine, model_id)
    if card is None:
        return "text"
    outputs = dict(engine.program(card).outputs)
    for artifact, kind in (("video", "video"), ("image", "image"), ("scores", "scores"), ("probabilities", "scores")):
        if artifact in outputs:
            return kind
    return "text"


def _loops(engine: Engine, model_id: str) -> list[str]:
    if model_id in engine.workflows():
        return [f"{s.label}/{loop}" for s in engine.workflow(model_id).stages for loop in _loops(engine, s.model)]
    return [loop.id for loop in engine.card(model_id).spec.loops]


def _reward_ids(rewards: Any) -> list[str]:
    return [] if rewards is None else sorted(rewards.ids())


def served_models(engine: Engine, rewards: Any = None, created: int = 0) -> list[dict[str, Any]]:
    """The ``/v1/models`` entries: every served card and workflow, and the reward models.

    Args:
      engine: the engine.
      rewards: the reward models (``RewardModels``) or ``None``.
      created: the ``created`` timestamp to report.

    Returns:
      OpenAI model objects with ``kind``, ``loops`` and ``makes``.
    """
    reward_ids = _reward_ids(rewards)
    out = []
    for model_id in engine.models():
        workflow = model_id in engine.workflows()
        kind = "workflow" if workflow else "reward" if model_id in reward_ids else "card"
        out.append(
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "jaxpipe",
                "kind": kind,
                "loops": _loops(engine, model_id),
                "makes": makes(engine, model_id),
            }
        )
    for model_id in reward_ids:
        if not engine.serves(model_id):
            out.append(
                {
                    "id": model_id,
                    "object": "model",
                    "created": created,
                    "owned_by": "jaxpipe",
                    "kind": "reward",
                    "loops": [],
                    "makes": "scores",
                }
            )
    return out


def check_served(engine: Engine, model_id: str, kind: str, endpoint: str) -> str:
    """``model_id`` if the engine serves it and it makes ``kind``; else a 404 / 400 naming the ids that do.

    Args:
      engine: the engine.
      model_id: the requested id.
      kind: what the route makes (``"image"``, ``"video"``).
      endpoint: the route, for the error.

    Returns:
      ``model_id``.

    Raises:
      APIError: 404 for an id not served, 400 for one that makes something else.
    """
    if not engine.serves(model_id):
        raise APIError(
            404,
            f"unknown model {model_id!r}; this server serves {engine.models()}",
            param="model",
            code="model_not_found",
        )
    made = makes(engine, model_id)
    if made != kind:
        fitting = [m for m in engine.models() if makes(engine, m) == kind]
        where = {
            "image": "POST /v1/images/generations",
            "video": "POST /v1/videos",
            "text": "POST /v1/chat/completions",
            "scores": "POST /v1/rewards",
        }[made]
        raise APIError(
            400,
            f"{model_id!r} makes {made}s (send it to {where}); the models {endpoint} serves are {fitting}",
            param="model",
            code="wrong_endpoint",
        )
    return model_id


def check_size(engine: Engine, model_id: str, size: str | None) -> str | None:
    """The card's ``"WxH"``; a 400 naming it when ``size`` asks for another.

    Args:
      engine: the engine.
      model_id: a served id.
      size: the requested ``"WxH"`` (``None``: any).

    Returns:
      The card's size, or ``None`` when it has no image shape.

    Raises:
      APIError: 400 when ``size`` is not the card's.
    """
    card = final_card(engine, model_id)
    shape = io.image_shape(engine.card(card)) if card is not None else None
    allowed = f"{shape[1]}x{shape[0]}" if shape else None
    if size is not None and size not in ("auto", allowed):
        raise APIError(
            400,
            f"size {size!r} is not served by {model_id!r}: its size is {allowed!r} (or omit size)"
            if allowed
            else f"{model_id!r} has no size to choose; omit size",
            param="size",
            code="invalid_size",
        )
    return allowed
