"""Parity gates of the engine and the consistency ladder.

The ladder names what "consistent" means, level by level:

* **C0 structural**: artifacts have the declared shapes and dtypes and are finite;
* **C1 determinism**: same request, same seed, same machine => same bits (``same_seed``); this
  includes **serial == interleaved, bit for bit** (``interleave_gate``): driving a loop's pure
  ``step`` from the engine, one step per request per tick, is the fused scan;
* **C2 rollout <-> train identity**: recomputing a captured step's log-prob under the rollout
  weights reproduces it (``ratio == 1``); tested with the denoise loop and the training methods;
* **C3 batch invariance**: batched equals serial within a *measured* tolerance
  (``batch_invariance``): XLA picks matmul/convolution kernels by shape, so a request computed in
  a batch of 16 is rounded differently from the same request alone. Rows never mix (each
  request's noise comes from its own key, its sigmas are its own), so the difference is rounding
  only;
* **C4 quality**: measured reward / accuracy (``jaxpipe.digits.quality``).

``TOLERANCE`` (C3) is the max abs difference of any artifact allowed between batched and serial
runs: **1e-4**. Measured on CPU (jax 0.10.2, 2 cores) with the bundled cards, batches of 16-64
requests mixing 2-28 steps, guidance 1 and 2: images and videos differ by at most 2.9e-6;
latents (unbounded, std ~1) by at most 1.1e-5 within one card and 3.3e-5 for the video latents
of ``image_video.t2i_i2v``, whose i2v stage inherits the t2i stage's rounding through its
conditioning image; the tiny random test cards stay below 1e-6. 1e-4 leaves a 3x margin over the
worst latent and 30x over images (where 1e-4 is 1/40 of an 8-bit grey level, so a saved frame
moves by at most one level), while a real bug (a row reading another row's sigma, key, step or
conditioning) moves artifacts by 1e-2 or more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.request import Output, Request

__all__ = [
    "LADDER",
    "TOLERANCE",
    "ParityReport",
    "compare",
    "interleave_gate",
    "batch_invariance",
    "same_seed",
    "structural",
]

LADDER: dict[str, str] = {
    "C0": "structural: artifacts have the declared shapes and dtypes and are finite",
    "C1": "determinism: same seed, same machine => same bits (serial == interleaved, bit for bit)",
    "C2": "rollout <-> train identity: recomputed log-prob == captured, so the PPO ratio == 1",
    "C3": "batch invariance: batched == serial within a measured tolerance",
    "C4": "quality: reward / accuracy measured and reported",
}
"""The consistency ladder, C0 to C4."""

TOLERANCE = 1e-4
"""C3: the largest max-abs difference allowed between batched and serial artifacts (see module doc)."""


@dataclasses.dataclass(frozen=True)
class ParityReport:
    """The result of comparing two runs of the same requests.

    Attributes:
      level: the ladder level checked.
      modes: the two run modes compared.
      tolerance: the largest allowed max-abs difference (0 means bit for bit).
      max_abs_diff: the largest absolute difference over every array artifact of every request.
      per_request: that maximum per request.
      mismatches: ``(request index, artifact)`` pairs that differ by more than ``tolerance``, or whose
        shapes, dtypes or text differ.
    """

    level: str
    modes: tuple[str, str]
    tolerance: float
    max_abs_diff: float
    per_request: tuple[float, ...]
    mismatches: tuple[tuple[int, str], ...]

    @property
    def passed(self) -> bool:
        """Whether there are no mismatches."""
        return not self.mismatches

    def __str__(self) -> str:
        verdict = "passed" if self.passed else f"FAILED on {list(self.mismatches)[:6]}"
        bound = "bit for bit" if self.tolerance == 0 else f"tolerance {self.tolerance:g}"
        return f"{self.level} {self.modes[0]} vs {self.modes[1]} ({bound}): max |diff| = {self.max_abs_diff:.3g}, {verdict}"


def compare(
    a: Sequence[Output], b: Sequence[Output], *, tolerance: float = 0.0, level: str = "C1", modes=("a", "b")
) -> ParityReport:
    """Compare two lists of outputs artifact by artifact (array artifacts by max abs difference).

    Text artifacts must be equal; array artifacts (or pytrees of arrays) must have the same structure,
    shapes and dtypes and differ by at most ``tolerance``; a non-finite difference counts as infinite.

    Args:
      a: the first run's outputs, one per request.
      b: the second run's, in the same request order.
      tolerance: the largest allowed max-abs difference (0: bit for bit).
      level: the ladder level the report names.
      modes: the two runs' names, for the report.

    Returns:
      A ``ParityReport``.

    Raises:
      ValueError: if ``a`` and ``b`` have different lengths.
    """
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} outputs with {len(b)}")
    worst, mismatches = [], []
    for i, (x, y) in enumerate(zip(a, b)):
        request_worst = 0.0
        if set(x) != set(y):
            mismatches.append((i, f"artifact names {sorted(x)} vs {sorted(y)}"))
        for name in sorted(set(x) & set(y)):
            u, v = x[name], y[name]
            if isinstance(u, str) or isinstance(v, str):
                if u != v:
                    mismatches.append((i, name))
                continue
            us, vs = jax.tree.leaves(u), jax.tree.leaves(v)
            if jax.tree.structure(u) != jax.tree.structure(v) or any(
                p.shape != q.shape or p.dtype != q.dtype for p, q in zip(us, vs)
            ):
                mismatches.append((i, name))
                continue
            diff = max((_max_abs(p, q) for p, q in zip(us, vs)), default=0.0)
            request_worst = max(request_worst, diff)
            if diff > tolerance:
                mismatches.append((i, name))
        worst.append(request_worst)
    return ParityReport(level, tuple(modes), float(tolerance), max(worst, default=0.0), tuple(worst), tuple(mismatches))


def _max_abs(p, q) -> float:
    if not p.size:
        return 0.0
    diff = float(jnp.max(jnp.abs(jnp.asarray(p, jnp.float32) - jnp.asarray(q, jnp.float32))))
    return diff if np.isfinite(diff) else float("inf")


def interleave_gate(engine, requests: Sequence[Request]) -> ParityReport:
    """C1: serial vs interleaved runs of ``requests`` on ``engine`` must agree bit for bit.

    Args:
      engine: a ``jaxpipe.engine.Engine``.
      requests: the requests, run twice (``run_many`` in each mode).

    Returns:
      A ``ParityReport`` with tolerance 0.
    """
    serial = engine.run_many(requests, mode="serial")
    interleaved = engine.run_many(requests, mode="interleaved")
    return compare(serial, interleaved, tolerance=0.0, level="C1", modes=("serial", "interleaved"))


def batch_invariance(engine, requests: Sequence[Request], *, tolerance: float = TOLERANCE) -> ParityReport:
    """C3: serial vs batched runs of ``requests``: the max abs difference, reported, against ``tolerance``.

    Args:
      engine: a ``jaxpipe.engine.Engine``.
      requests: the requests, run twice (``run_many`` in each mode).
      tolerance: the largest allowed max-abs difference (default ``TOLERANCE``).

    Returns:
      A ``ParityReport``.
    """
    serial = engine.run_many(requests, mode="serial")
    batched = engine.run_many(requests, mode="batched")
    return compare(serial, batched, tolerance=tolerance, level="C3", modes=("serial", "batched"))


def same_seed(engine, requests: Sequence[Request], mode: str = "serial") -> ParityReport:
    """C1: running ``requests`` twice in ``mode`` gives the same bits.

    Args:
      engine: a ``jaxpipe.engine.Engine``.
      requests: the requests.
      mode: the engine's run mode (``"serial"``, ``"interleaved"``, ``"batched"``).

    Returns:
      A ``ParityReport`` with tolerance 0.
    """
    first = engine.run_many(requests, mode=mode)
    second = engine.run_many(requests, mode=mode)
    return compare(first, second, tolerance=0.0, level="C1", modes=(mode, mode))


def structural(outputs: Sequence[Output], expected: dict[str, tuple[int, ...]]) -> list[str]:
    """C0: problems with ``outputs``: missing artifacts, shapes other than ``expected``, non-finite values.

    Args:
      outputs: one output per request.
      expected: artifact name -> its expected shape (artifacts not named are not checked).

    Returns:
      One message per problem; empty if none.
    """
    problems = []
    for i, out in enumerate(outputs):
        for name, shape in expected.items():
            if name not in out:
                problems.append(f"request {i}: no artifact {name!r} (has {sorted(out)})")
                continue
            value = out[name]
            if tuple(value.shape) != tuple(shape):
                problems.append(f"request {i}: {name!r} has shape {tuple(value.shape)}, expected {tuple(shape)}")
            elif not bool(jnp.all(jnp.isfinite(value))):
                problems.append(f"request {i}: {name!r} has non-finite values")
    return problems
