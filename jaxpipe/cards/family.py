"""What a card family is: the one record the family registry holds per family.

A family is one folder, ``jaxpipe/cards/<family>/``: ``card.py`` (its frozen ``Config`` and
``build``), ``program.py`` (the program(s) that serve it) and ``__init__.py``, which defines
``FAMILY = Family(...)``. ``jaxpipe.cards.registry`` lists the bundled families, one line each;
``jaxpipe.cards.register_family`` adds one from outside the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import jax

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.program import Program

__all__ = ["Family", "FlowData"]


class FlowData(Protocol):
    """What ``Finetune`` (flow-matching regression) needs from a denoise family, per batch.

    ``latents(components, batch) -> x0`` ``(B, *latent_shape)``: the clean latents;
    ``cond(components, batch, keep, x0)``: the denoiser's conditioning pytree, unconditional on the
    rows where ``keep`` ``(B,)`` is false (caption dropout, so the card supports guidance).
    ``components`` maps component names to modules (the card being trained).
    """

    def latents(self, components: Mapping[str, Any], batch: Mapping[str, Any]) -> jax.Array:
        """The clean latents ``x0`` ``(B, *latent_shape)`` of a batch.

        Args:
          components: component name -> module (the card being trained).
          batch: one training batch.

        Returns:
          ``x0``, ``(B, *latent_shape)``.
        """
        ...

    def cond(self, components: Mapping[str, Any], batch: Mapping[str, Any], keep: jax.Array, x0: jax.Array) -> Any:
        """The denoiser's conditioning pytree for a batch, unconditional where ``keep`` is false.

        Args:
          components: component name -> module (the card being trained).
          batch: one training batch.
          keep: ``(B,)`` bool; false rows drop their condition (caption dropout).
          x0: the batch's clean latents, from ``latents``.

        Returns:
          The conditioning the denoiser is called with.
        """
        ...


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
    """A card family.

    Arguments:
      name: the family's name (``card.spec.family``, and the checkpoint's ``family`` field).
      config: its frozen, hashable ``Config`` dataclass (checkpoints store and rebuild it).
      build: ``build(config, *, seed, model_id) -> Card``, deterministic in ``seed``; it must also
        work under ``nnx.eval_shape`` (checkpoints are rebuilt abstractly).
      programs: program name -> ``() -> Program`` (build once, e.g. ``functools.cache``); the
        first is the default the engine serves the card with (unless ``program_for`` picks another).
      model_id: the id ``build`` gives by default (``jaxpipe.cards.build(model_id)``), if any.
      stacked: ``stacked(card) -> {component: expert names}`` for components stored stacked on a
        leading expert axis (the engine versions and publishes each expert on its own).
      flow: ``FlowData`` hooks if the family's denoise loop can be fine-tuned by flow matching.
      pipelines: diffusers pipeline class name (``model_index.json``'s ``_class_name``) -> loader
        ``load(folder, **kwargs) -> Card`` for the families that read diffusers folders.
      program_for: ``program_for(card) -> name`` (a key of ``programs``) for a family whose cards do
        different tasks (``wan``: text-to-video or image-to-video); ``None``: every card gets the first.
    """

    name: str
    config: type
    build: Callable[..., Card]
    programs: Mapping[str, Callable[[], Program]]
    model_id: str | None = None
    stacked: Callable[[Card], Mapping[str, tuple[str, ...]]] | None = None
    flow: FlowData | None = None
    pipelines: Mapping[str, Callable[..., Card]] = dataclasses.field(default_factory=dict)
    program_for: Callable[[Card], str] | None = None

    def __post_init__(self):
        validate.rule(
            isinstance(self.name, str) and bool(self.name), f"a family needs a non-empty name (got {self.name!r})"
        )
        validate.rule(
            dataclasses.is_dataclass(self.config),
            f"family {self.name!r}: config must be a dataclass type (got {self.config!r})",
            TypeError,
        )
        validate.rule(bool(self.programs), f"family {self.name!r} names no program")
        object.__setattr__(self, "programs", dict(self.programs))
        object.__setattr__(self, "pipelines", dict(self.pipelines))

    def program(self, name: str | None = None) -> Program:
        """The family's program ``name``.

        Args:
          name: a key of ``programs`` (default: the first, the one the engine serves).

        Returns:
          The built ``Program``.

        Raises:
          KeyError: if the family has no program ``name``.
        """
        if name is None:
            name = next(iter(self.programs))
        if name not in self.programs:
            raise KeyError(f"family {self.name!r} has no program {name!r}; it has {sorted(self.programs)}")
        return self.programs[name]()

    def default_program(self, card: Card) -> Program:
        """The program the engine serves ``card`` with: ``program_for(card)``'s, else the first.

        Args:
          card: a card of this family.

        Returns:
          The built ``Program``.

        Raises:
          KeyError: if ``program_for`` names a program the family does not have.
        """
        return self.program(None if self.program_for is None else self.program_for(card))
