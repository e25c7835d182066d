"""``SelfForcing``: a causal (chunk-by-chunk) video card trained on its OWN rollouts by distribution
matching against a bidirectional teacher (Huang et al. 2025, "Self Forcing"; DMD2's loss).

One ``step`` on a batch of P prompts (each rendered ``config.group.size`` times, B rows):

1. **Self rollout.** The student renders whole videos chunk by chunk over its KV cache exactly as
   it serves them (``jaxpipe.loops.chunk.train_run``: the card's own chunk schedule, guidance and
   noise keys; every chunk kept, the cache filled from the student's own generated chunks). The
   gradient reaches the student only through each chunk's last denoising step; the earlier steps
   and the cache (written from the generated chunks) are stop-gradient, so a chunk is trained given
   the past it itself produced, not how that past would change (the paper's truncation). Every
   chunk exits at its last step (no random exit step): the video trained on is the served video.
2. **Distribution matching** on the whole generated latent video ``x̂`` ``(B, T, h, w, C)``
   (``training.distribution_matching``): the clean predictions of the bidirectional teacher (the
   real score, at its own default guidance unless ``dm.real_guidance``) and of the fake-score
   critic at a re-noised ``x̂`` give DMD2's normalised ``g``, and the student descends
   ``dm_surrogate(x̂, g) / numel`` (averaged over the video's elements: the scale the benchmarked
   rates were set at).
3. **Critic.** Then ``dm.critic_steps`` updates of the fake score (a copy of the teacher's DiT at
   init) by flow matching on the student's videos, fresh ``(σ, ε)`` each (all on this step's videos:
   one rollout per step, not one per critic update).

Two Adam optimisers (``student``, ``dm.critic``), each guarded on its own (``training.update``); the
first ``critic_warmup`` steps update the critic only (metric ``student_updated``). The text
encoder and autoencoder stay frozen; the student conditions on its own text encoder, the teacher
and critic on the teacher's (same prompt ids: the vocabularies must agree).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator, registry
from jaxpipe.loops import chunk
from jaxpipe.nn import DiTCond
from jaxpipe.program import Program
from jaxpipe.program import settings as loop_settings
from jaxpipe.prompts import Prompts
from jaxpipe.training import rollout, update
from jaxpipe.training.distribution_matching import (
    DistributionMatching,
    clean_estimates,
    critic_loss,
    dm_gradient,
    dm_surrogate,
)
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.parts import Parts, copy
from jaxpipe.training.rollout import Group, Sampling
from jaxpipe.training.trainer import Method, TrainState

if TYPE_CHECKING:  # the command line's flag groups, for the builders below (no import at run time)
    from jaxpipe.training.methods.flags import RunSettings, SelfForcingFlags

__all__ = [
    "config_from_flags",
    "from_flags",
    "SelfForcingConfig",
    "SelfForcing",
    "causal_loop",
    "with_sampling",
    "LOSS_KEY",
    "CRITIC_KEY",
    "STUDENT",
    "CRITIC",
]

LOSS_KEY = 1_000_003
"""``fold_in(step key, LOSS_KEY)`` draws the distribution-matching (σ, ε); the rollout uses the step key."""
CRITIC_KEY = 2_000_003
"""``fold_in(fold_in(step key, CRITIC_KEY), i)`` draws critic update ``i``'s (σ, ε)."""
STUDENT, CRITIC = "student", "critic"
"""The trained parts (keys of ``TrainState.params``): the student's denoiser and the critic (the fake
score); ``"critic"`` is also the role the critic is served as."""


@dataclasses.dataclass(frozen=True)
class SelfForcingConfig:
    """Settings of a self-forcing run (hashable: static under ``jit``).

    Attributes:
      student: the student's optimiser (the benchmarked rate 2e-5, Adam ``b1 = 0``).
      dm: the critic (rate 2e-4, ``b1 = 0``), its ``critic_steps`` per student step, the teacher's guidance
        and the re-noising levels.
      critic_warmup: first steps that update only the critic (the fake score starts as the teacher's
        copy; DMD2 trains it ahead of the generator), >= 0.
      group: rollouts per prompt (``group.size``; no advantages here).
      sampling: the student's per-chunk steps and CFG scale in training AND in the card it returns
        (``num_steps`` / ``guidance`` of ``None``: the card's own; chunk rollouts sample with the ODE).

    Raises:
      ValueError: on construction, if ``critic_warmup`` is not an int >= 0 or ``sampling`` is not the ODE.
    """

    student: Optimizer = Optimizer(2e-5, b1=0.0)  # the rates of the benchmarked run (benchmarks/self_forcing.py)
    dm: DistributionMatching = DistributionMatching(critic=Optimizer(2e-4, b1=0.0), critic_steps=4)
    critic_warmup: int = 0
    group: Group = Group(size=1)
    sampling: Sampling = Sampling(num_steps=None, guidance=None)

    def __post_init__(self):
        validate.rule(
            not (
                isinstance(self.critic_warmup, bool)
                or not isinstance(self.critic_warmup, int)
                or self.critic_warmup < 0
            ),
            f"critic_warmup must be an int >= 0 (got {self.critic_warmup!r})",
        )
        validate.rule(
            self.sampling.sampler == "ode",
            f"a chunk rollout samples with the ODE only (got sampler={self.sampling.sampler!r})",
        )


def causal_loop(card: Card, program: Program) -> LoopSpec:
    """The one ``chunk_rollout`` loop ``program`` runs on ``card``.

    Args:
      card: the student card.
      program: one of its programs.

    Returns:
      The loop's ``LoopSpec``.

    Raises:
      ValueError: if the program runs no ``chunk_rollout`` loop (the card is not causal) or several.
    """
    kinds = [card.spec.loop(n.loop).kind for n in program.loops]
    loops = [card.spec.loop(n.loop) for n in program.loops if card.spec.loop(n.loop).kind == "chunk_rollout"]
    if len(loops) != 1:
        raise ValueError(
            f"SelfForcing trains a causal card whose program runs exactly one chunk_rollout loop; {card.model_id!r}'s "
            f"program {program.name!r} runs loops of kinds {kinds} (a bidirectional card such as wan-t2v is the "
            "teacher, not the student)"
        )
    return loops[0]


def with_sampling(card: Card, loop_id: str, sampling: chunk.ChunkConfig) -> Card:
    """``card`` (same components) whose chunk loop ``loop_id`` and ``config.sampling`` are ``sampling``.

    Args:
      card: a causal card (its family config has a ``sampling`` field).
      loop_id: the chunk loop.
      sampling: the new loop config.

    Returns:
      The new ``Card``.
    """
    loops = tuple(dataclasses.replace(lp, config=sampling) if lp.id == loop_id else lp for lp in card.spec.loops)
    spec = dataclasses.replace(card.spec, loops=loops, config=dataclasses.replace(card.spec.config, sampling=sampling))
    return Card(card.components, spec)


class SelfForcing(Method):
    """Self-forcing of a causal card (``wan-causal``) against a bidirectional ``teacher`` (``wan-t2v``):
    ``init(key)``, jitted ``step(state, batch, key)``, ``card(state)``.

    A batch is a ``jaxpipe.prompts.Prompts`` (its metadata is unused); ids are in the student's
    vocabulary, which the teacher must share. ``render(state, batch, key)`` is the training rollout's
    videos (latents), ``serve(state, batch, key)`` the card's own program on the same keys. Role
    ``"critic"``: the teacher card with the critic's DiT.

    Args:
      card: the causal student card.
      teacher: the bidirectional teacher card (same vocabulary and frame shape, with a text encoder).
      config: the settings.
      program: the student's program (default: its family's).
      teacher_program: the teacher's program (default: its family's).

    Raises:
      ValueError: if the student is not causal, the teacher's loop binds several denoisers, the two cards'
        frames or vocabularies differ, or the teacher has no text encoder.
    """

    def __init__(
        self,
        card: Card,
        teacher: Card,
        config: SelfForcingConfig = SelfForcingConfig(),
        *,
        program: Program | None = None,
        teacher_program: Program | None = None,
    ):
        self.config = config
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        loop = causal_loop(card, self.program)
        self.loop_id, self.denoiser = loop.id, loop.binds[0]
        self.sampling = config.sampling.on(loop.config)
        self.latent_shape = loop.latent_shape
        t_program = registry.default_program(teacher) if teacher_program is None else teacher_program
        t_program.check(teacher)
        t_loop = rollout.denoise_loop(teacher, t_program)
        if len(t_loop.binds) != 1:
            raise ValueError(f"the teacher's denoise loop must bind one denoiser (it binds {list(t_loop.binds)})")
        if tuple(t_loop.latent_shape)[1:] != tuple(self.latent_shape)[1:]:
            raise ValueError(
                f"teacher frames {tuple(t_loop.latent_shape)[1:]} differ from the student's {tuple(self.latent_shape)[1:]}"
            )
        if getattr(teacher.spec.config, "vocabulary", None) != getattr(card.spec.config, "vocabulary", None):
            raise ValueError("the teacher and the student must share a vocabulary (they read the same prompt ids)")
        if not teacher.has("text_encoder"):
            raise ValueError(f"the teacher {teacher.model_id!r} must read text with a text_encoder component")
        self._teacher_denoiser = t_loop.binds[0]
        guidance = t_loop.config.guidance if config.dm.real_guidance is None else config.dm.real_guidance
        self.real = t_loop.config.replace(guidance=guidance)
        self.fake = t_loop.config.replace(guidance=1.0, stg=0.0)
        self.teacher_spec = teacher.spec
        self.spec = with_sampling(card, self.loop_id, self.sampling).spec
        self.parts = Parts(card, {STUDENT: (self.denoiser,)})
        used = {name: teacher[name] for name in ("text_encoder", self._teacher_denoiser)}  # not its autoencoder
        self._t_graphdef, self._teacher, self._t_rest = nnx.split(used, nnx.Param, ...)
        self._critic_graphdef, self._critic, self._critic_rest = nnx.split(
            teacher[self._teacher_denoiser], nnx.Param, ...
        )
        self.optimizers = {STUDENT: config.student.make(), CRITIC: config.dm.critic.make()}
        self.tx, self.critic_tx = self.optimizers[STUDENT], self.optimizers[CRITIC]
        self.roles = {CRITIC: (self._teacher_denoiser,)}
        self._jit(card, teacher, config, program, teacher_program)
        self.render = jax.jit(self._render)
        self.serve = jax.jit(self._serve)

    # ------------------------------------------------------------------ state and cards
    def init(self, key: jax.Array | None = None) -> TrainState:
        """Start from the student card's weights; the critic is a copy of the teacher's DiT.

        The teacher's text encoder and DiT ride along frozen (carried so they are not compiled in as
        constants).

        Args:
          key: unused (nothing random).

        Returns:
          The ``TrainState``.
        """
        del key
        params = copy({**self.parts.params, CRITIC: self._critic})
        opt_state = {part: tx.init(params[part]) for part, tx in self.optimizers.items()}
        return TrainState(
            params, opt_state, copy(self.parts.frozen), {"teacher": copy(self._teacher)}, jnp.zeros((), jnp.int32)
        )

    def components(self, params, frozen) -> dict:
        """The student card's modules (the critic belongs to the teacher's)."""
        return self.parts.components({STUDENT: params[STUDENT]}, frozen)

    def role_model_id(self, role: str) -> str:
        """The critic is served as a role of the teacher card (its ``role_card`` is a teacher card)."""
        return self.teacher_spec.model_id

    def role_card(self, state: TrainState, role: str) -> Card:
        """The teacher card with the critic's DiT (``role == "critic"``, the fake score)."""
        if role != CRITIC:
            raise KeyError(f"SelfForcing keeps the role {CRITIC!r} only (got {role!r})")
        teacher = self._teacher_parts(state)
        return Card({**teacher, self._teacher_denoiser: self._critic_model(state.params[CRITIC])}, self.teacher_spec)

    def _teacher_parts(self, state: TrainState) -> dict:
        return nnx.merge(self._t_graphdef, state.copies["teacher"], self._t_rest)

    def _critic_model(self, critic: nnx.State):
        return nnx.merge(self._critic_graphdef, critic, self._critic_rest)

    # ------------------------------------------------------------------ rollouts
    def _rows(self, batch: Prompts, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        ids = batch.repeat(self.config.group.size).ids
        return ids, jax.random.split(key, ids.shape[0])

    def _start(self, comps: Mapping[str, Any], ids: jax.Array, keys: jax.Array) -> chunk.ChunkState:
        """The chunk loop's start as the program builds it (text, no prefix, the request keys)."""
        text = generator.encode_text(comps, {"ids": ids})
        null = generator.encode_null(comps, {"null_ids": jnp.zeros_like(ids)})
        cond = DiTCond(text["context"], text["context_mask"])
        uncond = DiTCond(null["uncond_context"], null["uncond_mask"]) if self.sampling.guide.needs_uncond else None
        cond, uncond = jax.lax.stop_gradient((cond, uncond))  # the text encoder is frozen
        return chunk.init(comps[self.denoiser], keys, self.latent_shape, cond, self.sampling, uncond)

    def rollout_video(self, params: nnx.State, frozen: nnx.State, ids: jax.Array, keys: jax.Array):
        """The student's own chunked rollout (``chunk.train_run``), differentiable in ``params``.

        Args:
          params: the student's denoiser state.
          frozen: the frozen parameters.
          ids: ``(B, L)`` prompt ids.
          keys: ``(B,)`` row keys.

        Returns:
          ``(latent video (B, T, h, w, C), chunk.ChunkTrace)``.
        """
        comps = self.components({STUDENT: params}, frozen)
        state = self._start(comps, ids, keys)
        return chunk.train_run(comps[self.denoiser], state, self.sampling)

    def _render(self, state: TrainState, batch: Prompts, key: jax.Array) -> jax.Array:
        """The training rollout's latent videos ``(B, T, h, w, C)`` (row keys ``split(key, B)``)."""
        ids, keys = self._rows(batch, key)
        return self.rollout_video(state.params[STUDENT], state.frozen, ids, keys)[0]

    def _serve(self, state: TrainState, batch: Prompts, key: jax.Array) -> dict:
        """The trained card's own program on the same rows and keys as ``render``: its artifacts
        (``"video"`` ``(B, T, H, W, C)``, ``"latents"`` ``(B, T, h, w, C)``)."""
        ids, keys = self._rows(batch, key)
        card = self.card(state)
        cfg = card.spec.config
        no_prefix = jnp.zeros((ids.shape[0], 0, cfg.image_size, cfg.image_size, cfg.vae.image_channels), jnp.float32)
        slots = {"ids": ids, "null_ids": jnp.zeros_like(ids), "key": keys, "prefix_video": no_prefix}
        run = rollout.run(card, self.program, loop_settings(**{self.loop_id: self.sampling}), slots, capture=())
        return dict(run.artifacts)

    # ------------------------------------------------------------------ losses
    def _teacher_cond(self, teacher: Mapping[str, Any], ids: jax.Array) -> tuple[DiTCond, DiTCond]:
        text = generator.encode_text(teacher, {"ids": ids})
        null = generator.encode_null(teacher, {"null_ids": jnp.zeros_like(ids)})
        return DiTCond(text["context"], text["context_mask"]), DiTCond(null["uncond_context"], null["uncond_mask"])

    def scores(self, state: TrainState, video: jax.Array, ids: jax.Array, key: jax.Array):
        """The real (teacher, guided) and fake (critic) clean predictions at a re-noised ``video``.

        Args:
          state: the train state (the teacher and the critic).
          video: ``(B, T, h, w, C)`` latent videos.
          ids: ``(B, L)`` prompt ids.
          key: draws the re-noising ``(t, ε)``.

        Returns:
          ``(x0_real, x0_fake)``, each ``(B, T, h, w, C)``, both stop-gradient.
        """
        video = jax.lax.stop_gradient(video)
        teacher = self._teacher_parts(state)
        cond, uncond = self._teacher_cond(teacher, ids)
        real, fake = (teacher[self._teacher_denoiser],), (self._critic_model(state.params[CRITIC]),)
        return jax.lax.stop_gradient(
            clean_estimates(real, fake, video, key, cond, uncond, self.real, self.fake, self.config.dm.noise)
        )

    def student_loss(self, params: nnx.State, state: TrainState, ids: jax.Array, keys: jax.Array, key: jax.Array):
        """The distribution-matching surrogate of ``params``' own rollout, ``dm_surrogate(x̂, g) / numel``.

        Args:
          params: the student's denoiser state (differentiable).
          state: the train state.
          ids: ``(B, L)`` prompt ids.
          keys: ``(B,)`` row keys of the rollout.
          key: draws the re-noising.

        Returns:
          ``(loss, (video, metrics))``.
        """
        video, _ = self.rollout_video(params, state.frozen, ids, keys)
        x0_real, x0_fake = self.scores(state, video, ids, key)
        g = dm_gradient(video, x0_real, x0_fake)
        # averaged over the video's elements too (DMD2's image loss sums them): the scale the benchmarked rates were set at
        loss = dm_surrogate(video, g) / math.prod(video.shape[1:])
        return loss, (video, {"loss": loss, "dmd_grad_abs": jnp.mean(jnp.abs(g))})

    def critic_loss(self, critic: nnx.State, state: TrainState, video: jax.Array, ids: jax.Array, key: jax.Array):
        """Flow matching of the fake score on the student's (stop-gradient) videos.

        Args:
          critic: the critic's state (differentiable).
          state: the train state (the teacher's text encoder).
          video: ``(B, T, h, w, C)`` the student's latent videos.
          ids: ``(B, L)`` prompt ids.
          key: draws ``(t, ε)``.

        Returns:
          A scalar (``distribution_matching.critic_loss``).
        """
        cond, _ = self._teacher_cond(self._teacher_parts(state), ids)
        return critic_loss((self._critic_model(critic),), video, cond, key, self.fake, self.config.dm.noise)

    # ------------------------------------------------------------------ the step
    def step_fn(self, state: TrainState, batch: Prompts, key: jax.Array):
        """The pure, unjitted step: a student update on its own rollout, then ``dm.critic_steps`` critic updates.

        Args:
          state: the train state.
          batch: the prompts.
          key: the step's key.

        Returns:
          ``(state, metrics)``.
        """
        ids, keys = self._rows(batch, key)
        out = update.step(
            self.student_loss,
            self.tx,
            state.params[STUDENT],
            state.opt_state[STUDENT],
            state,
            ids,
            keys,
            jax.random.fold_in(key, LOSS_KEY),
            when=state.step >= self.config.critic_warmup,
        )
        video, metrics = out.aux
        applied = out.finite & (state.step >= self.config.critic_warmup)  # warm-up: the critic alone learns
        state = state._replace(
            params={**state.params, STUDENT: out.params},
            opt_state={**state.opt_state, STUDENT: out.opt_state},
            step=state.step + 1,
        )
        video = jax.lax.stop_gradient(video)
        critic_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
            jax.random.fold_in(key, CRITIC_KEY), jnp.arange(self.config.dm.critic_steps)
        )
        fake_score_loss = lambda critic, k: self.critic_loss(critic, state, video, ids, k)
        critic, critic_opt, c_loss, c_norm, c_skip = update.steps(
            fake_score_loss, self.critic_tx, state.params[CRITIC], state.opt_state[CRITIC], critic_keys
        )
        state = state._replace(
            params={**state.params, CRITIC: critic}, opt_state={**state.opt_state, CRITIC: critic_opt}
        )
        return state, {
            **metrics,
            "grad_norm": out.grad_norm,
            "skipped": update.skipped(out.finite),
            "student_updated": applied.astype(jnp.float32),
            "critic_loss": jnp.mean(c_loss),
            "critic_grad_norm": jnp.mean(c_norm),
            "critic_skipped": jnp.sum(c_skip),
            "video_abs": jnp.mean(jnp.abs(video)),
        }


def config_from_flags(run: RunSettings, own: SelfForcingFlags) -> SelfForcingConfig:
    """``jaxpipe train self-forcing``'s config: ``SelfForcingConfig``'s defaults but the flags given.

    Args:
      run: the run's settings (group size, the student's learning rate).
      own: the critic's steps, rate and warm-up, and the steps per chunk (``None``: the default).

    Returns:
      The ``SelfForcingConfig``.
    """
    base = SelfForcingConfig()
    dm = dataclasses.replace(
        base.dm,
        critic=base.dm.critic
        if own.critic_lr is None
        else dataclasses.replace(base.dm.critic, learning_rate=own.critic_lr),
        critic_steps=base.dm.critic_steps if own.critic_steps is None else own.critic_steps,
    )
    return SelfForcingConfig(
        student=run.optimizer(base.student),
        dm=dm,
        group=run.group(),
        critic_warmup=base.critic_warmup if own.critic_warmup is None else own.critic_warmup,
        sampling=Sampling(num_steps=own.num_steps, guidance=None),
    )


def from_flags(card: Card, reward: Any, config: SelfForcingConfig, own: SelfForcingFlags, *, load: Any) -> SelfForcing:
    """``jaxpipe train self-forcing``'s trainer on the user's causal card, against ``--teacher`` (default wan-t2v).

    Args:
      card: the causal card to train.
      reward: unused (``None``).
      config: the method's config.
      own: the command's own flags (``teacher``).
      load: the command's card loader (``id or directory -> (card,)``).

    Returns:
      The ``SelfForcing`` trainer.
    """
    del reward
    (real,) = load(own.teacher or "wan-t2v")
    return SelfForcing(card, real, config)
