"""The static sampling policy of a denoise loop, ``DenoiseConfig`` (re-exported by ``jaxpipe.loops.denoise``).

A frozen, hashable dataclass: static under ``jit``. Its policies (routing, guidance, SDE window)
are the small pure pieces of ``jaxpipe.loops.policies``; its ``guidance`` is the default scale a
loop's ``init`` gives every row, while the compiled step reads only whether CFG runs.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from jaxpipe import validate
from jaxpipe.loops import policies

__all__ = ["DenoiseConfig", "MAX_NOISE_LEVEL"]


MAX_NOISE_LEVEL = 1.0
"""The largest SDE noise level η accepted (FlowGRPO uses 0.7; above 1 the SDE's std exceeds the ODE's step)."""


@dataclasses.dataclass(frozen=True)
class DenoiseConfig:
    """The static sampling policy of a denoise loop (hashable: static under ``jit``).

    Attributes:
      num_steps: Euler/SDE steps, a positive int.
      shift: the flow-shift of the schedule, > 0.
      sampler: ``"ode"`` (Euler) or ``"sde"`` (the FlowGRPO SDE inside ``sde_window``, Euler outside).
      noise_level: the SDE's η, in ``[0, MAX_NOISE_LEVEL]``.
      sde_window: ``(i, j)``: the SDE runs on steps ``[i, j)`` only (``None``: every step).
      guidance: the CFG scale, >= 0 (1 = no guidance, one forward), applied to every row; ``init``
        also records it per row (``DenoiseState.guidance``). ``None``: CFG with each row's own scale
        from the state (``denoise.step_config``, what the engine compiles one batched step with).
      router: which bound denoiser each request uses at its noise level (``policies.Single()`` for a
        loop binding one).
      stg: the spatio-temporal guidance scale, >= 0 (0 = off; ``policies.STG``).
      stg_blocks: the DiT blocks whose self-attention the STG's perturbed forward skips (needed when
        ``stg > 0``).
      start_sigma: the first noise level σ₀ in (0, 1]: the schedule is ``σ₀ · flow_sigmas(num_steps,
        shift)``; below 1 the loop starts from latents (``init_from_latents``).

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    num_steps: int = 8
    shift: float = 1.0
    sampler: str = "ode"
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    guidance: float | None = 1.0
    router: policies.Router = policies.Single()
    stg: float = 0.0
    stg_blocks: tuple[int, ...] = ()
    start_sigma: float = 1.0

    def __post_init__(self):
        validate.counts(self, "num_steps")
        validate.positive(self, "shift")
        validate.rule(self.sampler in ("ode", "sde"), f"sampler must be 'ode' or 'sde' (got {self.sampler!r})")
        validate.rule(
            _real(self.noise_level) and 0.0 <= self.noise_level <= MAX_NOISE_LEVEL,
            f"noise_level (the SDE's η) must be in [0, {MAX_NOISE_LEVEL}] (got {self.noise_level})",
        )
        validate.non_negative(self, "guidance", optional=True)
        if self.sde_window is not None:
            window = tuple(self.sde_window)
            validate.rule(
                len(window) == 2 and 0 <= window[0] < window[1] <= self.num_steps,
                f"sde_window must be (i, j) with 0 <= i < j <= num_steps={self.num_steps} (got {self.sde_window})",
            )
            object.__setattr__(self, "sde_window", window)
        validate.rule(
            _real(self.stg) and math.isfinite(self.stg) and self.stg >= 0,
            f"stg (the spatio-temporal guidance scale) must be a finite number >= 0 (got {self.stg})",
        )
        blocks = tuple(self.stg_blocks)
        validate.rule(
            all(isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in blocks),
            f"stg_blocks must be non-negative DiT block indices (got {self.stg_blocks!r})",
        )
        object.__setattr__(self, "stg_blocks", tuple(int(i) for i in blocks))
        validate.rule(
            not (self.stg > 0 and not blocks),
            f"stg={self.stg} needs stg_blocks: the blocks whose self-attention the perturbed forward skips",
        )
        validate.rule(
            _real(self.start_sigma) and 0.0 < self.start_sigma <= 1.0,
            f"start_sigma (the first noise level σ₀) must be in (0, 1] (got {self.start_sigma})",
        )
        hash(self.router)

    @property
    def captured_steps(self) -> tuple[int, int]:
        """The ``[i, j)`` steps a rollout captures: the SDE window, or every step for ODE."""
        if self.sampler == "sde" and self.sde_window is not None:
            return self.sde_window
        return (0, self.num_steps)

    @property
    def guide(self) -> policies.Unguided | policies.CFG | policies.STG:
        """The guidance policy (``policies.guidance(self.guidance, self.stg, self.stg_blocks)``)."""
        return policies.guidance(self.guidance, self.stg, self.stg_blocks)

    @property
    def window(self) -> policies.SDEWindow:
        """The SDE window policy (every step when ``sde_window`` is ``None``)."""
        return policies.SDEWindow() if self.sde_window is None else policies.SDEWindow(*self.sde_window)

    def replace(self, **changes) -> DenoiseConfig:
        """A copy with ``changes`` applied (``dataclasses.replace``; the fields are validated again).

        Args:
          **changes: field name -> new value.

        Returns:
          The new ``DenoiseConfig``.
        """
        return dataclasses.replace(self, **changes)


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
