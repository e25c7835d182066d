"""Cards: a deployable model as a pytree of Flax NNX components plus static metadata.

``Card.components`` (name -> module) are the pytree's data; ``Card.spec`` is static and hashable,
so ``jax.jit(f)(card)`` retraces only when the metadata changes, and ``jax.tree.map``,
``jax.grad`` or a sharding apply to the card directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxpipe import tracing  # noqa: F401  (cheap tracer probes before any network is built or traced)
from jaxpipe import validate as checks  # this module's own validate() checks a spec against its components
from jaxpipe.loops import registry as loop_kinds

__all__ = ["Card", "CardSpec", "LoopSpec", "CardValidationError"]


class CardValidationError(ValueError):
    """A card's spec is inconsistent with its components (or with itself)."""


def _check_error(driver, spec) -> str | None:
    """What the loop kind's ``driver.check`` says is wrong with ``spec`` (its ``ValueError``), or ``None``."""
    try:
        driver.check(spec)
    except ValueError as err:
        return str(err)
    return None


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """A loop a card runs: its id, kind, the component(s) it binds and its static ``config``.

    ``kind`` names a loop kind of ``jaxpipe.loops.registry.KINDS``; ``binds`` the components the
    loop drives, in order (several for a routed loop: its router picks one per request);
    ``config`` is the loop's own hashable settings (e.g. ``loops.denoise.DenoiseConfig``);
    ``latent_shape`` the per-request latent shape of a denoise loop (each loop has its own, so
    two loops of one card may run at two resolutions).
    """

    id: str
    kind: str
    binds: tuple[str, ...]
    config: Hashable = None
    latent_shape: tuple[int, ...] | None = None

    def __post_init__(self):
        checks.rule(
            self.kind in loop_kinds.KINDS,
            f"loop {self.id!r}: kind must be one of {sorted(loop_kinds.KINDS)} (got {self.kind!r})",
            CardValidationError,
        )
        if isinstance(self.binds, str):
            object.__setattr__(self, "binds", (self.binds,))
        object.__setattr__(self, "binds", tuple(self.binds))
        checks.rule(bool(self.binds), f"loop {self.id!r} binds no component", CardValidationError)
        if self.latent_shape is not None:
            shape = tuple(int(n) for n in self.latent_shape)
            checks.rule(
                bool(shape) and min(shape) > 0,
                f"loop {self.id!r}: latent_shape must be positive sizes (got {self.latent_shape})",
                CardValidationError,
            )
            object.__setattr__(self, "latent_shape", shape)
        hash(self.config)
        driver = loop_kinds.KINDS[self.kind]
        if driver is not None:
            err = _check_error(driver, self)
            checks.rule(err is None, f"loop {self.id!r} ({self.kind}): {err}", CardValidationError)


@dataclasses.dataclass(frozen=True)
class CardSpec:
    """Static description of a card.

    model_id: the id requests use; family: the card family (module) that builds it;
    loops: the loops it declares; recipe: loop ids in the order its default program runs them;
    parity: consistency levels it is tested at (``"C0"`` .. ``"C4"``); capabilities: tasks it
    serves (``"t2i"``, ``"i2v"`` ...); tokenizer: its text tokenizer, if it reads text;
    config: the family's hashable build configuration (sizes, latent shape, defaults);
    optional: components the card declares but may lack (e.g. a sound decoder a checkpoint does
    not ship): a card without them validates and loads, and ``card.has(name)`` says which are there.
    """

    model_id: str
    family: str
    loops: tuple[LoopSpec, ...]
    recipe: tuple[str, ...] = ()
    parity: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    tokenizer: Hashable = None
    config: Hashable = None
    optional: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("loops", "recipe", "parity", "capabilities", "optional"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def loop(self, loop_id: str) -> LoopSpec:
        """The declared loop ``loop_id`` (KeyError listing the declared ids otherwise)."""
        for loop in self.loops:
            if loop.id == loop_id:
                return loop
        raise KeyError(f"card {self.model_id!r} declares no loop {loop_id!r}; it has {[lp.id for lp in self.loops]}")


def validate(spec: CardSpec, component_names) -> None:
    """Raise ``CardValidationError`` unless every reference in ``spec`` resolves."""
    names = set(component_names)
    if not spec.model_id:
        raise CardValidationError("model_id must be a non-empty string")
    loop_ids = [loop.id for loop in spec.loops]
    dupes = sorted({i for i in loop_ids if loop_ids.count(i) > 1})
    if dupes:
        raise CardValidationError(f"card {spec.model_id!r}: duplicate loop ids {dupes}")
    clash = sorted(set(loop_ids) & names)
    if clash:
        raise CardValidationError(f"card {spec.model_id!r}: ids {clash} name both a loop and a component")
    clash = sorted(set(loop_ids) & set(spec.optional))
    if clash:
        raise CardValidationError(f"card {spec.model_id!r}: ids {clash} name both a loop and an optional component")
    for loop in spec.loops:
        absent = [c for c in loop.binds if c in spec.optional and c not in names]
        if absent:
            raise CardValidationError(
                f"card {spec.model_id!r}: loop {loop.id!r} binds optional component(s) {absent} that this card does not have"
            )
        missing = [c for c in loop.binds if c not in names]
        if missing:
            raise CardValidationError(
                f"card {spec.model_id!r}: loop {loop.id!r} binds missing component(s) {missing}; "
                f"the card has {sorted(names)}"
            )
    unknown = [r for r in spec.recipe if r not in loop_ids]
    if unknown:
        raise CardValidationError(
            f"card {spec.model_id!r}: recipe uses undeclared loop(s) {unknown}; declared loops are {loop_ids}"
        )
    bad = [p for p in spec.parity if p not in ("C0", "C1", "C2", "C3", "C4")]
    if bad:
        raise CardValidationError(f"card {spec.model_id!r}: unknown parity level(s) {bad}; use C0..C4")


@jax.tree_util.register_pytree_with_keys_class
class Card:
    """A model: ``components`` (name -> ``nnx.Module``) and a static ``spec``.

    Construction validates the spec against the components; pytree reconstruction (inside
    ``jit``, ``tree.map``) skips validation because it cannot change either.
    """

    __slots__ = ("components", "spec")

    def __init__(self, components: Mapping[str, Any], spec: CardSpec):
        if not isinstance(spec, CardSpec):
            raise TypeError(f"spec must be a CardSpec, got {type(spec).__name__}")
        validate(spec, components.keys())
        self.components = dict(components)
        self.spec = spec

    def bound(self, loop_id: str) -> tuple:
        """The components loop ``loop_id`` binds, in ``LoopSpec.binds`` order (what its driver drives)."""
        return tuple(self.components[name] for name in self.spec.loop(loop_id).binds)

    def has(self, name: str) -> bool:
        """Whether the card has component ``name`` (an optional one may be declared and absent)."""
        return name in self.components

    def __getitem__(self, name: str):
        try:
            return self.components[name]
        except KeyError:
            if name in self.spec.optional:
                raise KeyError(
                    f"card {self.spec.model_id!r} declares the optional component {name!r} but does not have it"
                ) from None
            raise KeyError(
                f"card {self.spec.model_id!r} has no component {name!r}; it has {sorted(self.components)}"
            ) from None

    @property
    def model_id(self) -> str:
        """The card's id (``spec.model_id``)."""
        return self.spec.model_id

    def tree_flatten_with_keys(self):
        """Pytree flattening: the components (sorted by name, keyed by ``DictKey``) are the children; the
        names and the spec are static."""
        names = tuple(sorted(self.components))
        children = [(jax.tree_util.DictKey(n), self.components[n]) for n in names]
        return children, (names, self.spec)

    @classmethod
    def tree_unflatten(cls, aux, children):
        """Pytree unflattening: a card of ``children`` (components) under the static ``(names, spec)``."""
        names, spec = aux
        card = object.__new__(cls)
        card.components = dict(zip(names, children))
        card.spec = spec
        return card

    def num_params(self) -> int:
        """Total parameter count over all components (``nnx.Param`` leaves)."""
        return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(self.components, nnx.Param))))

    def with_id(self, model_id: str) -> Card:
        """The same card (same components, loops, config) under another model id."""
        return Card(self.components, dataclasses.replace(self.spec, model_id=model_id))

    def replace(self, **components) -> Card:
        """A new card with some components swapped (the spec is revalidated)."""
        unknown = sorted(set(components) - set(self.components))
        if unknown:
            raise KeyError(f"card {self.model_id!r} has no component(s) {unknown}")
        return Card({**self.components, **components}, self.spec)

    def __repr__(self) -> str:
        comps = ", ".join(f"{n}={type(m).__name__}" for n, m in sorted(self.components.items()))
        return f"Card({self.model_id!r}, {comps}, loops={[lp.id for lp in self.spec.loops]})"
