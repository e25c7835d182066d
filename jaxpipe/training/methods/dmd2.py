"""``DMD2``: distribution-matching distillation of a text-to-image card into a 1–2 step student.

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
  through the card's program (captured, stop-gradient), each row picks a step ``i ~ U{0..N−1}``
  and the loss acts on that step's ``x̂0`` from its simulated input ``x_σi`` (for ``N = 1``: the one
  step from pure noise, i.e. the served sample).
* the **real score**: the frozen teacher at guidance ``dm.real_guidance`` (the card's default unless set).
* the **fake score** (the critic, trained) models the student's own distribution by flow matching
  on ``sg(x̂0)`` (``distribution_matching.critic_loss``); ``dm.critic_steps`` critic steps per student
  step, all on the SAME student samples (fresh ``t, ε`` each), run BEFORE the student update so the
  fake score is fitted to the student it is about to judge.

The student update is ``distribution_matching``'s: DMD2's normalised gradient ``g`` at a re-noised
student sample, pulled back through the student's forward (``jax.vjp``: one forward serves the
critic's samples and the update). Two optimisers (``student``, ``dm.critic``; Adam with DMD2's
``b1 = 0``), each guarded on its own (``training.update``). Trained: the loop's denoiser only (the
text encoder and autoencoder are the teacher's, frozen). The optional DMD2 GAN head is not implemented.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, CardSpec
from jaxpipe.cards import generator, registry
from jaxpipe.loops import denoise
from jaxpipe.nn.lora import LoRAConfig
from jaxpipe.program import Program
from jaxpipe.program import settings as loop_settings
from jaxpipe.prompts import Prompts
from jaxpipe.training import rollout, update
from jaxpipe.training.denoiser import adapted
from jaxpipe.training.distribution_matching import (
    DistributionMatching,
    clean_estimates,
    critic_loss,
    dm_gradient,
    dm_surrogate,
    per_row,
)
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.parts import Parts
from jaxpipe.training.rollout import Group
from jaxpipe.training.trainer import RolloutMethod, TrainState

if TYPE_CHECKING:  # the command line's flag groups, for the builders below (no import at run time)
    from jaxpipe.training.methods.flags import DMD2Flags, LoRAFlags, RunSettings

__all__ = [
    "config_from_flags",
    "from_flags",
    "DMD2Config",
    "StudentRollout",
    "DMD2",
    "student_spec",
    "STUDENT",
    "CRITIC",
]

STUDENT, CRITIC = "student", "critic"
"""The trained parts (keys of ``TrainState.params``): the student's denoiser and the critic (the fake
score); ``"critic"`` is also the role the critic is served as."""


@dataclasses.dataclass(frozen=True)
class DMD2Config:
    """Settings of a DMD2 distillation (hashable: static under ``jit``).

    Attributes:
      student_steps: the student's sampling steps N (1 or 2 in DMD2; at most the teacher's steps).
      group: student samples per batch prompt (``group.size``; B = P·K; no advantages here).
      student: the student's optimiser (Adam, ``b1 = 0``).
      dm: the critic, its steps per student step, the real score's guidance and the re-noising levels.
      model_id: the student card's id (``None``: ``"<teacher id>-turbo"``).
      lora: train LoRA adapters instead of whole denoisers (``None``: full training): the student and the
        critic are then two adapter sets on the teacher's frozen denoiser, which is the real score
        (``jaxpipe.nn.lora``); the student card has its adapters merged.

    Raises:
      ValueError: on construction, if ``student_steps`` is not an int >= 1 or ``model_id`` is empty.
    """

    student_steps: int = 1
    group: Group = Group(size=1)
    student: Optimizer = Optimizer(1e-4, b1=0.0)
    dm: DistributionMatching = DistributionMatching()
    model_id: str | None = None
    lora: LoRAConfig | None = None

    def __post_init__(self):
        validate.rule(
            not (
                isinstance(self.student_steps, bool)
                or not isinstance(self.student_steps, int)
                or self.student_steps < 1
            ),
            f"student_steps must be an int >= 1 (got {self.student_steps!r})",
        )
        validate.rule(self.model_id is None or bool(self.model_id), "model_id must be None or a non-empty string")


class StudentRollout(NamedTuple):
    """Backward-simulated student inputs (B = P·K rows).

    Attributes:
      images: the rendered images.
      latents: ``(B, *latent)`` their clean latents.
      x: ``(B, *latent)`` each row's chosen step's input.
      sigma: ``(B,)`` that step's noise level.
      step: ``(B,)`` int32, the chosen step ``i ~ U{0..N−1}``.
      cond: the conditioning.
      uncond: its unconditional counterpart (the empty prompt, for the teacher's CFG).
    """

    images: jax.Array
    latents: jax.Array
    x: jax.Array
    sigma: jax.Array
    step: jax.Array
    cond: Any
    uncond: Any


def student_spec(spec: CardSpec, loop_id: str, student_steps: int, model_id: str) -> CardSpec:
    """``spec`` as a few-step card: loop ``loop_id`` samples ``student_steps`` Euler steps at guidance 1.

    The family config's ``sampling`` changes too, when it has one, so a saved card reloads with it.

    Args:
      spec: the teacher's card spec.
      loop_id: the denoise loop to distil.
      student_steps: the student's sampling steps N.
      model_id: the student card's id.

    Returns:
      The student's ``CardSpec`` (ODE, no SDE window, no STG).
    """
    loop = spec.loop(loop_id)
    sampling = loop.config.replace(num_steps=student_steps, guidance=1.0, sampler="ode", sde_window=None, stg=0.0)
    loops = tuple(dataclasses.replace(lp, config=sampling) if lp.id == loop_id else lp for lp in spec.loops)
    config = spec.config
    if dataclasses.is_dataclass(config) and any(f.name == "sampling" for f in dataclasses.fields(config)):
        config = dataclasses.replace(config, sampling=sampling)
    return dataclasses.replace(spec, model_id=model_id, loops=loops, config=config)


class DMD2(RolloutMethod):
    """DMD2 on a text-to-image card: ``init(key)``, jitted ``rollout`` / ``update`` / ``step``, ``card(state)``.

    A batch is a ``jaxpipe.prompts.Prompts`` (no reward: its metadata is unused); each prompt is
    rendered ``config.group.size`` times by the student. The card renders through its family's
    program (or ``program``), which must run exactly one denoise loop whose denoiser conditions on a
    ``DiTCond`` (text ``context``/``context_mask``), as the generator families do. Role ``"critic"``:
    the teacher card with the critic's denoiser (the fake score).

    Args:
      card: the teacher, a text-to-image card.
      config: the settings.
      program: the program to render with (default: the family's).

    Raises:
      ValueError: if the program's denoise loop binds several denoisers, the card has no text encoder, or
        ``student_steps`` exceeds the teacher's steps.
    """

    def __init__(self, card: Card, config: DMD2Config = DMD2Config(), *, program: Program | None = None):
        self.config = config
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        self.loop = rollout.denoise_loop(card, self.program)
        if len(self.loop.binds) != 1:
            raise ValueError(
                f"DMD2 distils a loop binding one denoiser (loop {self.loop.id!r} binds {list(self.loop.binds)})"
            )
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
        guidance = config.dm.real_guidance
        self.guidance = self.loop.config.guidance if guidance is None else float(guidance)
        base = self.loop.config.replace(sampler="ode", sde_window=None, stg=0.0)
        self.real = base.replace(guidance=self.guidance)  # the teacher's CFG velocity
        self.plain = base.replace(guidance=1.0)  # student and critic: one conditional forward
        self.teacher_spec = card.spec
        self.spec = student_spec(
            card.spec, self.loop.id, config.student_steps, config.model_id or f"{card.model_id}-turbo"
        )
        self.sampling = self.spec.loop(self.loop.id).config
        self.parts = Parts(adapted(card, (self.denoiser,), config.lora), {STUDENT: (self.denoiser,)}, master=True)
        self.parts.params[CRITIC] = self.parts.params[STUDENT]  # the critic starts as a copy of the teacher's denoiser
        self.optimizers = {STUDENT: config.student.make(), CRITIC: config.dm.critic.make()}
        self.roles = {CRITIC: (self.denoiser,)}
        self._jit(card, config, program)

    @property
    def student_tx(self):
        """The student's optax optimiser (``config.student``)."""
        return self.optimizers[STUDENT]

    @property
    def critic_tx(self):
        """The critic's optax optimiser (``config.dm.critic``)."""
        return self.optimizers[CRITIC]

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The real score: a frozen copy of the teacher's denoiser."""
        return {"teacher": params[STUDENT]}

    def components(self, params, frozen) -> dict:
        """The card's modules with the student's denoiser (the critic is not part of the student card)."""
        return self.parts.components({STUDENT: params[STUDENT]}, frozen)

    def role_params(self, state: TrainState, role: str) -> dict[str, Any]:
        """The critic's parameters in the student's place (the one role is ``"critic"``)."""
        return {STUDENT: state.params[CRITIC]}

    def role_model_id(self, role: str) -> str:
        """The critic is served as a role of the teacher card (its ``role_card`` is a teacher card)."""
        return self.teacher_spec.model_id

    def role_card(self, state: TrainState, role: str) -> Card:
        """The teacher card with the critic's denoiser (``role == "critic"``, the fake score; for inspection)."""
        card = super().role_card(state, role)
        return Card(card.components, self.teacher_spec)

    def critic_card(self, state: TrainState) -> Card:
        """The teacher card with the critic's denoiser (the fake score)."""
        return self.role_card(state, CRITIC)

    def _model(self, params: nnx.State, frozen: nnx.State):
        return self.components({STUDENT: params}, frozen)[self.denoiser]

    def _rollout(self, state: TrainState, batch: Prompts, key: jax.Array) -> StudentRollout:
        """Render the batch (each prompt ``group.size`` times) with the student through the program (row
        keys ``split(fold_in(key, 0), B)``), then pick each row's step ``U{0..N−1}``."""
        card = self.rollout_card(state.params, state.frozen)
        settings = loop_settings(**{self.loop.id: self.sampling})
        run = rollout.render(
            card,
            self.program,
            settings,
            batch,
            jax.random.fold_in(key, 0),
            group_size=self.config.group.size,
            capture=(self.loop.id,),
        )
        final, trajectory = run.execution.captures[self.loop.id]
        b = run.prompts.ids.shape[0]
        step = jax.random.randint(jax.random.fold_in(key, 1), (b,), 0, self.config.student_steps)
        rows = jnp.arange(b)
        x, sigma = trajectory.x[step, rows], trajectory.sigma[step, rows]
        null = generator.encode_null(card, {"null_ids": jnp.zeros_like(run.prompts.ids)})
        uncond = final.cond._replace(context=null["uncond_context"], context_mask=null["uncond_mask"])
        return StudentRollout(run.execution.artifacts[self.artifact], final.x, x, sigma, step, final.cond, uncond)

    def student_x0(self, params: nnx.State, frozen: nnx.State, ro: StudentRollout) -> jax.Array:
        """The student's clean estimate ``x̂0 = x − σ·v_θ(x, σ, c)`` ``(B, *latent)`` at each row's step."""
        v = denoise.velocity(self._model(params, frozen), ro.x, ro.sigma, ro.cond, self.plain)
        return ro.x - per_row(ro.sigma, ro.x) * v

    def _update(self, state: TrainState, ro: StudentRollout, key: jax.Array) -> tuple[TrainState, dict]:
        """The critic's ``dm.critic_steps`` steps, then one student step, each guarded: ``(state, metrics)``."""
        dm = self.config.dm
        k_critic, k_dm = jax.random.split(key)
        x0, pullback = jax.vjp(lambda p: self.student_x0(p, state.frozen, ro), state.params[STUDENT])
        samples = jax.lax.stop_gradient(x0)
        fake_score = lambda critic, k: critic_loss(
            (self._model(critic, state.frozen),), samples, ro.cond, k, self.plain, dm.noise
        )
        critic, critic_opt, critic_losses, _, critic_skipped = update.steps(
            fake_score,
            self.critic_tx,
            state.params[CRITIC],
            state.opt_state[CRITIC],
            jax.random.split(k_critic, dm.critic_steps),
        )
        x0_real, x0_fake = clean_estimates(
            (self._model(state.copies["teacher"], state.frozen),),
            (self._model(critic, state.frozen),),
            x0,
            k_dm,
            ro.cond,
            ro.uncond,
            self.real,
            self.plain,
            dm.noise,
        )
        g = dm_gradient(x0, x0_real, x0_fake)
        metrics = {"real_gap": jnp.mean(jnp.abs(x0 - x0_real)), "fake_real_gap": jnp.mean(jnp.abs(x0_fake - x0_real))}
        loss, dx0 = jax.value_and_grad(dm_surrogate)(x0, g)
        (grads,) = pullback(dx0)
        out = update.apply_gradients(self.student_tx, state.params[STUDENT], state.opt_state[STUDENT], grads, loss)
        new = state._replace(
            params={STUDENT: out.params, CRITIC: critic},
            opt_state={STUDENT: out.opt_state, CRITIC: critic_opt},
            step=state.step + 1,
        )
        return new, {
            **metrics,
            "dm_loss": loss,
            "grad_norm": out.grad_norm,
            "critic_loss": critic_losses[-1],
            "critic_loss_first": critic_losses[0],
            "critic_skipped": jnp.sum(critic_skipped),
            "skipped": update.skipped(out.finite),
        }


def config_from_flags(run: RunSettings, lora: LoRAFlags, own: DMD2Flags) -> DMD2Config:
    """``jaxpipe train dmd2``'s config from its flags.

    Args:
      run: the run's settings (group size, the student's learning rate).
      lora: the adapters' flags.
      own: the student's steps and the critic's steps, rate and the teacher's guidance.

    Returns:
      The ``DMD2Config``.
    """
    base = DMD2Config()
    dm = DistributionMatching(
        critic=dataclasses.replace(base.dm.critic, learning_rate=own.critic_lr),
        critic_steps=own.critic_steps,
        real_guidance=own.guidance,
    )
    return DMD2Config(
        student_steps=own.student_steps,
        group=run.group(),
        student=run.optimizer(base.student),
        dm=dm,
        lora=lora.config(),
    )


def from_flags(card: Card, reward: Any, config: DMD2Config, *groups: Any, load: Any = None) -> DMD2:
    """``jaxpipe train dmd2``'s trainer on the user's card (distillation needs no reward).

    Args:
      card: the teacher card, distilled into a student.
      reward: unused (``None``).
      config: the method's config.
      *groups: the command's flag groups (unused).
      load: the command's card loader (unused).

    Returns:
      The ``DMD2`` trainer.
    """
    del reward, groups, load
    return DMD2(card, config)
