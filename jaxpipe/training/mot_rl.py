"""``SharedMoTRL``: joint RL where the thinker and the generator are the SAME parameters (DESIGN §10).

On a MoT card (``bagel-mot``) one ``transformer`` thinks (the ``generate_text`` AR loop) and
generates (the ``generate_image`` denoise loop). Per prompt a group of K samples: the first
K − skip think first, the last ``skip`` render the prompt as written; one reward and one group
advantage drive ONE update of ONE parameter set with ONE optimiser state:

    loss(θ) = token_weight · [token PG (PPO-clipped) + lm_beta · k3 KL](θ)  +  [FlowGRPO + β · KL](θ)

The FlowGRPO part conditions on the text K/V **recomputed under θ** from the rendered text
(prompt + thought), so the image reward reaches the parameters that read the text too (the
understanding expert under modality routing), not only the image tokens' path; at the rollout
weights the recomputed K/V equal the cached ones the loop used (KV reuse == recompute), so C2
holds on both loops. Each part's gradient is taken on its own and the update applies their sum;
the metrics report, per step, the cosine between the two parts' gradients on every parameter role
(``shared`` groups, the ``understanding`` and ``generation`` experts, the modality ``io``
layers): how much the two objectives interfere, and whether routing separates them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import toy_mot, registry
from jaxpipe.loops import ar
from jaxpipe.nn.mot import TEXT, MoT, MoTCond
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import losses, ppo, rollout
from jaxpipe.training.finetune import guarded_update, split_trainable
from jaxpipe.training.flow_grpo import UPDATE_KEY, FlowGRPOConfig, RewardFn
from jaxpipe.training.unified_rl import check_refine_batch, prefixed, refine_rows, restrict, reward_stats

__all__ = ["ROLES", "MoTRLConfig", "MoTRLState", "MoTRollout", "SharedMoTRL", "gradient_roles", "role_cosines"]

ROLES = ("shared", "understanding", "generation", "io")


@dataclasses.dataclass(frozen=True)
class MoTRLConfig:
    """Settings of a shared-weights run (hashable: static under ``jit``).

    ``group_size`` K and ``skip`` (samples per group rendered without thinking); generator settings
    as in ``FlowGRPOConfig``; ``learning_rate`` of the one optimiser; ``token_weight`` scales the
    thinking part; ``lm_beta`` / ``lm_clip_eps`` its k3 KL and per-token clip; ``minibatches``,
    ``inner_epochs``, ``timestep_fraction``: several updates per rollout (``training.ppo``).
    """

    group_size: int = 4
    skip: int = 1
    num_steps: int = 8
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    clip_eps: float = 1e-3
    adv_clip: float = 5.0
    beta: float = 0.04
    learning_rate: float = 1e-4
    token_weight: float = 1.0
    lm_beta: float = 0.01
    lm_clip_eps: float = 0.2
    grad_clip: float = 1.0
    kl: str = "exact"
    minibatches: int = 1
    inner_epochs: int = 1
    timestep_fraction: float = 1.0

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"group_size (K) must be >= 2 for group-relative advantages (got {self.group_size})")
        if not 0 <= self.skip < self.group_size:
            raise ValueError(f"skip must be in 0..K-1 = 0..{self.group_size - 1}: at least one sample per group must think")
        if not self.token_weight >= 0 or self.lm_beta < 0 or not self.lm_clip_eps > 0:
            raise ValueError("token_weight and lm_beta must be >= 0 and lm_clip_eps > 0")
        self.generator  # validates the generator settings

    @property
    def generator(self) -> FlowGRPOConfig:
        return FlowGRPOConfig(
            group_size=self.group_size, num_steps=self.num_steps, noise_level=self.noise_level, sde_window=self.sde_window,
            clip_eps=self.clip_eps, adv_clip=self.adv_clip, beta=self.beta, learning_rate=self.learning_rate,
            grad_clip=self.grad_clip, kl=self.kl, minibatches=self.minibatches, inner_epochs=self.inner_epochs,
            timestep_fraction=self.timestep_fraction,
        )

    @property
    def schedule(self) -> ppo.Schedule:
        return self.generator.schedule


class MoTRLState(NamedTuple):
    """The one transformer's params, its frozen reference and optimiser state, the frozen rest, step."""

    params: nnx.State
    reference: nnx.State
    frozen: nnx.State
    opt_state: Any
    step: jax.Array


class MoTRollout(NamedTuple):
    """One rollout (B = P·K rows): the captured thoughts (mask restricted to thinking rows), ``think``
    ``(B,)``, the text each image was conditioned on (``text`` ``(B, max_text)`` and ``text_length``
    ``(B,)``: prompt + thought, or the prompt), the rendered batch, rewards, advantages."""

    thought: ar.Continuation
    think: jax.Array
    text: jax.Array
    text_length: jax.Array
    generated: rollout.Generated
    rewards: jax.Array
    advantages: jax.Array


def text_cond(mot: MoT, text: jax.Array, length: jax.Array) -> MoTCond:
    """The denoiser's conditioning recomputed under ``mot``: the K/V of ``text`` ``(B, T)`` (first ``length`` tokens)."""
    width = text.shape[1]
    _, cache = mot.prefill(text, jnp.maximum(length, 1), mot.init_cache(text.shape[0]))
    return mot.text_cond(cache, jnp.minimum(length, width))


def gradient_roles(cfg) -> Any:
    """A function ``path -> role`` over the MoT's parameter paths (``cfg``: its ``MoTConfig``)."""

    def role(path) -> str:
        keys = [getattr(p, "key", getattr(p, "idx", p)) for p in path]
        if "layers" not in keys:
            return "io"
        layer = keys[keys.index("layers") + 1]
        group = next(k for k in keys if k in ("attn", "ffn"))
        expert = keys[keys.index(group) + 1]
        routed = cfg.routing.routed(int(layer))[0 if group == "attn" else 1]
        if not routed:
            return "shared"
        return "understanding" if int(expert) == TEXT else "generation"

    return role


def role_cosines(a, b, role_of) -> dict[str, jax.Array]:
    """Cosine between gradient pytrees ``a`` and ``b`` over all leaves (``all``) and over each role's
    leaves (``role_of(path)``; 0 for a role with no parameters or a zero gradient), plus each part's norm per role."""
    leaves_a = jax.tree_util.tree_flatten_with_path(a)[0]
    leaves_b = jax.tree.leaves(b)
    sums = {r: [jnp.zeros(()), jnp.zeros(()), jnp.zeros(())] for r in ROLES + ("all",)}
    for (path, x), y in zip(leaves_a, leaves_b):
        for r in (role_of(path), "all"):
            sums[r][0] += jnp.vdot(x, y)
            sums[r][1] += jnp.vdot(x, x)
            sums[r][2] += jnp.vdot(y, y)
    out = {}
    for r, (dot, aa, bb) in sums.items():
        out[f"cos_{r}"] = dot / jnp.maximum(jnp.sqrt(aa * bb), 1e-30)
        if r != "all":
            out[f"token_grad_norm_{r}"] = jnp.sqrt(aa)
            out[f"gen_grad_norm_{r}"] = jnp.sqrt(bb)
    return out


class SharedMoTRL:
    """Joint RL on a MoT card's one transformer: ``init(key)``, jitted ``rollout``/``update``, ``step``.

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}``: prompts of at most
    ``card.spec.config.max_prompt_words`` words and the labels the reward scores.
    """

    def __init__(self, card: Card, reward_fn: RewardFn, config: MoTRLConfig = MoTRLConfig()):
        if card.spec.family != "toy_mot":
            raise ValueError(f"SharedMoTRL trains a MoT card (family 'toy_mot'); {card.model_id!r} is {card.spec.family!r}")
        self.config, self.spec, self.reward_fn = config, card.spec, reward_fn
        self.program = registry.family_of(card).program("think_t2i")
        self.max_prompt_words = card.spec.config.max_prompt_words
        self.ar_config = card.spec.loop(toy_mot.THINK_LOOP).config.replace(temperature=1.0)
        self.sampling = config.generator.sampling_on(card.spec.loop(toy_mot.IMAGE_LOOP).config)
        self._graphdef, params, frozen, self._rest = split_trainable(card, ("transformer",))
        self._params, self._frozen = params, frozen
        self._role = gradient_roles(card["transformer"].cfg)
        self.tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

    # ------------------------------------------------------------------------------------ state
    def init(self, key: jax.Array | None = None) -> MoTRLState:
        del key
        copy = lambda tree: jax.tree.map(jnp.array, tree)
        params = copy(self._params)
        return MoTRLState(params, copy(self._params), copy(self._frozen), self.tx.init(params), jnp.zeros((), jnp.int32))

    def components(self, params: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def card(self, state: MoTRLState) -> Card:
        return Card(self.components(state.params, state.frozen), self.spec)

    def _mot(self, params: nnx.State, frozen: nnx.State) -> MoT:
        return self.components(params, frozen)["transformer"]

    # ---------------------------------------------------------------------------------- rollout
    def _rollout(self, state: MoTRLState, batch: Mapping[str, Any], key: jax.Array) -> MoTRollout:
        cfg = self.config
        card = Card(self.components(jax.lax.stop_gradient(state.params), state.frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, cfg.group_size)
        rows = ids.shape[0]
        think = refine_rows(cfg.group_size, cfg.skip, rows)
        slots = {"ids": ids, "key": jax.random.split(key, rows), "think": think}
        settings = loop_settings(**{toy_mot.THINK_LOOP: self.ar_config, toy_mot.IMAGE_LOOP: self.sampling})
        run = rollout.run(card, self.program, settings, slots, capture=(toy_mot.THINK_LOOP, toy_mot.IMAGE_LOOP))
        thought = restrict(rollout.refinement(run, toy_mot.THINK_LOOP), think)
        prompt_length = jnp.sum(ids != 0, axis=1).astype(jnp.int32)
        text_length = jnp.where(think, thought.length, prompt_length)
        generated = rollout.generated(run, toy_mot.IMAGE_LOOP)
        rewards, advantages = rollout.score(self.reward_fn, generated.images, labels, cfg.group_size, cfg.adv_clip)
        return MoTRollout(thought, think, thought.tokens, text_length, generated, rewards, advantages)

    # ----------------------------------------------------------------------------------- losses
    def token_part(self, params, reference, frozen, ro: MoTRollout) -> tuple[jax.Array, dict]:
        """Token policy gradient of the thoughts (PPO-clipped against the captured log-probs) + ``lm_beta`` · k3 KL."""
        cfg = self.config
        log_probs = rollout.token_log_probs(self._mot(params, frozen), ro.thought)
        ref = rollout.token_log_probs(self._mot(reference, frozen), ro.thought) if cfg.lm_beta > 0 else None
        return losses.token_loss(log_probs, ro.thought.mask, ro.advantages, ref_log_probs=ref, beta=cfg.lm_beta,
                                 old_log_probs=ro.thought.log_prob, clip_eps=cfg.lm_clip_eps)

    def generator_part(self, params, reference, frozen, ro: MoTRollout) -> tuple[jax.Array, dict]:
        """FlowGRPO on the captured steps, conditioned on the text K/V recomputed under ``params`` (and the
        reference's own K/V for its KL term)."""
        cfg = self.config.generator
        mot = self._mot(params, frozen)
        now = ro.generated._replace(cond=text_cond(mot, ro.text, ro.text_length))
        log_prob, mean = rollout.generator_stats((mot,), now, self.sampling)
        if cfg.beta > 0:
            ref_mot = self._mot(reference, frozen)
            ref = ro.generated._replace(cond=text_cond(ref_mot, ro.text, ro.text_length))
            mean_ref = jax.lax.stop_gradient(rollout.generator_stats((ref_mot,), ref, self.sampling)[1])
        else:
            mean_ref = jax.lax.stop_gradient(mean)
        traj = ro.generated.trajectory
        return losses.flow_grpo_loss(log_prob, traj.log_prob, ro.advantages, mean, mean_ref, traj.std, clip_eps=cfg.clip_eps,
                                     beta=cfg.beta, kl=cfg.kl, dt=traj.sigma_next - traj.sigma)

    def loss(self, params, reference, frozen, ro: MoTRollout) -> jax.Array:
        """The summed objective (what the update's gradient is the gradient of)."""
        token, _ = self.token_part(params, reference, frozen, ro)
        generator, _ = self.generator_part(params, reference, frozen, ro)
        return self.config.token_weight * token + generator

    # ----------------------------------------------------------------------------------- update
    def _minibatch(self, ro: MoTRollout, rows, key) -> MoTRollout:
        if rows is not None:
            ro = ro._replace(thought=jax.tree.map(lambda a: a[rows], ro.thought), think=ro.think[rows], text=ro.text[rows],
                             text_length=ro.text_length[rows], generated=rollout.take_rows(ro.generated, rows),
                             rewards=ro.rewards[rows], advantages=ro.advantages[rows])
        schedule = self.config.schedule
        if schedule.timestep_fraction < 1.0:
            kept = schedule.steps_kept(ro.generated.trajectory.log_prob.shape[0])
            trajectory = ppo.subsample_steps(ro.generated.trajectory, key, kept)
            ro = ro._replace(generated=ro.generated._replace(trajectory=trajectory))
        return ro

    def gradients(self, params, reference, frozen, ro: MoTRollout):
        """``(token part, its metrics, its gradient), (generator part, its metrics, its gradient)``."""
        token = jax.value_and_grad(self.token_part, has_aux=True)(params, reference, frozen, ro)
        generator = jax.value_and_grad(self.generator_part, has_aux=True)(params, reference, frozen, ro)
        return token, generator

    def _update(self, state: MoTRLState, ro: MoTRollout, key: jax.Array | None = None) -> tuple[MoTRLState, dict]:
        """Every update the rollout feeds (``config.schedule``): the two parts' gradients summed into one
        optimiser step each; then the all-or-nothing finite guard."""
        weight = self.config.token_weight

        def one(carry, rows, k):
            params, opt_state = carry
            part = self._minibatch(ro, rows, k)
            ((token, token_metrics), g_token), ((gen, gen_metrics), g_gen) = self.gradients(params, state.reference,
                                                                                           state.frozen, part)
            grads = jax.tree.map(lambda a, b: weight * a + b, g_token, g_gen)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            grad_norm = optax.tree.norm(grads)
            finite = jnp.isfinite(token) & jnp.isfinite(gen) & jnp.isfinite(grad_norm)
            metrics = {**prefixed("lm_", token_metrics), **prefixed("gen_", gen_metrics), "grad_norm": grad_norm,
                       **role_cosines(g_token, g_gen, self._role)}
            return (optax.apply_updates(params, updates), opt_state), metrics, finite

        (params, opt_state), metrics, finite = ppo.run(one, (state.params, state.opt_state), key, ro.advantages.shape[0],
                                                       self.config.schedule)
        new = state._replace(params=params, opt_state=opt_state, step=state.step + 1)
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: MoTRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[MoTRLState, dict]:
        """The pure, unjitted step (rollout + its updates)."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))
        return state, {**metrics, **reward_stats(ro.rewards, ro.think, jnp.sum(ro.thought.mask, axis=-1))}

    def step(self, state: MoTRLState, batch: Mapping[str, Any], key: jax.Array) -> tuple[MoTRLState, dict]:
        """Rollout then its updates as ONE jitted function: ``(state, metrics)``. A non-finite loss or
        gradient leaves every weight unchanged (``metrics["skipped"] == 1``)."""
        self.check_batch(batch)
        return self._step(state, batch, key)

    def check_batch(self, batch: Mapping[str, Any]) -> None:
        check_refine_batch(batch, self.max_prompt_words)
        self.config.schedule.check_rows(batch["ids"].shape[0] * self.config.group_size)

