"""Requests and outputs: what a user asks a model (or workflow) for, and the named artifacts it returns.

A ``Request`` names the model by id and carries typed inputs; ``None`` means "the card's
default". An ``Output`` is a read-only mapping from artifact name to value: ``"image"``
``(H, W, C)`` in [0, 1], ``"video"`` ``(T, H, W, C)`` in [0, 1], ``"latents"``, ``"text"`` (the
prompt a stage rendered, a ``str``), and, for a workflow, every stage's artifacts again under
``"<stage label>:<name>"``. Artifacts are per request: no batch axis.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import jax
import numpy as np

from jaxpipe import validate

__all__ = ["Request", "Output", "MAX_SEED", "check_settings"]

MAX_SEED = 2**32 - 1
"""Seeds are ints in ``[0, MAX_SEED]``: a request's PRNG key is ``jax.random.key(seed)`` (uint32 seed)."""


_NAMES = {"seed": "Request.seed", "num_steps": "Request.num_steps", "guidance": "Request.guidance"}


def _int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_settings(seed, num_steps=None, guidance=None, *, names: Mapping[str, str] | None = None) -> None:
    """The rules of a request's ``seed``, ``num_steps`` and ``guidance``, written once: ``Request`` checks its
    fields with them, the command line its flags (``names``: what to call each in the message).

    Args:
      seed: an int in ``[0, MAX_SEED]``.
      num_steps: a positive int, or ``None`` (the card's).
      guidance: a finite number ``>= 0``, or ``None`` (the card's).
      names: ``{"seed" | "num_steps" | "guidance": name}`` for the messages (default ``Request.<field>``).

    Raises:
      ValueError: naming the first setting that fails and its value.
    """
    names = {**_NAMES, **(names or {})}
    validate.rule(
        _int(seed) and 0 <= seed <= MAX_SEED, f"{names['seed']} must be an int in [0, {MAX_SEED}] (got {seed!r})"
    )
    validate.rule(
        num_steps is None or (_int(num_steps) and num_steps > 0),
        f"{names['num_steps']} must be a positive int (got {num_steps!r})",
    )
    ok = guidance is None or (
        isinstance(guidance, (int, float, np.floating, np.integer))
        and not isinstance(guidance, bool)
        and math.isfinite(guidance)
        and guidance >= 0
    )
    validate.rule(ok, f"{names['guidance']} must be a finite number >= 0 (got {guidance!r})")


@dataclasses.dataclass(frozen=True, eq=False)
class Request:
    """One generation request for ``model`` (a card id or a workflow id).

    Arguments:
      model: the id of a model the engine serves (``engine.models()``).
      prompt: the text prompt (digits-world words, e.g. ``"seven thick moving right"``).
      seed: the request's seed; the same seed on the same machine gives the same bits.
      num_steps: denoising steps (``None``: the card's default); must be positive.
      guidance: classifier-free guidance scale (``None``: the card's default; 1 = no guidance).
      image: a conditioning image ``(H, W, C)`` in [0, 1] (image-to-video, scoring).
      inputs: further named inputs a workflow's stages may read (read-only mapping).

    Checks that need no card (types, ``num_steps > 0``, the seed's range) run here; checks
    against a card (vocabulary, image shape) run when the engine binds the request, before any
    request of a ``run_many`` call starts.
    """

    model: str
    prompt: str | None = None
    seed: int = 0
    num_steps: int | None = None
    guidance: float | None = None
    image: Any = None
    inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        validate.rule(
            isinstance(self.model, str) and bool(self.model),
            f"Request.model must be a non-empty model id string (got {self.model!r})",
        )
        validate.rule(
            self.prompt is None or isinstance(self.prompt, str),
            f"Request.prompt must be a str or None (got {type(self.prompt).__name__})",
            error=TypeError,
        )
        check_settings(self.seed, self.num_steps, self.guidance)
        object.__setattr__(self, "seed", int(self.seed))
        if self.num_steps is not None:
            object.__setattr__(self, "num_steps", int(self.num_steps))
        if self.guidance is not None:
            object.__setattr__(self, "guidance", float(self.guidance))
        validate.rule(
            self.image is None or hasattr(self.image, "shape"),
            f"Request.image must be an array (H, W, C) in [0, 1] (got {type(self.image).__name__})",
            error=TypeError,
        )
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))

    def replace(self, **changes) -> Request:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        parts = [repr(self.model)]
        for field in dataclasses.fields(self)[1:]:
            value = getattr(self, field.name)
            if field.name == "inputs":
                if value:
                    parts.append(f"inputs={sorted(value)}")
            elif value is not None:
                parts.append(f"{field.name}={_short(value)}")
        return f"Request({', '.join(parts)})"


def _short(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{tuple(value.shape)}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    return repr(value)


class Output(Mapping):
    """The artifacts of one finished request: a read-only mapping ``name -> value``.

    Values are jax arrays (``"text"`` artifacts are ``str``). ``model`` is the id of the card or
    workflow that produced them; ``request`` is the request that asked for them. A request
    cancelled at a step boundary has no artifacts and ``cancelled_at`` holds ``(step, num_steps)``
    of the loop it stopped in.
    """

    __slots__ = ("_artifacts", "model", "request", "cancelled_at")

    def __init__(
        self,
        model: str,
        artifacts: Mapping[str, Any],
        request: Request | None = None,
        cancelled_at: tuple[int, int] | None = None,
    ):
        self._artifacts = MappingProxyType(dict(artifacts))
        self.model = model
        self.request = request
        self.cancelled_at = cancelled_at

    @property
    def cancelled(self) -> bool:
        """Whether the request was cancelled (then it has no artifacts)."""
        return self.cancelled_at is not None

    def __getitem__(self, name: str):
        try:
            return self._artifacts[name]
        except KeyError:
            if self.cancelled:
                step, total = self.cancelled_at
                raise KeyError(
                    f"the {self.model!r} request was cancelled at step {step}/{total}: it has no {name!r}"
                ) from None
            raise KeyError(f"{self.model!r} produced no artifact {name!r}; it has {sorted(self._artifacts)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._artifacts)

    def __len__(self) -> int:
        return len(self._artifacts)

    def block_until_ready(self) -> Output:
        """Wait for every array artifact to be computed (for timing); returns ``self``."""
        jax.block_until_ready([v for v in self._artifacts.values() if isinstance(v, jax.Array)])
        return self

    def __repr__(self) -> str:
        if self.cancelled:
            return f"Output({self.model!r}, cancelled at step {self.cancelled_at[0]}/{self.cancelled_at[1]})"
        items = ", ".join(f"{k}={_short(v)}" for k, v in self._artifacts.items())
        return f"Output({self.model!r}, {items})"
