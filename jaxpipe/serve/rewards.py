"""``POST /v1/rewards``: jaxpipe's reward models served over HTTP, so a trainer elsewhere can score with them.

A request names a reward model and sends images with the prompts they were made from; the answer
is one score per image, with its named parts::

    POST /v1/rewards
    {"model": "digit-scorer", "images": ["<base64 PNG>" | "data:image/png;base64,...", ...],
     "prompts": ["seven thick left bright", ...], "metadata": {"digit": [7, ...]}}     # metadata: optional
    -> {"object": "list", "model": "digit-scorer",
        "data": [{"index": 0, "score": 2.71, "parts": {"digit": 0.93, "stroke": 0.61, ...}}, ...]}

The model may also come in the URL's query (``/v1/rewards?model=digit-scorer``), the form a
``--reward http://HOST:PORT/v1/rewards?model=M`` flag uses (``jaxpipe.rewards.remote``).

``RewardModels`` holds what a server scores with: the digits world's ``digit-scorer`` (every
``REWARD_TERMS`` term, the labels read from the prompt words, as ``jaxpipe evaluate`` does) where
that card is available, and each ``jaxpipe serve --reward SPEC`` (``jaxpipe.rewards.load``: a
``KIND:DIR`` reward model such as ``pickscore:DIR``, a ``module:function``, or another server's URL),
named by ``jaxpipe.rewards.spec_name``. Each model is jitted once and compiled once per batch shape;
scoring runs on a worker thread, so the server's event loop stays free.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import fastapi
import jax
import numpy as np
from starlette.concurrency import run_in_threadpool

from jaxpipe import rewards as rewards_lib
from jaxpipe.serve import media
from jaxpipe.serve.errors import APIError

__all__ = ["DIGIT_SCORER", "MAX_IMAGES", "RewardModel", "RewardModels", "router"]

router = fastapi.APIRouter()

DIGIT_SCORER = "digit-scorer"
"""The built-in reward model's id: the bundled ``digit-scorer`` card's reward over every term."""

MAX_IMAGES = 256
"""The most images one ``/v1/rewards`` request may score."""


@dataclasses.dataclass(frozen=True)
class RewardModel:
    """One reward model a server scores with.

    Attributes:
      id: the id requests name it by.
      reward: the reward, ``reward(artifacts, prompts) -> (B,)`` or ``{part: (B,)}`` (JAX or host).
      image_shape: the ``(H, W, C)`` sent images are converted and box-resized to (as ``jaxpipe generate
        --image`` does), or ``None`` to keep each image's own size and mode.
      labels: ``labels(texts) -> {name: (B,)}``, the metadata the reward reads from the prompt texts
        (the digits world's labels), or ``None``.
      label_names: the names ``labels`` gives (a request sending all of them as ``metadata`` need not
        send prompts ``labels`` can read).
    """

    id: str
    reward: Callable
    image_shape: tuple[int, int, int] | None = None
    labels: Callable[[list[str]], Mapping[str, np.ndarray]] | None = None
    label_names: tuple[str, ...] = ()


class RewardModels:
    """The reward models a server scores with, by id (``ids()``), each jitted once (``score``).

    Args:
      models: the ``RewardModel`` s (ids must differ).

    Raises:
      ValueError: if two models share an id.
    """

    def __init__(self, models: Iterable[RewardModel] = ()):
        self._models: dict[str, RewardModel] = {}
        for model in models:
            if model.id in self._models:
                raise ValueError(f"two reward models are named {model.id!r}; rename one")
            self._models[model.id] = model
        self._jitted: dict[str, Callable] = {}
        self._names: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_specs(cls, specs: Sequence[str] = (), engine: Any = None) -> RewardModels:
        """The built-in ``digit-scorer`` (where that card is available) plus a model per ``--reward`` spec.

        The ``digit-scorer`` card is ``engine``'s resident one when it serves it, else the bundled one; a
        spec ``"digit-scorer"`` names it (and fails where it is not available).

        Args:
          specs: ``jaxpipe.rewards.load`` specs (``"pickscore:DIR"``, ``"module:function"``, a URL ...),
            each served under ``jaxpipe.rewards.spec_name(spec)``.
          engine: the server's engine, or ``None``.

        Returns:
          The ``RewardModels``.

        Raises:
          ValueError: a spec that does not load (the reason named), or two with one name.
        """
        models = []
        scorer = _digit_scorer(engine)
        if scorer is not None:
            models.append(scorer)
        for spec in specs:
            if spec == DIGIT_SCORER:  # the built-in, named explicitly
                if scorer is None:
                    raise ValueError(f"--reward {spec}: the {DIGIT_SCORER!r} card is not available here")
                continue
            name = rewards_lib.spec_name(spec)
            if name == DIGIT_SCORER and scorer is not None:
                raise ValueError(f"--reward {spec!r} is named {DIGIT_SCORER!r}, the built-in reward's id; rename it")
            models.append(RewardModel(name, rewards_lib.load(spec)))
        return cls(models)

    def ids(self) -> list[str]:
        """The reward models' ids, in the order they were given."""
        return list(self._models)

    def __contains__(self, model: str) -> bool:
        return model in self._models

    def get(self, model: str) -> RewardModel:
        """The reward model ``model``.

        Raises:
          APIError: 404 listing the ids, for an unknown one.
        """
        if not isinstance(model, str) or model not in self._models:
            served = ", ".join(self._models) or "none"
            raise APIError(
                404,
                f"unknown reward model {model!r}; this server's reward models: {served}",
                param="model",
                code="model_not_found",
            )
        return self._models[model]

    def score(
        self, model: str, images: Sequence[Any], prompts: Sequence[str], metadata: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Score ``images`` made from ``prompts`` with reward model ``model``.

        Args:
          model: a reward model's id.
          images: B images ``(H, W, C)`` in [0, 1], all of one shape.
          prompts: the B prompt texts, row-aligned with ``images``.
          metadata: optional ``{name: (B, ...)}`` per-prompt values; they take precedence over the
            labels the model reads from the texts.

        Returns:
          ``{"scores": [B floats], "parts": {name: [B floats]}}`` (``parts`` empty for a reward that
          returns one value per row).

        Raises:
          APIError: 404 for an unknown model; 400 naming the field for images of several shapes, a row
            count mismatch, prompts the model cannot read labels from, or a reward refusing the input.
        """
        entry = self.get(model)
        texts = list(prompts)
        if len(images) != len(texts):
            raise APIError(
                400,
                f"prompts has {len(texts)} entries and images {len(images)}: send one prompt per image",
                param="prompts",
            )
        if not images:
            raise APIError(400, "images is empty: send at least one image", param="images")
        shapes = sorted({tuple(np.shape(im)) for im in images})
        if len(shapes) > 1:
            raise APIError(400, f"images must all have one shape; got {shapes}", param="images")
        batch = np.stack([np.asarray(im, np.float32) for im in images])
        meta: dict[str, np.ndarray] = {}
        if entry.labels is not None and not set(metadata or {}) >= set(entry.label_names):
            try:
                meta.update(entry.labels(texts))
            except ValueError as err:
                raise APIError(
                    400, f"prompts: {model!r} reads its labels from the prompt words: {err}", param="prompts"
                ) from None
        for name, value in (metadata or {}).items():
            value = np.asarray(value)
            if (
                value.dtype == object
                or not np.issubdtype(value.dtype, np.number)
                or value.ndim == 0
                or len(value) != len(texts)
            ):
                raise APIError(
                    400,
                    f"metadata[{name!r}] must be numbers, one row per prompt ({len(texts)})",
                    param=f"metadata.{name}",
                )
            meta[name] = value
        try:
            prompts_ = rewards_lib.text_prompts(texts, meta)
            total, values = jax.device_get(self._jit(entry)(batch, prompts_))
            parts = dict(zip(self._names[entry.id], values))
        except (ValueError, TypeError) as err:
            raise APIError(
                400, f"reward model {model!r} cannot score these images and prompts: {err}", param="images"
            ) from None
        except jax.errors.JaxRuntimeError as err:  # a host reward (another server, say) failed on the host
            raise APIError(
                502, f"reward model {model!r} failed: {err}", type="server_error", code="reward_failed"
            ) from None
        return {"scores": [float(s) for s in total], "parts": {k: [float(s) for s in v] for k, v in parts.items()}}

    def _jit(self, entry: RewardModel) -> Callable:
        """``entry``'s reward as one jitted ``(images, prompts) -> (total, [part values])`` (compiled per batch
        shape); the parts' names, in the reward's own order, are kept in ``_names`` when it is traced (a
        dict returned from ``jit`` comes back with its keys sorted)."""
        with self._lock:
            if entry.id not in self._jitted:
                reward, names = entry.reward, self._names

                def scored(images, prompts):
                    total, parts = rewards_lib.score(reward, {"image": images}, prompts)
                    names[entry.id] = list(parts)
                    return total, list(parts.values())

                self._jitted[entry.id] = jax.jit(scored)
            return self._jitted[entry.id]


def _digit_scorer(engine: Any) -> RewardModel | None:
    """The ``digit-scorer`` reward model a world ships (``jaxpipe.rewards.named``), or ``None`` where its card is
    not available."""
    from jaxpipe import cards, io
    from jaxpipe.rewards import named

    entry = named.available().get(DIGIT_SCORER)
    if entry is None:
        return None
    if engine is not None and entry.card in getattr(engine, "cards", list)():
        card = engine.card(entry.card)
    elif entry.card in cards.available():
        card = cards.load(entry.card)
    else:
        return None
    scoring = entry.build(card)
    return RewardModel(DIGIT_SCORER, scoring.reward, io.image_shape(card), scoring.labels, scoring.label_names)


# ---- the route ------------------------------------------------------------------------------------------------

_DEFAULT_LOCK = threading.Lock()


def _models_of(app: Any) -> RewardModels:
    """The app's ``RewardModels`` (``app.state.rewards``); an app given none scores with the built-in ones
    (``RewardModels.from_specs(())``, made on the first request and kept)."""
    models = getattr(app.state, "rewards", None)
    if models is not None:
        return models
    with _DEFAULT_LOCK:
        if getattr(app.state, "default_rewards", None) is None:
            front = getattr(app.state, "front", None)
            app.state.default_rewards = RewardModels.from_specs((), engine=getattr(front, "engine", None))
        return app.state.default_rewards


def _body(raw: Any, query_model: str | None) -> tuple[str, list[str], list[str], dict | None]:
    """``(model, images, prompts, metadata)`` of a request body, checked field by field (APIError 400)."""
    if not isinstance(raw, dict):
        raise APIError(400, f"the body must be a JSON object {{model, images, prompts}} (got {type(raw).__name__})")
    unknown = sorted(set(raw) - {"model", "images", "prompts", "metadata", "user"})
    if unknown:
        raise APIError(
            400, f"unknown field(s) {unknown}; the fields are model, images, prompts, metadata", param=unknown[0]
        )
    model = raw.get("model", query_model)
    if not isinstance(model, str) or not model:
        raise APIError(
            400,
            "model is required: the reward model's id (GET /v1/models, or the server's --reward names)",
            param="model",
        )
    images, prompts = raw.get("images"), raw.get("prompts")
    if not isinstance(images, list) or not images:
        raise APIError(
            400, "images must be a non-empty list of base64 PNGs or data:image/png;base64,... URLs", param="images"
        )
    if len(images) > MAX_IMAGES:
        raise APIError(400, f"images holds {len(images)} images; a request scores at most {MAX_IMAGES}", param="images")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise APIError(400, "prompts must be a list of strings, one per image", param="prompts")
    if len(prompts) != len(images):
        raise APIError(
            400,
            f"prompts has {len(prompts)} entries and images {len(images)}: send one prompt per image",
            param="prompts",
        )
    metadata = raw.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(k, str) and k for k in metadata)):
        raise APIError(400, "metadata must be an object {name: [one value per prompt]}", param="metadata")
    return model, images, prompts, metadata


@router.post("/v1/rewards")
async def create_rewards(request: fastapi.Request) -> dict[str, Any]:
    """Score images made from prompts with one of the server's reward models.

    Body: ``model`` (or ``?model=`` in the URL), ``images`` (base64 PNGs or data URLs), ``prompts``
    (one per image), optional ``metadata`` ``{name: [one value per prompt]}``.

    Returns:
      ``{"object": "list", "model", "data": [{"index", "score", "parts"}]}``.

    Raises:
      APIError: 400 naming the field for a bad body, 404 listing the ids for an unknown model.
    """
    try:
        raw = await request.json()
    except ValueError:
        raise APIError(400, "the body is not valid JSON") from None
    model, images, prompts, metadata = _body(raw, request.query_params.get("model"))
    models = _models_of(request.app)
    entry = models.get(model)

    def work() -> dict[str, Any]:
        arrays = [media.decode_image(data, entry.image_shape, field=f"images[{i}]") for i, data in enumerate(images)]
        return models.score(model, arrays, prompts, metadata)

    scored = await run_in_threadpool(work)
    data = [
        {"index": i, "score": score, "parts": {name: values[i] for name, values in scored["parts"].items()}}
        for i, score in enumerate(scored["scores"])
    ]
    return {"object": "list", "model": model, "data": data}
