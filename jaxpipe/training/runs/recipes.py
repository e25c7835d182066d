"""Recipes: the run a world builds for a training method, registered by the world as its cards are.

``jaxpipe train METHOD --world W`` trains what world ``W`` registered for ``METHOD``: a ``Recipe`` names the
card trained by default, the method's preset it trains with by default (``jaxpipe.training.presets``;
``None``: the method's own flags), the world's own options (``--terms`` on the digits world) and
``build(card, config, settings) -> Run`` — the prompt stream, reward, evaluation and curves of that world.
The command line imports no world: it asks this registry (``recipe``), which loads the worlds on first use.

    from jaxpipe.training.runs import recipes

    recipes.register_recipe(recipes.Recipe("myworld", "nft", build=my_nft_run, model="my-card", preset="geneval"))
    # jaxpipe train nft --world myworld --steps 100 --out runs/nft
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.training.runs.run import Run

__all__ = ["Recipe", "RunSettings", "recipe", "recipes", "register_recipe", "unregister_recipe", "worlds_of"]


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What the command line sets for any world's run.

    Attributes:
      prompts_per_step: P, prompts per training step.
      seed: the seed of the prompt stream.
      evaluate: judge the card before and after (``False``: no evaluation).
      eval_samples: how much the evaluation judges (``None``: the world's default; its unit is the world's:
        prompts on the digits world, prompts per category on the shapes world).
      diversity_prompts: prompts of the diversity measure (worlds that measure it over chosen prompts).
      diversity_seeds: seeds per prompt of the diversity measure (>= 2).
      eval_seed: seed of the evaluation's prompts and noise, the same before and after.
      options: the world's own options by name (``Recipe.options``), only those the user set.
    """

    prompts_per_step: int = 4
    seed: int = 0
    evaluate: bool = True
    eval_samples: int | None = None
    diversity_prompts: int = 10
    diversity_seeds: int = 6
    eval_seed: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        validate.counts(self, "prompts_per_step", "diversity_prompts")
        validate.rule(
            not self.diversity_seeds < 2, f"diversity needs >= 2 seeds per prompt (got {self.diversity_seeds})"
        )
        if self.eval_samples is not None:
            validate.counts(self, "eval_samples")

    def option(self, name: str, default: Any) -> Any:
        """The world option ``name`` as the user set it, else ``default``.

        Args:
          name: the option's name.
          default: its value when the user did not set it.

        Returns:
          The option's value.
        """
        return self.options.get(name, default)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How world ``world`` trains with method ``method``.

    Attributes:
      world: the world's name (``"digits"``, ``"shapes"``).
      method: the ``jaxpipe train`` command (``"flow-grpo"``, ``"nft"``, ...).
      build: ``(card, config, settings) -> Run``: the method's config on the loaded card, the
        ``RunSettings``; raises ``ValueError`` for a card or option it cannot train with.
      model: the card trained when no ``--model`` is given (a card id).
      preset: the method's preset trained with when no ``--preset`` is given (``None``: the method's flags).
      options: the world options ``build`` reads, name -> one line of help (with its default).
      description: one line on what the run trains and how it is judged.
      check_options: ``settings -> None``, raising ``ValueError`` for a bad option value before any card loads.
    """

    world: str
    method: str
    build: Callable[[Card, Any, RunSettings], Run]
    model: str
    preset: str | None = None
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""
    check_options: Callable[[RunSettings], None] | None = None

    def check(self, settings: RunSettings, *, flag: Callable[[str], str] = repr) -> None:
        """Refuse options this recipe does not read (each named, with the ones it does) and bad option values.

        Args:
          settings: the run's settings.
          flag: how an option is named in the error (default: quoted; the command line: its flag).

        Raises:
          ValueError: naming the first unknown option, or ``check_options``' error.
        """
        for name in settings.options:
            if name not in self.options:
                known = ", ".join(sorted(map(flag, self.options))) or "none"
                raise ValueError(
                    f"{flag(name)} is not an option of the {self.world} world's {self.method} run (its options: {known})"
                )
        if self.check_options is not None:
            self.check_options(settings)


_RECIPES: dict[tuple[str, str], Recipe] = {}


def register_recipe(new: Recipe, *, replace: bool = False) -> Recipe:
    """Add ``new`` under ``(new.world, new.method)``; a second different one is an error unless ``replace``.

    Args:
      new: the recipe.
      replace: replace a different recipe already registered for the same world and method.

    Returns:
      ``new``.

    Raises:
      TypeError: if ``new`` is not a ``Recipe``.
      ValueError: if another recipe is registered for the same world and method (and not ``replace``).
    """
    if not isinstance(new, Recipe):
        raise TypeError(f"register_recipe takes a Recipe (got {type(new).__name__})")
    key = (new.world, new.method)
    old = _RECIPES.get(key)
    if old is not None and old != new and not replace:
        raise ValueError(f"the {new.world} world already has a {new.method} recipe; pass replace=True")
    _RECIPES[key] = new
    return new


def unregister_recipe(world: str, method: str) -> None:
    """Remove the recipe of ``world`` for ``method``.

    Args:
      world: a world name.
      method: a ``jaxpipe train`` command.

    Raises:
      KeyError: if there is none.
    """
    if (world, method) not in _RECIPES:
        raise KeyError(f"the {world} world has no {method} recipe")
    del _RECIPES[(world, method)]


def _load_worlds() -> None:
    from jaxpipe import worlds  # the registry sits below the worlds: they register into it on first use

    worlds.load()


def recipes() -> dict[tuple[str, str], Recipe]:
    """Every registered recipe, the bundled and installed worlds' included.

    Returns:
      ``{(world, method): Recipe}``.
    """
    _load_worlds()
    return dict(_RECIPES)


def worlds_of(method: str) -> tuple[str, ...]:
    """The worlds with a recipe for ``method``.

    Args:
      method: a ``jaxpipe train`` command.

    Returns:
      Their names, sorted.
    """
    return tuple(sorted(world for world, m in recipes() if m == method))


def recipe(world: str, method: str) -> Recipe:
    """The recipe of ``world`` for ``method``.

    Args:
      world: a world name.
      method: a ``jaxpipe train`` command.

    Returns:
      The registered ``Recipe``.

    Raises:
      ValueError: naming the worlds that have a ``method`` recipe when ``world`` has none.
    """
    found = recipes().get((world, method))
    if found is None:
        have = ", ".join(worlds_of(method)) or "none"
        raise ValueError(f"no {world!r} world trains {method} (worlds with a {method} run: {have})")
    return found
