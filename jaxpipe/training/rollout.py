"""Rollouts: a card's own program run with capture, plus the recomputations a trainer needs.

Nothing here samples by itself: ``run`` is ``jaxpipe.program.execute(..., capture=...)`` on the
card's program, the same nodes, keys and loops the card serves with (``jp.generate`` runs the
same fused path). The captured trajectories come back per loop; ``generated`` and
``refinement`` read them. C2 holds by construction: recomputing a captured step under the
rollout weights (``generator_stats`` / ``token_log_probs``) reproduces its log-prob (ratio == 1).

Group layout: P prompts, K samples each, B = P·K rows; row ``p·K + k`` is sample ``k`` of
prompt ``p``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe import precision, validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.loops import ar, denoise
from jaxpipe.program import Execution, Program, Settings, execute
from jaxpipe.prompts import Prompts
from jaxpipe.training.scoring import Scored, advantages, artifacts_of, reward_metrics, score_rollout

__all__ = [
    "Group",
    "Sampling",
    "Render",
    "Scored",
    "render",
    "score_rollout",
    "reward_metrics",
    "advantages",
    "artifacts_of",
    "Generated",
    "denoise_loop",
    "window_experts",
    "rendered_artifact",
    "text_slots",
    "run",
    "generated",
    "refinement",
    "generator_stats",
    "take_rows",
    "token_log_probs",
    "REWRITE_INPUTS",
]


@dataclasses.dataclass(frozen=True)
class Group:
    """How many samples a rollout renders per prompt and the clip of their group-relative advantages.

    The advantages are ``clip((r - mean_g) / (std_g + 1e-4), ±adv_clip)`` (``losses.group_advantages``;
    unused by methods without a reward); ``std_g`` is the group's std, or with ``global_std`` the whole
    batch's (the official FlowGRPO and DiffusionNFT recipes).

    Attributes:
      size: samples per prompt K, an int >= 1.
      adv_clip: the advantage clip, a finite number > 0.
      global_std: normalise by the std of all the batch's rewards instead of each group's.

    Raises:
      ValueError: on construction, if a field is out of range.
    """

    size: int = 4
    adv_clip: float = 5.0
    global_std: bool = False

    def __post_init__(self):
        validate.rule(
            not (isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1),
            f"group size (samples per prompt, K) must be an int >= 1 (got {self.size!r})",
        )
        validate.rule(
            isinstance(self.adv_clip, (int, float)) and math.isfinite(self.adv_clip) and self.adv_clip > 0,
            f"adv_clip must be a finite number > 0 (got {self.adv_clip!r})",
        )

    def check_relative(self) -> None:
        """A clear error unless the group can give group-relative advantages.

        Raises:
          ValueError: if ``size < 2``.
        """
        if self.size < 2:
            raise ValueError(f"group size (K) must be >= 2 for group-relative advantages (got {self.size})")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """A rollout's denoise policy, laid over the card's own loop config (which keeps its schedule shift,
    router, ...).

    Attributes:
      num_steps: sampling steps (``None``: the card's).
      sampler: ``"ode"`` or ``"sde"``.
      noise_level: the SDE's η.
      sde_window: ``(i, j)``: the SDE on steps ``[i, j)`` only (``None``: every step).
      guidance: the CFG scale (``None``: the card's).

    Raises:
      ValueError: on construction, if the fields do not make a valid ``DenoiseConfig``.
    """

    num_steps: int | None = 8
    sampler: str = "ode"
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    guidance: float | None = 1.0

    def __post_init__(self):
        if self.sde_window is not None:
            object.__setattr__(self, "sde_window", tuple(self.sde_window))
        self.on(denoise.DenoiseConfig())  # validates every field on a default loop

    def on(self, loop: Any) -> Any:
        """``loop`` with this policy's fields that it has; ``num_steps`` / ``guidance`` of ``None`` keep the loop's.

        Args:
          loop: a card loop's config (``DenoiseConfig``, ``ChunkConfig`` ...), a dataclass.

        Returns:
          The replaced config (validated by its own ``__post_init__``).
        """
        fields = {f.name for f in dataclasses.fields(loop)}
        changes = {
            "num_steps": self.num_steps,
            "sampler": self.sampler,
            "noise_level": self.noise_level,
            "sde_window": self.sde_window,
            "guidance": self.guidance,
        }
        changes = {
            k: v for k, v in changes.items() if k in fields and not (v is None and k in ("num_steps", "guidance"))
        }
        return dataclasses.replace(loop, **changes)


class Render(NamedTuple):
    """A batch rendered by the card's program with capture.

    Attributes:
      execution: the program's ``Execution`` (artifacts, captured loops, slots).
      prompts: the prompts of its ``B = P·K`` rows (row ``p·K + k`` is sample k of prompt p).
    """

    execution: Execution
    prompts: Prompts


def render(
    card: Card,
    program: Program,
    settings: Settings,
    prompts: Prompts,
    key: jax.Array,
    *,
    group_size: int,
    capture: tuple[str, ...] = (),
    rewrite: jax.Array | None = None,
) -> Render:
    """Run the program on ``prompts`` repeated ``group_size`` times, capturing the loops in ``capture``.

    Args:
      card: the card (at the rollout's weights).
      program: the program to run.
      settings: the loops' settings for this rollout.
      prompts: the P prompts.
      key: the rollout's key (row keys ``split(key, B)``).
      group_size: samples per prompt K.
      capture: the ids of the loops to capture.
      rewrite: ``(B,)`` bool, the rows a refining / thinking program rewrites (default all).

    Returns:
      The ``Render`` of the ``B = P·K`` rows.

    Raises:
      ValueError: if the program needs inputs a text rollout does not provide (``text_slots``).
    """
    rows = prompts.repeat(group_size)
    keys = jax.random.split(key, rows.ids.shape[0])
    slots = text_slots(program, rows.ids, keys, rewrite)
    return Render(execute(program, settings, card, slots, capture=capture), rows)


REWRITE_INPUTS = ("refine", "think")
"""Program inputs that say which rows rewrite their prompt before rendering (a refiner LM, a thinking MoT)."""


class Generated(NamedTuple):
    """A rendered batch and the captured steps of its denoise loop.

    Attributes:
      images: ``(B, H, W, C)`` in [0, 1] (videos ``(B, T, H, W, C)`` for a video program).
      cond: the conditioning its denoise loop used (the family's ``cond`` pytree).
      trajectory: the captured steps, ``Transition`` fields ``(S, B, ...)``.
      uncond: the unconditional conditioning of a rollout under classifier-free guidance (``None`` at
        guidance 1): the recompute runs both branches through the trained weights.
    """

    images: jax.Array
    cond: Any
    trajectory: denoise.Transition
    uncond: Any = None


def denoise_loop(card: Card, program: Program) -> LoopSpec:
    """The one denoise loop ``program`` runs on ``card`` (the generator an RL method trains).

    Args:
      card: the card.
      program: one of its programs.

    Returns:
      The loop's ``LoopSpec``.

    Raises:
      ValueError: if the program runs no denoise loop or several.
    """
    loops = [card.spec.loop(n.loop) for n in program.loops if card.spec.loop(n.loop).kind == "denoise"]
    if len(loops) != 1:
        raise ValueError(
            f"card {card.model_id!r}: its program {program.name!r} runs {len(loops)} denoise loops; an RL method "
            "trains a program with exactly one"
        )
    return loops[0]


def window_experts(loop: LoopSpec, sampling: denoise.DenoiseConfig) -> tuple[str, ...]:
    """The denoisers ``loop`` binds that some captured step (the SDE window) routes to under ``sampling``.

    These are the only experts a loss on the captured steps reaches. Computed from the static policy
    alone (steps, shift, σ₀, window, router): the router applied to the sigmas of the window's steps,
    ``schedule(sampling)[i:j]`` (float32, as the loop computes them).

    Args:
      loop: the denoise loop (its ``binds``).
      sampling: the rollout's loop config.

    Returns:
      The component names, in binding order.
    """
    lo, hi = sampling.captured_steps
    sigmas = denoise.schedule(sampling)[lo:hi]
    used = set(np.asarray(sampling.router(sigmas)).tolist())
    return tuple(name for i, name in enumerate(loop.binds) if i in used)


def rendered_artifact(program: Program) -> str:
    """What ``program`` renders for a reward to score.

    Args:
      program: the program.

    Returns:
      ``"image"`` (``(B, H, W, C)``) or, for a video program, ``"video"`` (``(B, T, H, W, C)``).

    Raises:
      ValueError: if the program outputs neither.
    """
    names = dict(program.outputs)
    for name in ("image", "video"):
        if name in names:
            return name
    raise ValueError(f"program {program.name!r} renders neither an image nor a video (outputs: {sorted(names)})")


def text_slots(
    program: Program, ids: jax.Array, keys: jax.Array, refine: jax.Array | None = None
) -> dict[str, jax.Array]:
    """The input slots of a text-prompted program for a batch.

    Args:
      program: the program (its ``inputs``).
      ids: ``(B, L)`` prompt ids.
      keys: ``(B,)`` per-row PRNG keys.
      refine: ``(B,)`` bool, for a program that rewrites its prompt first (its ``refine`` or ``think``
        input): the rows it rewrites (default all).

    Returns:
      The program's inputs by name: ``ids``, ``null_ids`` (the empty prompt), ``key`` and the rewrite flag.

    Raises:
      ValueError: if the program needs other inputs.
    """
    slots = {"ids": ids, "null_ids": jnp.zeros_like(ids), "key": keys}
    for flag in REWRITE_INPUTS:
        if flag in program.inputs:
            slots[flag] = jnp.ones(ids.shape[:1], bool) if refine is None else refine
    missing = sorted(set(program.inputs) - set(slots))
    if missing:
        raise ValueError(f"program {program.name!r} needs inputs {missing} that a text rollout does not provide")
    return {name: slots[name] for name in program.inputs}


def run(
    card: Card, program: Program, settings: Settings, slots: Mapping[str, Any], capture: tuple[str, ...]
) -> Execution:
    """The card's program on batched ``slots`` (fused), capturing the loops named in ``capture``.

    Args:
      card: the card.
      program: the program.
      settings: the loops' settings.
      slots: input name -> batched value.
      capture: the ids of the loops to capture.

    Returns:
      The ``Execution``.
    """
    return execute(program, settings, card, slots, capture=capture)


def generated(execution: Execution, loop_id: str, artifact: str = "image") -> Generated:
    """The rendered batch of a captured denoise loop and its ``artifact``.

    Args:
      execution: the program's execution.
      loop_id: the captured denoise loop.
      artifact: the artifact to return as ``images`` (``"image"`` or ``"video"``).

    Returns:
      The ``Generated`` batch.

    Raises:
      ValueError: if the loop was not captured.
    """
    final, trajectory = execution.captures[loop_id]
    if trajectory is None:
        raise ValueError(f"loop {loop_id!r} was not captured")
    return Generated(execution.artifacts[artifact], final.cond, trajectory, final.uncond)


def refinement(execution: Execution, loop_id: str) -> ar.Continuation:
    """The captured continuation of an AR loop.

    Args:
      execution: the program's execution.
      loop_id: the captured AR loop.

    Returns:
      Its ``ar.Continuation``, fields ``(B, ...)``.

    Raises:
      ValueError: if the loop was not captured.
    """
    final, records = execution.captures[loop_id]
    if records is None:
        raise ValueError(f"loop {loop_id!r} was not captured")
    return ar.continuation(final, records)


def take_rows(generated: Generated, rows: jax.Array) -> Generated:
    """The rendered batch restricted to some rows.

    Args:
      generated: the rendered batch.
      rows: ``(b,)`` row indices.

    Returns:
      The ``Generated`` of those rows: images and conditioning by row, the trajectory's fields
      ``(S, B, ...)`` along their row axis.
    """
    by_row = lambda a: a[rows]
    return Generated(
        generated.images[rows],
        jax.tree.map(by_row, generated.cond),
        jax.tree.map(lambda a: a[:, rows], generated.trajectory),
        jax.tree.map(by_row, generated.uncond),
    )


def generator_stats(
    models, generated: Generated, sampling: denoise.DenoiseConfig, *, detach_uncond: bool = False
) -> tuple[jax.Array, jax.Array]:
    """The log-probs and SDE means of the captured steps, recomputed under ``models``.

    Under classifier-free guidance (``sampling.guidance != 1``) the velocity is the CFG-combined one,
    ``v_u + w·(v_c − v_u)``, both branches through ``models`` as the rollout ran them (the rollout's
    ``uncond``); ``detach_uncond`` stops the gradient through ``v_u`` (the official FlowGRPO code's
    ``noise_pred_uncond.detach()``) without changing a value.

    Float32 denoisers are recomputed ``vmap``ped over time. One computing below float32 is recomputed
    step after step (``lax.map`` over time): each network call then has the rollout's own shapes, so it
    is the same bfloat16 program and reproduces the captured log-probs exactly (C2). A vmap over time
    reshapes every matmul, and one flipped bfloat16 rounding moves a log-prob by ~1e-3 (measured on the
    bundled flux-t2i: 8e-4), as large as the PPO clip. Each step is rematerialised in the backward pass,
    so a gradient holds one step's activations at a time, not the whole window's.

    Args:
      models: the loop's bound denoiser(s).
      generated: the rendered batch with its captured trajectory (and ``uncond`` under guidance).
      sampling: the rollout's loop config (its guidance is the rollout's).
      detach_uncond: no gradient through the unconditional branch of CFG.

    Returns:
      ``(log_probs (S, B), means (S, B, ...))`` (``denoise.trajectory_stats``).

    Raises:
      ValueError: if the guidance needs the unconditional conditioning and the rollout holds none.
    """
    if sampling.guide.needs_uncond and generated.uncond is None:
        raise ValueError(
            f"the rollout was sampled at guidance {sampling.guidance} but holds no unconditional conditioning: "
            "render it with the program at that guidance (rollout.render) so both CFG branches can be recomputed"
        )
    stats = functools.partial(denoise.trajectory_stats, detach_uncond=detach_uncond)
    bound = models if isinstance(models, (tuple, list)) else (models,)
    if all(precision.module_dtype(m) == "float32" for m in bound):
        return stats(models, generated.trajectory, generated.cond, sampling, generated.uncond)

    def one_step(transition: denoise.Transition) -> tuple[jax.Array, jax.Array]:
        alone = jax.tree.map(lambda a: a[None], transition)  # a 1-step trajectory
        return stats(models, alone, generated.cond, sampling, generated.uncond)

    # checkpointed: the backward recomputes one step at a time, so only one step's activations are ever held
    # (a video network's are tens of GB per step); the forward values are the same program's
    log_prob, mean = jax.lax.map(jax.checkpoint(one_step), generated.trajectory)
    return log_prob[:, 0], mean[:, 0]


def token_log_probs(llm: ar.Decoder, refinement: ar.Continuation) -> jax.Array:
    """The generated tokens' ``log π(y_t | prompt, y_<t)`` recomputed under ``llm`` (``ar.sequence_log_probs``).

    Args:
      llm: the decoder.
      refinement: the captured continuation.

    Returns:
      ``(B, T)`` float32, 0 outside ``refinement.mask``.
    """
    return ar.sequence_log_probs(llm, refinement.tokens, refinement.prompt_length, refinement.mask)
