"""``DMD2``: distribution-matching distillation of a text-to-image card into a 1–2 step student (DESIGN §10).

Yin et al. 2024, "Improved Distribution Matching Distillation for Fast Image Synthesis", on a
flow-matching card (``x_σ = (1−σ)·x0 + σ·ε``, velocity ``v ≈ ε − x0``, so a velocity gives the
clean estimate ``x̂0 = x_σ − σ·v``). Three copies of the teacher's denoiser:

* the **student** (trained) samples with the card's own denoise loop on its own schedule
  ``σ_0..σ_N = flow_sigmas(N, shift)`` (``N = student_steps``, the teacher's shift), Euler/ODE,
  WITHOUT guidance (the teacher's CFG is distilled in). Each step predicts ``x̂0 = x_σi − σi·v_θ``
  and the loop's Euler step to ``σ_{i+1}`` is exactly the re-noising
  ``x_σ{i+1} = (1−σ_{i+1})·x̂0 + σ_{i+1}·ε̂`` with the step's own noise estimate
  ``ε̂ = x_σi + (1−σi)·v_θ`` (at σ0 = 1, ``ε̂`` is the starting noise). DMD2 re-noises with
  fresh noise; here the intermediate re-noising is the served loop's, so the card serves exactly
  the sampler it was trained as. **Backward simulation** (DMD2 §4.5): a batch renders the student
  through the card's program (``rollout.run``, captured, stop-gradient), each row picks a step
  ``i ~ U{0..N−1}`` and the loss acts on that step's ``x̂0`` from its simulated input ``x_σi``
  (for ``N = 1``: the one step from pure noise, i.e. the served sample).
* the **real score**: the frozen teacher at guidance ``w`` (the card's default unless set),
  ``v_real = v(x, t, ∅) + w·(v(x, t, c) − v(x, t, ∅))``.
* the **fake score** (the critic, trained) models the student's own distribution: flow matching
  ``mean((v_φ(x_t, t, c) − (ε − sg(x̂0)))²)`` on ``x_t = (1−t)·sg(x̂0) + t·ε``, ``t ~ U[t_min, t_max]``,
  guidance 1. Two-time-scale rule: ``critic_updates`` critic steps per student step, all on the
  SAME student samples ``sg(x̂0)`` (fresh ``t, ε`` each), run BEFORE the student update so the
  fake score is fitted to the student it is about to judge.

The student update at a re-noised sample ``x_t = (1−t)·x̂0 + t·ε`` (``t ~ U[t_min, t_max]`` per row,
``x̂0`` carrying no gradient into ``x_t``):

    x̂0_real = x_t − t·v_real(x_t, t),   x̂0_fake = x_t − t·v_φ(x_t, t)
    g_b     = (x̂0_fake − x̂0_real)_b / sg(mean_d |x̂0 − x̂0_real|_b)        (DMD2's per-sample normaliser)
    L       = mean_b 0.5·‖x̂0_b − sg(x̂0_b − g_b)‖²                          (sum over the latent dims)

so ``∂L/∂x̂0_b = g_b / B`` (each row's gradient is exactly its ``g``, averaged over the batch like any
per-sample loss) and ``∇_θ L = (1/B)·Σ_b (∂x̂0_b/∂θ)ᵀ g_b``: descending moves ``x̂0`` toward the
teacher's denoising of its own noisy version and away from the critic's. In score form
(``s(x_t) = −(x_t − (1−t)·x̂0)/t²``) the unnormalised ``g`` is ``t²/(1−t)·(s_fake − s_real)``: per
sample, a positive multiple of DMD's ``∇ KL(p_student ‖ p_teacher)`` integrand at ``x_t``. The parameter gradient is the pull-back of
``∂L/∂x̂0`` through the student's forward (``jax.vjp``: one student forward serves the critic's
samples and the update).

Two optax optimisers (Adam with DMD2's ``β1 = 0`` by default, global-norm clipping); a non-finite
loss or gradient skips that update (``finetune.guarded_update``: the student, or that critic step,
is left unchanged). Trained: the loop's denoiser only (the text encoder and autoencoder are the
teacher's, frozen). The optional DMD2 GAN head is not implemented.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.card import Card, CardSpec
from jaxpipe.cards import generator, registry
from jaxpipe.loops import denoise
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import rollout
from jaxpipe.training.finetune import guarded_steps, guarded_update, split_trainable
from jaxpipe.training.flow_grpo import check_batch, master_weights

__all__ = ["DMD2Config", "DMD2State", "StudentRollout", "DMD2", "dm_gradient", "dm_surrogate", "student_spec"]

UPDATE_KEY = 1_000_003
"""``fold_in(step key, UPDATE_KEY)`` draws a step's critic and student-update noise (the rollout uses the step key)."""


@dataclasses.dataclass(frozen=True)
class DMD2Config:
    """Settings of a DMD2 distillation (hashable: static under ``jit``).

    student_steps: the student's sampling steps N (1 or 2 in DMD2; at most the teacher's steps);
    guidance: the real score's CFG scale (``None``: the teacher card's default); critic_updates:
    critic steps per student step; samples_per_prompt: student samples per batch prompt (B = P·K);
    t_min / t_max: the re-noising level range of the critic's and the student's losses; adam_b1:
    both optimisers' first-moment decay (DMD2 uses 0); model_id: the student card's id
    (``None``: ``"<teacher id>-turbo"``).
    """

    student_steps: int = 1
    guidance: float | None = None
    critic_updates: int = 5
    samples_per_prompt: int = 1
    student_lr: float = 1e-4
    critic_lr: float = 1e-4
    grad_clip: float = 1.0
    adam_b1: float = 0.0
    t_min: float = 0.02
    t_max: float = 0.98
    model_id: str | None = None

    def __post_init__(self):
        for name in ("student_steps", "critic_updates", "samples_per_prompt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1 (got {value!r})")
        if self.guidance is not None and (not math.isfinite(self.guidance) or self.guidance < 0):
            raise ValueError(f"guidance (the real score's CFG scale) must be None or a finite number >= 0 (got {self.guidance})")
        for name in ("student_lr", "critic_lr", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 (got {value})")
        if not 0.0 <= self.adam_b1 < 1.0:
            raise ValueError(f"adam_b1 must be in [0, 1) (got {self.adam_b1})")
        if not 0.0 < self.t_min < self.t_max <= 1.0:
            raise ValueError(f"need 0 < t_min < t_max <= 1 (got t_min={self.t_min}, t_max={self.t_max})")
        if self.model_id is not None and not self.model_id:
            raise ValueError("model_id must be None or a non-empty string")


class DMD2State(NamedTuple):
    """The student's and the critic's trainable denoiser params, the frozen teacher's (the real score),
    the frozen rest of the card, both optimiser states, step (student updates so far)."""

    student: nnx.State
    critic: nnx.State
    teacher: nnx.State
    frozen: nnx.State
    student_opt: Any
    critic_opt: Any
    step: jax.Array


class StudentRollout(NamedTuple):
    """Backward-simulated student inputs (B = P·K rows): the rendered images and their clean latents
    ``(B, *latent)``, each row's chosen step's input ``x`` ``(B, *latent)`` at noise level ``sigma``
    ``(B,)`` (``step`` ``(B,)`` int32), the conditioning and its unconditional counterpart (the empty
    prompt, for the teacher's CFG)."""

    images: jax.Array
    latents: jax.Array
    x: jax.Array
    sigma: jax.Array
    step: jax.Array
    cond: Any
    uncond: Any


def _per_row(a: jax.Array, like: jax.Array) -> jax.Array:
    return a.reshape(a.shape + (1,) * (like.ndim - a.ndim))


def dm_gradient(x0: jax.Array, x0_real: jax.Array, x0_fake: jax.Array) -> jax.Array:
    """DMD2's distribution-matching gradient ``(B, ...)``: ``(x̂0_fake − x̂0_real) / mean_d |x̂0 − x̂0_real|``
    per row, a constant (stop-gradient) of the three ``(B, ...)`` clean estimates."""
    x0, x0_real, x0_fake = jax.lax.stop_gradient((x0, x0_real, x0_fake))
    axes = tuple(range(1, x0.ndim))
    scale = jnp.mean(jnp.abs(x0 - x0_real), axis=axes, keepdims=True)
    return (x0_fake - x0_real) / jnp.maximum(scale, 1e-6)  # a row the teacher already reproduces gets a finite g


def dm_surrogate(x0: jax.Array, g: jax.Array) -> jax.Array:
    """``mean_b 0.5·‖x̂0_b − sg(x̂0_b − g_b)‖²`` (sum over the latent dims) for ``(B, ...)`` inputs: a
    scalar whose gradient in ``x̂0`` is ``g / B``."""
    target = jax.lax.stop_gradient(x0 - g)
    return jnp.mean(0.5 * jnp.sum((x0 - target) ** 2, axis=tuple(range(1, x0.ndim))))


def student_spec(spec: CardSpec, loop_id: str, student_steps: int, model_id: str) -> CardSpec:
    """``spec`` as a few-step card: loop ``loop_id`` (and the family config's ``sampling``, when it has
    one, so a saved card reloads with it) samples ``student_steps`` Euler steps at guidance 1."""
    loop = spec.loop(loop_id)
    sampling = loop.config.replace(num_steps=student_steps, guidance=1.0, sampler="ode", sde_window=None, stg=0.0)
    loops = tuple(dataclasses.replace(l, config=sampling) if l.id == loop_id else l for l in spec.loops)
    config = spec.config
    if dataclasses.is_dataclass(config) and any(f.name == "sampling" for f in dataclasses.fields(config)):
        config = dataclasses.replace(config, sampling=sampling)
    return dataclasses.replace(spec, model_id=model_id, loops=loops, config=config)


class DMD2:
    """DMD2 on a text-to-image card: ``init(key)``, jitted ``rollout`` / ``update`` / ``step``, ``card(state)``.

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}`` (labels unused: no reward);
    each prompt is rendered ``samples_per_prompt`` times by the student. The card renders through
    its family's program (or ``program``), which must run exactly one denoise loop whose denoiser
    conditions on a ``DiTCond`` (text ``context``/``context_mask``), as the generator families do.
    """

    def __init__(self, card: Card, config: DMD2Config = DMD2Config(), *, program=None):
        self.config = config
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        self.loop = rollout.denoise_loop(card, self.program)
        if len(self.loop.binds) != 1:
            raise ValueError(f"DMD2 distils a loop binding one denoiser (loop {self.loop.id!r} binds {list(self.loop.binds)})")
        if not card.has("text_encoder"):
            raise ValueError(f"DMD2 needs a text-conditioned card (card {card.model_id!r} has no text_encoder)")
        teacher_steps = self.loop.config.num_steps
        if config.student_steps > teacher_steps:
            raise ValueError(
                f"student_steps={config.student_steps} exceeds the teacher's {teacher_steps} sampling steps "
                f"(card {card.model_id!r}): a distilled student takes fewer steps than its teacher"
            )
        self.artifact = rollout.rendered_artifact(self.program)
        self.denoiser = self.loop.binds[0]
        self.guidance = self.loop.config.guidance if config.guidance is None else float(config.guidance)
        base = self.loop.config.replace(sampler="ode", sde_window=None, stg=0.0)
        self.real = base.replace(guidance=self.guidance)  # the teacher's CFG velocity
        self.plain = base.replace(guidance=1.0)  # student and critic: one conditional forward
        self.teacher_spec = card.spec
        model_id = config.model_id or f"{card.model_id}-turbo"
        self.spec = student_spec(card.spec, self.loop.id, config.student_steps, model_id)
        self.sampling = self.spec.loop(self.loop.id).config
        self._graphdef, params, self._frozen, self._rest = split_trainable(card, (self.denoiser,))
        self._params = master_weights(params)
        adam = lambda lr: optax.adam(lr, b1=config.adam_b1)
        self.student_tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), adam(config.student_lr))
        self.critic_tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), adam(config.critic_lr))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

    def init(self, key: jax.Array | None = None) -> DMD2State:
        """Student, critic and real score all start as copies of the teacher's denoiser (nothing random)."""
        del key
        student, critic, teacher, frozen = jax.tree.map(jnp.array, (self._params,) * 3 + (self._frozen,))
        return DMD2State(student, critic, teacher, frozen, self.student_tx.init(student), self.critic_tx.init(critic),
                         jnp.zeros((), jnp.int32))

    def components(self, params: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def card(self, state: DMD2State) -> Card:
        """The student card: the teacher's components with the student's denoiser, sampling
        ``student_steps`` steps at guidance 1 by default."""
        return Card(self.components(state.student, state.frozen), self.spec)

    def critic_card(self, state: DMD2State) -> Card:
        """The teacher card with the critic's denoiser (the fake score; for inspection)."""
        return Card(self.components(state.critic, state.frozen), self.teacher_spec)

    def _model(self, params: nnx.State, frozen: nnx.State):
        return self.components(params, frozen)[self.denoiser]

    def _rollout(self, state: DMD2State, batch: Mapping[str, Any], key: jax.Array) -> StudentRollout:
        """Render the batch (repeated ``samples_per_prompt`` times) with the student through the program
        (row keys ``split(fold_in(key, 0), B)``), then pick each row's step ``U{0..N−1}``."""
        card = Card(self.components(jax.lax.stop_gradient(state.student), state.frozen), self.spec)
        ids, _ = rollout.repeat_groups(batch, self.config.samples_per_prompt)
        b = ids.shape[0]
        keys = jax.random.split(jax.random.fold_in(key, 0), b)
        settings = loop_settings(**{self.loop.id: self.sampling})
        run = rollout.run(card, self.program, settings, rollout.text_slots(self.program, ids, keys), capture=(self.loop.id,))
        final, trajectory = run.captures[self.loop.id]
        step = jax.random.randint(jax.random.fold_in(key, 1), (b,), 0, self.config.student_steps)
        rows = jnp.arange(b)
        x, sigma = trajectory.x[step, rows], trajectory.sigma[step, rows]
        null = generator.encode_null(card, {"null_ids": jnp.zeros_like(ids)})
        uncond = final.cond._replace(context=null["uncond_context"], context_mask=null["uncond_mask"])
        return StudentRollout(run.artifacts[self.artifact], final.x, x, sigma, step, final.cond, uncond)

    def student_x0(self, params: nnx.State, frozen: nnx.State, ro: StudentRollout) -> jax.Array:
        """The student's clean estimate ``x̂0 = x − σ·v_θ(x, σ, c)`` ``(B, *latent)`` at each row's step."""
        v = denoise.velocity(self._model(params, frozen), ro.x, ro.sigma, ro.cond, self.plain)
        return ro.x - _per_row(ro.sigma, ro.x) * v

    def _noised(self, x0: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(x_t, t (B,), ε)``: ``x0`` re-noised at ``t ~ U[t_min, t_max]`` per row."""
        k_t, k_eps = jax.random.split(key)
        t = jax.random.uniform(k_t, x0.shape[:1], minval=self.config.t_min, maxval=self.config.t_max)
        eps = jax.random.normal(k_eps, x0.shape)
        return (1.0 - _per_row(t, x0)) * x0 + _per_row(t, x0) * eps, t, eps

    def critic_loss(self, critic: nnx.State, frozen: nnx.State, x0: jax.Array, cond: Any, key: jax.Array) -> jax.Array:
        """Flow matching of the critic on the student's samples ``x0`` (constants): a scalar."""
        x0 = jax.lax.stop_gradient(x0)
        x_t, t, eps = self._noised(x0, key)
        v = denoise.velocity(self._model(critic, frozen), x_t, t, cond, self.plain)
        return jnp.mean((v - (eps - x0)) ** 2)

    def _critic_updates(self, state: DMD2State, x0: jax.Array, cond: Any, key: jax.Array):
        """``critic_updates`` guarded critic steps on the same samples, fresh ``(t, ε)`` each:
        ``(critic, critic_opt, losses (U,), skipped (U,))``."""
        keys = jax.random.split(key, self.config.critic_updates)
        loss = lambda critic, k: self.critic_loss(critic, state.frozen, x0, cond, k)
        critic, opt, losses, _, skipped = guarded_steps(loss, self.critic_tx, state.critic, state.critic_opt, keys)
        return critic, opt, losses, skipped

    def dm_terms(self, teacher: nnx.State, critic: nnx.State, frozen: nnx.State, x0: jax.Array, ro: StudentRollout,
                 key: jax.Array) -> tuple[jax.Array, dict]:
        """DMD2's gradient ``g`` ``(B, *latent)`` for the student's ``x0`` at a fresh re-noising, and metrics."""
        x0 = jax.lax.stop_gradient(x0)
        x_t, t, _ = self._noised(x0, key)
        s = _per_row(t, x_t)
        v_real = denoise.velocity(self._model(teacher, frozen), x_t, t, ro.cond, self.real, ro.uncond)
        v_fake = denoise.velocity(self._model(critic, frozen), x_t, t, ro.cond, self.plain)
        x0_real, x0_fake = x_t - s * v_real, x_t - s * v_fake
        g = dm_gradient(x0, x0_real, x0_fake)
        return g, {"real_gap": jnp.mean(jnp.abs(x0 - x0_real)), "fake_real_gap": jnp.mean(jnp.abs(x0_fake - x0_real))}

    def _update(self, state: DMD2State, ro: StudentRollout, key: jax.Array) -> tuple[DMD2State, dict]:
        """The critic's ``critic_updates`` steps, then one student step: ``(state, metrics)``. A non-finite
        student loss or gradient leaves the student and its optimiser unchanged (``step`` still counts)."""
        k_critic, k_dm = jax.random.split(key)
        x0, pullback = jax.vjp(lambda p: self.student_x0(p, state.frozen, ro), state.student)
        critic, critic_opt, critic_losses, critic_skipped = self._critic_updates(state, jax.lax.stop_gradient(x0), ro.cond, k_critic)
        g, metrics = self.dm_terms(state.teacher, critic, state.frozen, x0, ro, k_dm)
        loss, dx0 = jax.value_and_grad(dm_surrogate)(x0, g)
        (grads,) = pullback(dx0)
        updates, student_opt = self.student_tx.update(grads, state.student_opt, state.student)
        student = optax.apply_updates(state.student, updates)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        student, student_opt = guarded_update(finite, (student, student_opt), (state.student, state.student_opt))
        new = state._replace(student=student, critic=critic, student_opt=student_opt, critic_opt=critic_opt,
                             step=state.step + 1)
        return new, {**metrics, "dm_loss": loss, "grad_norm": grad_norm, "critic_loss": critic_losses[-1],
                     "critic_loss_first": critic_losses[0], "critic_skipped": jnp.sum(critic_skipped),
                     "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: DMD2State, batch: Mapping[str, Any], key: jax.Array) -> tuple[DMD2State, dict]:
        """The pure, unjitted step (student rollout + critic and student updates), for custom ``jit``/sharding."""
        ro = self._rollout(state, batch, key)
        return self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))

    def step(self, state: DMD2State, batch: Mapping[str, Any], key: jax.Array) -> tuple[DMD2State, dict]:
        """Rollout then updates as ONE jitted function: ``(state, metrics)``."""
        check_batch(batch)
        return self._step(state, batch, key)
