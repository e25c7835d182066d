"""How much of a trainer's update is signal: the gradient signal-to-noise of its configured batch.

An RL step's gradient is an estimate from a few sampled images; when the batch is small the estimate is
mostly noise and the weights random-walk while the reward stays flat. ``measure`` runs the trainer's whole
step a few times at its initial weights, each time on the same batch with an independent key, with every
optimiser replaced by one that records the gradients and changes nothing (``recorder``), and reads

    SNR = |E g|² / E|g - E g|²

off those gradients (``signal_to_noise``: unbiased for the signal, so a pure-noise batch reads about 0).
The noise of an average over independent samples falls as 1 / (images per step), so the SNR grows with the
batch: ``GradientNoise.images_for`` is the batch that would reach a given level. Below ``USEFUL`` (one part
signal in ten) the run is unlikely to learn in a sensible number of steps; ``jaxpipe train`` measures it at
the start of a run (``--snr-rollouts``) and warns with the batch that would.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpipe.prompts import Prompts

__all__ = ["USEFUL", "GradientNoise", "RecordedGradients", "recorder", "signal_to_noise", "step_gradients", "measure"]

USEFUL = 0.1
"""The signal-to-noise below which ``measure`` warns: under one part signal in ten of each update."""


class RecordedGradients(NamedTuple):
    """``recorder``'s state: the sum of the gradients it was given and how many."""

    total: Any
    count: jax.Array


def recorder() -> optax.GradientTransformation:
    """An optimiser that records: it sums the gradients it is given (``RecordedGradients``) and returns zero
    updates, so a step run with it leaves the weights as they were and every update of the step sees them.

    Returns:
      The transformation.
    """

    def init(params):
        return RecordedGradients(jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        del params
        total = jax.tree.map(jnp.add, state.total, updates)
        return jax.tree.map(jnp.zeros_like, updates), RecordedGradients(total, state.count + 1)

    return optax.GradientTransformation(init, update)


def signal_to_noise(gradients: np.ndarray) -> tuple[float, float, float]:
    """The signal-to-noise of ``n`` independent draws of a gradient.

    Args:
      gradients: ``(n, D)``, ``n >= 2``: one flattened gradient per draw.

    Returns:
      ``(snr, signal, noise)``: ``noise`` = E|g - E g|² (the sample variance, summed over coordinates),
      ``signal`` = |E g|² (|mean|² less the noise of the mean, ``noise / n``: unbiased, may be slightly
      negative when there is none), ``snr = signal / noise``.

    Raises:
      ValueError: for fewer than two draws or a non-finite gradient.
    """
    g = np.asarray(gradients, np.float64)
    if g.ndim != 2 or len(g) < 2:
        raise ValueError(f"signal_to_noise needs (n >= 2, D) gradients (got shape {g.shape})")
    if not np.isfinite(g).all():
        raise ValueError("a recorded gradient is not finite: the step's loss is not finite at these weights")
    mean = g.mean(0)
    noise = float(((g - mean) ** 2).sum(1).sum() / (len(g) - 1))
    signal = float((mean**2).sum() - noise / len(g))
    return (signal / noise if noise > 0 else math.inf), signal, noise


def _recording(method: Any) -> Any:
    """A copy of ``method`` whose optimisers (and the attributes that hold them) are ``recorder`` s, jitted anew."""
    probe = copy.copy(method)
    swapped = {id(tx): recorder() for tx in method.optimizers.values()}
    probe.optimizers = {part: swapped[id(tx)] for part, tx in method.optimizers.items()}
    for name, value in vars(method).items():
        if id(value) in swapped and name != "optimizers":
            setattr(probe, name, swapped[id(value)])
    probe._make_jits()
    return probe


def step_gradients(method: Any, state: Any, batch: Any, keys: jax.Array) -> dict[str, np.ndarray]:
    """The gradients one step of ``method`` takes from ``state`` on ``batch``, once per key, by trained part.

    Every update of a step (minibatches, epochs) sees ``state``'s weights; their gradients are summed.

    Args:
      method: a ``jaxpipe.training.Method`` (its ``step``, ``optimizers``, ``init``).
      state: the training state to differentiate at (e.g. ``method.init()``).
      batch: the step's batch.
      keys: ``(n,)`` PRNG keys, one step each.

    Returns:
      ``{part: (n, D_part) float32}``: each step's summed gradient, flattened.
    """
    probe = _recording(method)
    start = probe.init()._replace(params=state.params, frozen=state.frozen, copies=state.copies, step=state.step)
    out: dict[str, list[np.ndarray]] = {part: [] for part in probe.optimizers}
    for key in keys:
        new, _ = probe.step(start, batch, key)
        for part in out:
            total = new.opt_state[part].total
            out[part].append(np.concatenate([np.ravel(np.asarray(x, np.float32)) for x in jax.tree.leaves(total)]))
    return {part: np.stack(rows) for part, rows in out.items()}


@dataclasses.dataclass(frozen=True)
class GradientNoise:
    """A measured gradient signal-to-noise (``measure``).

    Attributes:
      snr: of the whole gradient (every trained part).
      by_part: each trained part's own.
      signal: |E g|² of the whole gradient.
      noise: E|g - E g|².
      rollouts: the steps it was measured over.
      images: the images (rows) each step renders, or ``None`` when unknown.
    """

    snr: float
    by_part: dict[str, float]
    signal: float
    noise: float
    rollouts: int
    images: int | None

    def images_for(self, level: float = USEFUL) -> int | None:
        """The images per step that would bring the SNR to ``level`` (it grows with the batch), or ``None``
        when the measured signal is not positive or the batch size is unknown."""
        if self.images is None or not self.snr > 0:
            return None
        return max(self.images, math.ceil(self.images * level / self.snr))

    @property
    def low(self) -> bool:
        """Whether the SNR is under ``USEFUL``."""
        return self.snr < USEFUL

    def message(self) -> str:
        """One line for the console: the SNR, and below ``USEFUL`` a warning with the batch that would reach it."""
        parts = "" if len(self.by_part) < 2 else " (" + ", ".join(f"{k} {v:.3g}" for k, v in self.by_part.items()) + ")"
        batch = f" at {self.images} images per step" if self.images else ""
        line = f"gradient signal-to-noise {self.snr:.3g}{parts}{batch}, over {self.rollouts} rollouts at the initial weights"
        if not self.low:
            return line
        need = self.images_for()
        advice = (
            f"about {need} images per step would reach {USEFUL}"
            if need
            else "no signal measured: a larger batch, a denser reward or more rollouts"
        )
        return f"{line}. WARNING: under {USEFUL}, most of each update is noise; {advice}."

    def to_json(self) -> dict:
        """The measurement as a JSON-able dict (with ``images_for_useful``)."""
        return {**dataclasses.asdict(self), "useful": USEFUL, "images_for_useful": self.images_for()}


def measure(method: Any, batch: Any, key: jax.Array, *, rollouts: int = 4, state: Any = None) -> GradientNoise:
    """The gradient signal-to-noise of ``method``'s step on ``batch``: ``rollouts`` independent steps at the
    initial weights (``state``, default ``method.init()``), keyed ``jax.random.split(key, rollouts)``.

    Args:
      method: a ``jaxpipe.training.Method``.
      batch: the configured batch (e.g. the run's first): its rows are the images per step.
      key: a PRNG key, not one the run itself uses.
      rollouts: independent steps, >= 2 (more: a steadier estimate).
      state: the state to measure at (default: ``method.init()``).

    Returns:
      The ``GradientNoise``.

    Raises:
      ValueError: if ``rollouts < 2``.
    """
    if rollouts < 2:
        raise ValueError(f"the gradient signal-to-noise needs rollouts >= 2 (got {rollouts})")
    method.check_batch(batch)
    state = method.init() if state is None else state
    keys = jax.random.split(key, rollouts)
    grads = step_gradients(method, state, batch, keys)
    by_part = {part: signal_to_noise(g)[0] for part, g in grads.items()}
    snr, signal, noise = signal_to_noise(np.concatenate(list(grads.values()), axis=1))
    rows = _rows(method, batch)
    return GradientNoise(snr, by_part, signal, noise, rollouts, rows)


def _rows(method: Any, batch: Any) -> int | None:
    """The images a step renders: the batch's prompts times the method's group size, when it has one."""
    config = getattr(method, "config", None)
    group = getattr(config, "group", None) or getattr(getattr(config, "generator", None), "group", None)
    if not isinstance(batch, Prompts) or group is None:
        return None
    return len(batch) * group.size
