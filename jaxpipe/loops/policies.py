"""Small pure policies a denoise loop composes: guidance, the SDE window, expert routing.

Each policy is a frozen, hashable dataclass (static under ``jit``) with one pure method, in the
spirit of optax: the loop's ``step`` applies them in a fixed order and never branches on a flag.

* **routing** picks, per request, which of the loop's bound experts computes the velocity:
  ``router(sigma) -> (B,) int32`` (``Single``: one expert; ``SigmaBoundary``: Wan 2.2's high- and
  low-noise experts; ``Fixed``: always one of several). ``routed_velocity`` applies it inside
  one jitted step (``lax.switch`` when the whole batch agrees, a per-row select otherwise).
* **guidance** turns a velocity function into the guided one: ``Unguided`` (one forward),
  ``CFG(scale)`` (conditional and unconditional halves as one doubled batch) or ``STG`` (CFG plus
  spatio-temporal guidance: a third, perturbed forward with self-attention skipped in chosen
  blocks, all forwards as one batch). The policy's structure (which forwards run) is static; its
  CFG scale may be overridden per call by a traced per-row ``scale`` ``(B,)`` (the loops pass
  each request's own, so requests with different scales share one compiled step).
* the **SDE window** says on which steps the FlowGRPO SDE replaces the Euler step
  (``SDEWindow(start, stop)``; ``SDEWindow()`` is every step).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from jaxpipe import samplers, validate

__all__ = [
    "VelocityFn",
    "Router",
    "Single",
    "Fixed",
    "SigmaBoundary",
    "routed_velocity",
    "Unguided",
    "CFG",
    "STG",
    "guidance",
    "SDEWindow",
]

VelocityFn = Callable[[jax.Array, jax.Array, Any], jax.Array]
"""``velocity(x (B, ...), sigma (B,), cond pytree with leading axis B) -> v (B, ...)``."""


# ------------------------------------------------------------------------------------------ routing
class Router(Protocol):
    """Which expert each request uses at its noise level: ``router(sigma (B,)) -> (B,) int32``.

    Attributes:
      num_experts: how many experts it chooses among (the loop must bind as many).
    """

    num_experts: int

    def __call__(self, sigma: jax.Array) -> jax.Array: ...


@dataclasses.dataclass(frozen=True)
class Single:
    """One expert: every request uses expert 0.

    Attributes:
      num_experts: always 1 (not an argument).
    """

    num_experts: int = dataclasses.field(default=1, init=False)

    def __call__(self, sigma: jax.Array) -> jax.Array:
        return jnp.zeros(jnp.shape(sigma), jnp.int32)


@dataclasses.dataclass(frozen=True)
class Fixed:
    """Always ``expert`` of ``num_experts`` (e.g. to run one expert of a routed card alone).

    Attributes:
      expert: the index every request uses, in ``0..num_experts - 1``.
      num_experts: how many experts the loop binds.

    Raises:
      ValueError: on construction, if ``expert`` is out of range.
    """

    expert: int
    num_experts: int = 2

    def __post_init__(self):
        validate.rule(
            0 <= self.expert < self.num_experts, f"expert must be in 0..{self.num_experts - 1} (got {self.expert})"
        )

    def __call__(self, sigma: jax.Array) -> jax.Array:
        return jnp.full(jnp.shape(sigma), self.expert, jnp.int32)


@dataclasses.dataclass(frozen=True)
class SigmaBoundary:
    """Two experts switched by noise level: expert 0 where ``sigma >= boundary`` (high noise),
    expert 1 below it (Wan 2.2's MoE).

    Attributes:
      boundary: the switching noise level, in (0, 1).
      num_experts: always 2 (not an argument).

    Raises:
      ValueError: on construction, if ``boundary`` is not in (0, 1).
    """

    boundary: float
    num_experts: int = dataclasses.field(default=2, init=False)

    def __post_init__(self):
        validate.rule(0.0 < self.boundary < 1.0, f"boundary must be a noise level in (0, 1) (got {self.boundary})")

    def __call__(self, sigma: jax.Array) -> jax.Array:
        return jnp.where(jnp.asarray(sigma) >= self.boundary, 0, 1).astype(jnp.int32)


def routed_velocity(models: Sequence[Any], router: Router) -> VelocityFn:
    """The velocity function of a loop binding ``models``.

    One model is called directly. Several are chosen per request by ``router`` inside the same
    traced step: when every row of the batch routes to one expert it alone runs
    (``lax.switch``); otherwise every expert runs and each row takes its own expert's output.

    Args:
      models: the bound denoisers, each with ``velocity(x, sigma, cond)``, in expert order.
      router: picks each row's expert from its ``sigma``.

    Returns:
      A ``VelocityFn``.

    Raises:
      ValueError: if ``router.num_experts`` differs from ``len(models)``.
    """
    models = tuple(models)
    if len(models) != router.num_experts:
        raise ValueError(f"the router chooses among {router.num_experts} experts but the loop binds {len(models)}")
    if len(models) == 1:
        return models[0].velocity

    branches = [lambda operands, m=m: m.velocity(*operands) for m in models]

    def velocity(x: jax.Array, sigma: jax.Array, cond: Any) -> jax.Array:
        expert = router(sigma)
        operands = (x, sigma, cond)

        def one() -> jax.Array:
            return jax.lax.switch(expert[0], branches, operands)

        def each() -> jax.Array:
            outs = jnp.stack([branch(operands) for branch in branches])
            return outs[expert, jnp.arange(x.shape[0])]

        return jax.lax.cond(jnp.all(expert == expert[0]), one, each)

    return velocity


# ------------------------------------------------------------------------------------------ guidance
@dataclasses.dataclass(frozen=True)
class Unguided:
    """No guidance: one forward on the conditional input (``uncond`` is ignored).

    Attributes:
      needs_uncond: ``False``.
    """

    needs_uncond = False

    def __call__(
        self, velocity: VelocityFn, x: jax.Array, sigma: jax.Array, cond: Any, uncond: Any = None, scale=None
    ) -> jax.Array:
        del uncond, scale  # one forward: there is nothing to combine
        return velocity(x, sigma, cond)


@dataclasses.dataclass(frozen=True)
class CFG:
    """Classifier-free guidance ``v_u + scale·(v_c - v_u)``; the conditional and unconditional
    halves run as one doubled batch (``cond`` and ``uncond`` are pytrees of the same structure).

    Calling it without ``uncond`` raises ``ValueError``; a call's ``scale`` (a scalar or per-row
    ``(B,)``, e.g. traced) replaces the attribute.

    Attributes:
      scale: the CFG scale (``None``: every call passes its own).
      detach_uncond: stop the gradient through ``v_u`` (values unchanged; FlowGRPO's recompute option).
      needs_uncond: ``True``.
    """

    scale: float | None
    detach_uncond: bool = False
    needs_uncond = True

    def __call__(
        self, velocity: VelocityFn, x: jax.Array, sigma: jax.Array, cond: Any, uncond: Any = None, scale=None
    ) -> jax.Array:
        if uncond is None:
            raise ValueError(f"guidance={self.scale} needs the unconditional input (uncond)")
        both = lambda a, b: jnp.concatenate([a, b], axis=0)
        v = velocity(both(x, x), both(sigma, sigma), jax.tree.map(both, cond, uncond))
        v_cond, v_uncond = jnp.split(v, 2, axis=0)
        if self.detach_uncond:
            v_uncond = jax.lax.stop_gradient(v_uncond)
        return samplers.cfg_combine(v_cond, v_uncond, _scale_of(self.scale, scale))


@dataclasses.dataclass(frozen=True)
class STG:
    """Spatio-temporal guidance composed with CFG: ``v = v_c + (cfg - 1)·(v_c - v_u) + scale·(v_c - v_p)``.

    ``v_p`` is the conditional forward perturbed by skipping self-attention in ``blocks``. The
    conditional, (when ``cfg != 1``) unconditional and perturbed forwards run as ONE velocity call
    on a batch 2× or 3× as large. The perturbation is data on the conditioning: ``cond`` must offer
    ``skipping(blocks, width)`` (e.g. ``jaxpipe.nn.DiTCond``), returning the same pytree with the
    blocks to skip per row, so the plain rows (``skipping((), width)``) and the perturbed rows share
    one structure and one compiled forward. Calling it raises ``ValueError`` when ``cond`` has no
    ``skipping`` or when ``uncond`` is needed and missing.

    Attributes:
      cfg: the CFG scale (1: no unconditional forward; ``None``: every call passes its own).
      scale: the STG scale, > 0.
      blocks: the non-negative DiT block indices whose self-attention the perturbed forward skips.

    Raises:
      ValueError: on construction, if ``scale <= 0`` or ``blocks`` is empty or holds a bad index.
    """

    cfg: float | None
    scale: float
    blocks: tuple[int, ...]

    def __post_init__(self):
        validate.rule(
            self.scale > 0 and bool(self.blocks) and all(_block_index(i) for i in self.blocks),
            f"STG needs scale > 0 and non-negative block indices (got scale={self.scale}, blocks={self.blocks})",
        )
        object.__setattr__(self, "blocks", tuple(int(i) for i in self.blocks))

    @property
    def needs_uncond(self) -> bool:
        """Whether the unconditional forward runs: ``cfg != 1``."""
        return self.cfg != 1.0

    def __call__(
        self, velocity: VelocityFn, x: jax.Array, sigma: jax.Array, cond: Any, uncond: Any = None, scale=None
    ) -> jax.Array:
        if not callable(getattr(cond, "skipping", None)):
            raise ValueError(
                f"STG (stg={self.scale}) perturbs the denoiser by skipping self-attention blocks, but its conditioning "
                f"{type(cond).__name__} cannot be perturbed (it needs a skipping(blocks, width) method, like DiTCond's)"
            )
        if self.needs_uncond and uncond is None:
            raise ValueError(f"guidance={self.cfg} needs the unconditional input (uncond)")
        width = len(self.blocks)
        parts = [cond.skipping((), width)]
        if self.needs_uncond:
            parts.append(uncond.skipping((), width))
        parts.append(cond.skipping(self.blocks, width))
        n = len(parts)
        cat = lambda *leaves: jnp.concatenate(leaves, axis=0)
        v = velocity(cat(*[x] * n), cat(*[sigma] * n), jax.tree.map(cat, *parts))
        pieces = jnp.split(v, n, axis=0)
        v_cond, v_perturbed = pieces[0], pieces[-1]
        guided = v_cond if n == 2 else samplers.cfg_combine(v_cond, pieces[1], _scale_of(self.cfg, scale))
        return guided + self.scale * (v_cond - v_perturbed)


def guidance(scale: float | None, stg: float = 0.0, stg_blocks: Sequence[int] = ()) -> Unguided | CFG | STG:
    """The guidance policy of a loop's scales.

    Args:
      scale: the CFG scale (``None``: CFG whose scale each call passes, e.g. per row).
      stg: the STG scale (0: no STG).
      stg_blocks: the DiT blocks the STG's perturbed forward skips (used when ``stg > 0``).

    Returns:
      ``STG(scale, stg, stg_blocks)`` when ``stg > 0``; otherwise ``Unguided()`` at ``scale == 1`` and
      ``CFG(scale)`` at any other scale.
    """
    if scale is not None:
        scale = float(scale)
    if stg > 0:
        return STG(scale, float(stg), tuple(stg_blocks))
    return Unguided() if scale == 1.0 else CFG(scale)


def _scale_of(own: float | None, given):
    """A call's CFG scale: the one it passes (scalar or per row), else the policy's own."""
    if given is None and own is None:
        raise ValueError("CFG with scale=None needs each call's scale (e.g. the state's per-row guidance)")
    return own if given is None else given


def _block_index(i) -> bool:
    return not isinstance(i, bool) and isinstance(i, numbers.Real) and int(i) == i and i >= 0


# ------------------------------------------------------------------------------------------ SDE window
@dataclasses.dataclass(frozen=True)
class SDEWindow:
    """The steps ``[start, stop)`` that sample with the SDE.

    Attributes:
      start: the first SDE step.
      stop: the step after the last SDE step (``None``: through the last step).
    """

    start: int = 0
    stop: int | None = None

    def bounds(self, num_steps: int) -> tuple[int, int]:
        """The window as ``(start, stop)``, with ``stop = num_steps`` when it is ``None``.

        Args:
          num_steps: the loop's step count.
        """
        return self.start, num_steps if self.stop is None else self.stop

    def contains(self, step: jax.Array, num_steps: int) -> jax.Array:
        """``(B,)`` bool: which requests' current ``step`` lies in the window.

        Args:
          step: ``(B,)`` int step indices.
          num_steps: the loop's step count.
        """
        lo, hi = self.bounds(num_steps)
        return (step >= lo) & (step < hi)
