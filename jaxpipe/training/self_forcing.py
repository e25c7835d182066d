"""``SelfForcing``: a causal (chunk-by-chunk) video card trained on its OWN rollouts by distribution
matching against a bidirectional teacher (Huang et al. 2025, "Self Forcing"; DMD2's loss).

One ``step`` on a batch of P prompts (each rendered ``samples_per_prompt`` times, B rows):

1. **Self rollout.** The student renders whole videos chunk by chunk over its KV cache exactly as
   it serves them (``jaxpipe.loops.chunk.train_run``: the card's own chunk schedule, guidance and
   noise keys; every chunk kept, the cache filled from the student's own generated chunks). The
   gradient reaches the student only through each chunk's last denoising step; the earlier steps
   and the cache (written from the generated chunks) are stop-gradient, so a chunk is trained given
   the past it itself produced, not how that past would change (the paper's truncation). Every
   chunk exits at its last step (no random exit step): the video trained on is the served video.
2. **Distribution matching** on the whole generated latent video ``x̂`` ``(B, T, h, w, C)``: per row
   ``σ ~ U[sigma_min, sigma_max]``, ``ε ~ N(0, I)``, ``x_σ = (1−σ)·sg(x̂) + σ·ε``; the clean
   predictions ``x0 = x_σ − σ·v`` of the bidirectional teacher (the real score, at its own default
   guidance) and of the fake-score critic (guidance 1) give, with DMD2's normalisation,

       g = (x0_fake − x0_real) / mean_row(|x̂ − x0_real|)
       L = 0.5 · mean((x̂ − sg(x̂ − g))²)          (∇_x̂ L = g / numel: x̂ moves toward the real score)

   (``dmd2.dm_gradient`` and ``dmd2.dm_surrogate`` divided by the elements per video: the same terms as DMD2.)

3. **Critic.** Then ``critic_steps`` updates of the fake score (a copy of the teacher's DiT at
   init) by flow matching on the student's videos, ``mean((v_fake(x_σ) − (ε − x̂))²)`` with fresh
   ``(σ, ε)`` each (all on this step's videos: one rollout per step, not one per critic update).

Two Adam optimisers (student, critic), each with global-norm clipping; a non-finite loss or
gradient skips that optimiser's update (``guarded_update``), the other still updates. The first
``warmup_steps`` steps update the critic only (metric ``student_updated``). The text
encoder and autoencoder stay frozen; the student conditions on its own text encoder, the teacher
and critic on the teacher's (same prompt ids: the vocabularies must agree).
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

from jaxpipe.card import Card, LoopSpec
from jaxpipe.cards import generator, registry
from jaxpipe.loops import chunk, denoise
from jaxpipe.nn import DiTCond
from jaxpipe.program import Program
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import rollout
from jaxpipe.training.dmd2 import dm_gradient, dm_surrogate
from jaxpipe.training.finetune import guarded_steps, guarded_update, split_trainable
from jaxpipe.training.flow_grpo import check_batch

__all__ = ["SelfForcingConfig", "SelfForcingState", "SelfForcing", "causal_loop",
           "with_sampling"]

LOSS_KEY = 1_000_003
"""``fold_in(step key, LOSS_KEY)`` draws the distribution-matching (σ, ε); the rollout uses the step key."""
CRITIC_KEY = 2_000_003
"""``fold_in(fold_in(step key, CRITIC_KEY), i)`` draws critic update ``i``'s (σ, ε)."""


@dataclasses.dataclass(frozen=True)
class SelfForcingConfig:
    """Settings of a self-forcing run (hashable: static under ``jit``).

    learning_rate / critic_learning_rate: the two Adam rates (``adam_b1``, ``adam_b2`` shared);
    critic_steps: critic updates per student update; warmup_steps: first steps that update only the critic
    (the fake score starts as the teacher's copy; DMD2 trains it ahead of the generator); grad_clip: global-norm clip of each;
    samples_per_prompt: rollouts per prompt; num_steps / guidance: the student's per-chunk steps and
    CFG scale in training AND in the card it returns (``None``: the card's own); real_guidance: the
    teacher's CFG scale (``None``: the teacher's default); sigma_min / sigma_max: the re-noising range.
    """

    learning_rate: float = 2e-5  # the rates of the benchmarked run (benchmarks/self_forcing.py)
    critic_learning_rate: float = 2e-4
    critic_steps: int = 4
    warmup_steps: int = 0
    grad_clip: float = 1.0
    adam_b1: float = 0.0
    adam_b2: float = 0.999
    samples_per_prompt: int = 1
    num_steps: int | None = None
    guidance: float | None = None
    real_guidance: float | None = None
    sigma_min: float = 0.02
    sigma_max: float = 0.98

    def __post_init__(self):
        for name in ("learning_rate", "critic_learning_rate", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 (got {value})")
        if not (0.0 <= self.adam_b1 < 1.0 and 0.0 <= self.adam_b2 < 1.0):
            raise ValueError(f"adam_b1 and adam_b2 must be in [0, 1) (got {self.adam_b1}, {self.adam_b2})")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0 (got {self.warmup_steps!r})")
        for name in ("critic_steps", "samples_per_prompt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int (got {value!r})")
        if self.num_steps is not None and (isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int)
                                           or self.num_steps < 1):
            raise ValueError(f"num_steps (per chunk) must be None (the card's) or a positive int (got {self.num_steps!r})")
        for name in ("guidance", "real_guidance"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be None (the card's default) or a finite number >= 0 (got {value})")
        if not 0.0 < self.sigma_min < self.sigma_max <= 1.0:
            raise ValueError(f"need 0 < sigma_min < sigma_max <= 1 (got {self.sigma_min}, {self.sigma_max})")


class SelfForcingState(NamedTuple):
    """The student's trainable params (its causal DiT), the frozen rest of the student card, the
    critic's params (the fake score), the teacher's text encoder and DiT params (frozen; carried so
    they are not compiled in as constants), both optimiser states, step (steps so far, warm-up included)."""

    params: nnx.State
    frozen: nnx.State
    critic: nnx.State
    teacher: nnx.State
    opt_state: Any
    critic_opt_state: Any
    step: jax.Array


def causal_loop(card: Card, program: Program) -> LoopSpec:
    """The one ``chunk_rollout`` loop ``program`` runs on ``card`` (ValueError when there is none: the
    card is not causal)."""
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
    """``card`` (same components) whose chunk loop ``loop_id`` and ``config.sampling`` are ``sampling``."""
    loops = tuple(dataclasses.replace(l, config=sampling) if l.id == loop_id else l for l in card.spec.loops)
    spec = dataclasses.replace(card.spec, loops=loops, config=dataclasses.replace(card.spec.config, sampling=sampling))
    return Card(card.components, spec)


class SelfForcing:
    """Self-forcing of a causal card (``wan-causal``) against a bidirectional ``teacher`` (``wan-t2v``):
    ``init(key)``, jitted ``step(state, batch, key)``, ``card(state)``.

    A batch is ``{"ids": (P, L) int32, "labels": {...}}`` (labels unused); ids are in the student's
    vocabulary, which the teacher must share. ``render(state, batch, key)`` is the training rollout's
    videos (latents), ``serve(state, batch, key)`` the card's own program on the same keys.
    """

    def __init__(self, card: Card, teacher: Card, config: SelfForcingConfig = SelfForcingConfig(), *,
                 program: Program | None = None, teacher_program: Program | None = None):
        self.config = config
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        loop = causal_loop(card, self.program)
        self.loop_id, self.denoiser = loop.id, loop.binds[0]
        self.sampling = loop.config.replace(
            num_steps=config.num_steps or loop.config.num_steps,
            guidance=loop.config.guidance if config.guidance is None else config.guidance)
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
        self._teacher_denoiser = t_loop.binds[0]
        guidance = t_loop.config.guidance if config.real_guidance is None else config.real_guidance
        self.real = t_loop.config.replace(guidance=guidance)
        self.fake = t_loop.config.replace(guidance=1.0, stg=0.0)
        self.spec = with_sampling(card, self.loop_id, self.sampling).spec
        self._graphdef, params, self._frozen, self._rest = split_trainable(card, (self.denoiser,))
        self._params = params
        if not teacher.has("text_encoder"):
            raise ValueError(f"the teacher {teacher.model_id!r} must read text with a text_encoder component")
        used = {name: teacher[name] for name in ("text_encoder", self._teacher_denoiser)}  # not its autoencoder
        self._t_graphdef, self._teacher, self._t_rest = nnx.split(used, nnx.Param, ...)
        self._critic_graphdef, self._critic, self._critic_rest = nnx.split(teacher[t_loop.binds[0]], nnx.Param, ...)
        adam = lambda lr: optax.chain(optax.clip_by_global_norm(config.grad_clip),
                                      optax.adam(lr, b1=config.adam_b1, b2=config.adam_b2))
        self.tx, self.critic_tx = adam(config.learning_rate), adam(config.critic_learning_rate)
        self.render = jax.jit(self._render)
        self.serve = jax.jit(self._serve)
        self._step = jax.jit(self.step_fn)

    # ------------------------------------------------------------------ state and cards
    def init(self, key: jax.Array | None = None) -> SelfForcingState:
        """Start from the student card's weights; the critic is a copy of the teacher's DiT."""
        del key
        params, frozen, critic, teacher = jax.tree.map(jnp.array, (self._params, self._frozen, self._critic, self._teacher))
        return SelfForcingState(params, frozen, critic, teacher, self.tx.init(params), self.critic_tx.init(critic),
                                jnp.zeros((), jnp.int32))

    def components(self, params: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def card(self, state: SelfForcingState) -> Card:
        """The trained causal card (its chunk loop at the sampling it was trained with)."""
        return Card(self.components(state.params, state.frozen), self.spec)

    def _teacher_parts(self, state: SelfForcingState) -> dict:
        return nnx.merge(self._t_graphdef, state.teacher, self._t_rest)

    def _critic_model(self, critic: nnx.State):
        return nnx.merge(self._critic_graphdef, critic, self._critic_rest)

    # ------------------------------------------------------------------ rollouts
    def _rows(self, batch: Mapping[str, Any], key: jax.Array) -> tuple[jax.Array, jax.Array]:
        ids = jnp.repeat(batch["ids"], self.config.samples_per_prompt, axis=0)
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
        """The student's own chunked rollout, differentiable in ``params``: ``(latent video (B, T, h, w, C),
        chunk.ChunkTrace)``."""
        comps = self.components(params, frozen)
        state = self._start(comps, ids, keys)
        return chunk.train_run(comps[self.denoiser], state, self.sampling)

    def _render(self, state: SelfForcingState, batch: Mapping[str, Any], key: jax.Array) -> jax.Array:
        """The training rollout's latent videos ``(B, T, h, w, C)`` (row keys ``split(key, B)``)."""
        ids, keys = self._rows(batch, key)
        return self.rollout_video(state.params, state.frozen, ids, keys)[0]

    def _serve(self, state: SelfForcingState, batch: Mapping[str, Any], key: jax.Array) -> dict:
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
    def _noised(self, x0: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(σ (B,), ε, x_σ = (1−σ)·x0 + σ·ε)`` for a stop-gradient ``x0`` ``(B, ...)``."""
        cfg = self.config
        k_sigma, k_noise = jax.random.split(key)
        sigma = jax.random.uniform(k_sigma, x0.shape[:1], minval=cfg.sigma_min, maxval=cfg.sigma_max)
        noise = jax.random.normal(k_noise, x0.shape)
        s = sigma.reshape((-1,) + (1,) * (x0.ndim - 1))
        return sigma, noise, (1.0 - s) * x0 + s * noise

    def _teacher_cond(self, teacher: Mapping[str, Any], ids: jax.Array) -> tuple[DiTCond, DiTCond]:
        text = generator.encode_text(teacher, {"ids": ids})
        null = generator.encode_null(teacher, {"null_ids": jnp.zeros_like(ids)})
        return DiTCond(text["context"], text["context_mask"]), DiTCond(null["uncond_context"], null["uncond_mask"])

    def scores(self, state: SelfForcingState, video: jax.Array, ids: jax.Array, key: jax.Array):
        """The real (teacher, guided) and fake (critic) clean predictions at a re-noised ``video``:
        ``(x0_real, x0_fake)`` ``(B, T, h, w, C)``, both stop-gradient."""
        video = jax.lax.stop_gradient(video)
        teacher = self._teacher_parts(state)
        cond, uncond = self._teacher_cond(teacher, ids)
        sigma, _, x_sigma = self._noised(video, key)
        s = sigma.reshape((-1,) + (1,) * (video.ndim - 1))
        v_real = denoise.velocity((teacher[self._teacher_denoiser],), x_sigma, sigma, cond, self.real, uncond)
        v_fake = denoise.velocity((self._critic_model(state.critic),), x_sigma, sigma, cond, self.fake)
        return jax.lax.stop_gradient((x_sigma - s * v_real, x_sigma - s * v_fake))

    def student_loss(self, params: nnx.State, state: SelfForcingState, ids: jax.Array, keys: jax.Array, key: jax.Array):
        """The distribution-matching surrogate of ``params``' own rollout: ``(loss, (video, metrics))``."""
        video, _ = self.rollout_video(params, state.frozen, ids, keys)
        x0_real, x0_fake = self.scores(state, video, ids, key)
        g = dm_gradient(video, x0_real, x0_fake)
        # averaged over the video's elements too (DMD2's image loss sums them): the scale the benchmarked rates were set at
        loss = dm_surrogate(video, g) / math.prod(video.shape[1:])
        return loss, (video, {"loss": loss, "dmd_grad_abs": jnp.mean(jnp.abs(g))})

    def critic_loss(self, critic: nnx.State, state: SelfForcingState, video: jax.Array, ids: jax.Array, key: jax.Array):
        """Flow matching of the fake score on the student's (stop-gradient) videos: a scalar."""
        video = jax.lax.stop_gradient(video)
        cond, _ = self._teacher_cond(self._teacher_parts(state), ids)
        sigma, noise, x_sigma = self._noised(video, key)
        v = denoise.velocity((self._critic_model(critic),), x_sigma, sigma, cond, self.fake)
        return jnp.mean((v - (noise - video)) ** 2)

    # ------------------------------------------------------------------ the step
    def step_fn(self, state: SelfForcingState, batch: Mapping[str, Any], key: jax.Array):
        """The pure, unjitted step: a student update on its own rollout, then ``critic_steps`` critic updates."""
        ids, keys = self._rows(batch, key)
        grad_fn = jax.value_and_grad(self.student_loss, has_aux=True)
        (loss, (video, metrics)), grads = grad_fn(state.params, state, ids, keys, jax.random.fold_in(key, LOSS_KEY))
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        apply = finite & (state.step >= self.config.warmup_steps)  # warm-up: the critic alone learns
        new = state._replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state)
        state = guarded_update(apply, new, state)._replace(step=state.step + 1)
        video = jax.lax.stop_gradient(video)
        critic_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
            jax.random.fold_in(key, CRITIC_KEY), jnp.arange(self.config.critic_steps))
        fake_score_loss = lambda critic, k: self.critic_loss(critic, state, video, ids, k)
        critic, critic_opt, c_loss, c_norm, c_skip = guarded_steps(
            fake_score_loss, self.critic_tx, state.critic, state.critic_opt_state, critic_keys)
        state = state._replace(critic=critic, critic_opt_state=critic_opt)
        return state, {**metrics, "grad_norm": grad_norm, "skipped": 1.0 - finite.astype(jnp.float32),
                       "student_updated": apply.astype(jnp.float32),
                       "critic_loss": jnp.mean(c_loss), "critic_grad_norm": jnp.mean(c_norm),
                       "critic_skipped": jnp.sum(c_skip), "video_abs": jnp.mean(jnp.abs(video))}

    def step(self, state: SelfForcingState, batch: Mapping[str, Any], key: jax.Array):
        """One jitted student update and ``critic_steps`` critic updates: ``(state, metrics)``."""
        check_batch(batch)
        return self._step(state, batch, key)
