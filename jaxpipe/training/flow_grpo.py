"""``FlowGRPO``: group-relative policy optimisation of a text-to-image card's denoiser (DESIGN §6, §10).

One ``step``: each of P prompts is rendered K times by the card's own program under SDE
sampling with capture on (the rollout, ``training.rollout``); the images are scored by a reward
function; group advantages ``A = clip((r - mean_group) / (std_group + 1e-4), ±adv_clip)`` weight
a clipped PPO loss on every captured step's log-prob, plus ``β ·`` a KL to a frozen reference
denoiser. Gradients flow through the denoiser(s) the program's denoise loop binds; the rest of
the card stays frozen. A loop binding several experts routed by noise level (``wan22-moe``)
trains only the experts the SDE window routes to (``FlowGRPO.trained_experts``, read off the static
schedule, window and router by ``rollout.window_experts``): a window wholly above the boundary
trains the high-noise expert alone and leaves the low-noise one frozen (out of the optimiser state
and the reference, bit-identical after a step), so a publish moves only the trained expert's version.

``rollout`` and ``update`` are separate jitted functions so the C2 identity (recomputed log-probs
== captured, ratio == 1) can be checked between them; ``step`` is both fused into one jitted
function. A rollout may feed several updates (``minibatches`` ×
``inner_epochs``, each on a ``timestep_fraction`` of the captured steps: ``training.ppo``); the
default, 1 × 1 on every step, is one update at the rollout weights.

KL convention (``FlowGRPOConfig.kl``): ``"exact"`` (default) is the exact Gaussian KL of the SDE
step, ``mean((μθ − μref)²) / (2σ_eff²)``; ``"flowgrpo"`` is the official FlowGRPO code's
``mean((μθ − μref)²) / (2·std_dev_t²)`` with ``std_dev_t = σ_eff / sqrt(|Δt|)``, i.e. exact · |Δt|.
A β ported from an official config therefore pulls ``1/|Δt|`` times harder under ``"exact"``
(10× at 10 uniform steps); divide it by that, or set ``kl="flowgrpo"``.

Precision (``FlowGRPOConfig.dtype``, ``jaxpipe.precision``): ``"bfloat16"`` runs the card's networks
in bfloat16 (``precision.with_dtype``) while the sampler, log-probs, losses and advantages stay
float32, as FlowGRPO does (bf16 transformer, fp32 scheduler). The trainable params are float32
master weights (Adam moments in float32 too); each forward casts them to bfloat16 and the gradient
flows back through the cast. ``None`` keeps the card's own compute dtype (a card already given
``with_dtype`` trains the same way). The rollout and the log-prob recompute run the same bfloat16
network, so C2 (ratio == 1) still holds.

``generator_update`` is the module-level pure update of the generator that ``UnifiedRL`` and
``JointMultiExpertRL`` share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.loops import denoise
from jaxpipe.precision import check_dtype, with_dtype
from jaxpipe.program import settings as loop_settings
from jaxpipe.training import losses, ppo, rollout
from jaxpipe.training.finetune import guarded_update, split_trainable

__all__ = [
    "FlowGRPOConfig",
    "FlowGRPOState",
    "Rollout",
    "FlowGRPO",
    "KL_CONVENTIONS",
    "generator_loss",
    "generator_update",
    "generator_minibatch_update",
    "master_weights",
]

KL_CONVENTIONS = ("exact", "flowgrpo")

UPDATE_KEY = 1_000_003
"""``fold_in(step key, UPDATE_KEY)`` orders a step's minibatches (the rollout uses the step key itself)."""

RewardFn = rollout.RewardFn


@dataclasses.dataclass(frozen=True)
class FlowGRPOConfig:
    """Settings of a FlowGRPO run (hashable: it is static under ``jit``). ``dtype``: the networks'
    compute dtype (``"float32"`` | ``"bfloat16"``; ``None``: the card's own); the trainable params and
    Adam stay float32 either way."""

    group_size: int = 4
    num_steps: int = 8
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None
    clip_eps: float = 1e-3
    adv_clip: float = 5.0
    beta: float = 0.004
    learning_rate: float = 1e-4
    grad_clip: float = 1.0
    kl: str = "exact"
    minibatches: int = 1
    inner_epochs: int = 1
    timestep_fraction: float = 1.0
    dtype: str | None = None

    def __post_init__(self):
        self.schedule  # validates minibatches, inner_epochs and timestep_fraction
        if self.dtype is not None:
            check_dtype(self.dtype, "dtype")
        if self.kl not in KL_CONVENTIONS:
            raise ValueError(f"kl must be one of {KL_CONVENTIONS} (got {self.kl!r})")
        if self.group_size < 2:
            raise ValueError(f"group_size (K) must be >= 2 for group-relative advantages (got {self.group_size})")
        if not self.clip_eps > 0 or not self.adv_clip > 0:
            raise ValueError("clip_eps and adv_clip must be > 0")
        if self.beta < 0 or not self.learning_rate > 0:
            raise ValueError("beta must be >= 0 and learning_rate > 0")
        self.sampling  # validates num_steps, noise_level and sde_window

    @property
    def schedule(self) -> ppo.Schedule:
        """How many updates each rollout feeds (``minibatches`` × ``inner_epochs``, on a
        ``timestep_fraction`` of the captured steps): ``training.ppo``."""
        return ppo.Schedule(self.minibatches, self.inner_epochs, self.timestep_fraction)

    @property
    def sampling(self) -> denoise.DenoiseConfig:
        """The rollout's denoise policy on a default loop (see ``sampling_on``)."""
        return self.sampling_on(denoise.DenoiseConfig())

    def sampling_on(self, loop: denoise.DenoiseConfig) -> denoise.DenoiseConfig:
        """The rollout's denoise policy on a card's loop config: its schedule shift and router, this
        run's steps, SDE (in the window) and guidance 1 (so the log-prob recompute is faithful)."""
        return loop.replace(
            num_steps=self.num_steps, sampler="sde", noise_level=self.noise_level, sde_window=self.sde_window, guidance=1.0
        )


class FlowGRPOState(NamedTuple):
    """Trainable params (the trained experts), the frozen rest of the card, the frozen reference copy of the
    trained experts, optimiser state, step."""

    params: nnx.State
    frozen: nnx.State
    reference: nnx.State
    opt_state: Any
    step: jax.Array


class Rollout(NamedTuple):
    """One group rollout (B = P·K rows, row ``p·K + k`` is sample k of prompt p): the rendered
    batch with its captured SDE steps, rewards ``(B,)`` and group advantages ``(B,)``."""

    generated: rollout.Generated
    rewards: jax.Array
    advantages: jax.Array


def generator_loss(
    models,
    reference,
    generated: rollout.Generated,
    advantages: jax.Array,
    config: FlowGRPOConfig,
    sampling: denoise.DenoiseConfig | None = None,
) -> tuple[jax.Array, dict]:
    """Clipped PPO on every captured SDE step of ``generated`` under ``models`` (the loop's bound
    denoiser(s)) plus ``β ·`` the KL (``config.kl`` convention) to ``reference``: ``(scalar, metrics)``.
    ``sampling``: the rollout's policy (default ``config.sampling``). Differentiable in ``models``;
    ``advantages`` ``(B,)``."""
    sampling = config.sampling if sampling is None else sampling
    log_prob, mean = rollout.generator_stats(models, generated, sampling)
    if config.beta > 0:
        _, mean_ref = rollout.generator_stats(reference, generated, sampling)
        mean_ref = jax.lax.stop_gradient(mean_ref)
    else:
        mean_ref = jax.lax.stop_gradient(mean)
    traj = generated.trajectory
    return losses.flow_grpo_loss(
        log_prob, traj.log_prob, advantages, mean, mean_ref, traj.std, clip_eps=config.clip_eps, beta=config.beta,
        kl=config.kl, dt=traj.sigma_next - traj.sigma,
    )


def generator_update(
    tx: optax.GradientTransformation,
    models_of: Callable[[nnx.State], tuple],
    params: nnx.State,
    reference: nnx.State,
    opt_state: Any,
    generated: rollout.Generated,
    advantages: jax.Array,
    config: FlowGRPOConfig,
    sampling: denoise.DenoiseConfig,
) -> tuple[nnx.State, Any, jax.Array, dict, jax.Array]:
    """One optimiser step of the generator on a captured rollout: ``(params, opt_state, loss, metrics,
    grad norm)``. ``models_of(params)`` builds the denoiser(s) the loop binds from trainable params;
    ``sampling`` is the rollout's policy. Pure; the FlowGRPO objective (``generator_loss``)."""

    def loss(p):
        return generator_loss(models_of(p), models_of(reference), generated, advantages, config, sampling)

    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value, metrics, optax.tree.norm(grads)


def master_weights(params: nnx.State) -> nnx.State:
    """``params`` with every floating leaf in float32: what an optimiser updates whatever the compute
    dtype (a bfloat16-stored card trains float32 copies; each forward casts them back down)."""
    return jax.tree.map(lambda a: a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a, params)


def check_batch(batch: Mapping[str, Any], terms: tuple[str, ...] | None = None) -> None:
    """A clear error for a malformed RL batch ``{"ids": (P, L) int, "labels": {term: (P,) int}}``."""
    if not isinstance(batch, Mapping) or "ids" not in batch:
        raise ValueError('an RL batch is {"ids": (P, L) int32, "labels": {term: (P,) int32}}')
    ids = batch["ids"]
    if getattr(ids, "ndim", None) != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"batch['ids'] must be a (P, L) integer array (got {getattr(ids, 'dtype', type(ids))}{getattr(ids, 'shape', '')})")
    labels = batch.get("labels", {})
    for name, value in labels.items():
        if jnp.shape(value) != (ids.shape[0],):
            raise ValueError(f"batch['labels'][{name!r}] must have shape ({ids.shape[0]},) (got {jnp.shape(value)})")
    missing = [t for t in (terms or ()) if t not in labels]
    if missing:
        raise ValueError(f"the batch has no labels for reward term(s) {missing} (labels: {sorted(labels)})")


def generator_minibatch_update(
    tx: optax.GradientTransformation,
    models_of: Callable[[nnx.State], tuple],
    params: nnx.State,
    reference: nnx.State,
    opt_state: Any,
    generated: rollout.Generated,
    advantages: jax.Array,
    rows: jax.Array | None,
    key: jax.Array | None,
    config: FlowGRPOConfig,
    sampling: denoise.DenoiseConfig,
) -> tuple[nnx.State, Any, jax.Array, dict, jax.Array]:
    """``generator_update`` on one minibatch of a rollout: its ``rows`` (``None``: all, in order) and,
    when ``config.timestep_fraction < 1``, a random subset of each row's captured steps (``key``)."""
    if rows is not None:
        generated, advantages = rollout.take_rows(generated, rows), advantages[rows]
    schedule = config.schedule
    if schedule.timestep_fraction < 1.0:
        kept = schedule.steps_kept(generated.trajectory.log_prob.shape[0])
        generated = generated._replace(trajectory=ppo.subsample_steps(generated.trajectory, key, kept))
    return generator_update(tx, models_of, params, reference, opt_state, generated, advantages, config, sampling)


class FlowGRPO:
    """FlowGRPO on a text-to-image card: ``init(key)``, jitted ``rollout``/``update`` and ``step``.

    A batch is ``{"ids": (P, L) int32, "labels": {term: (P,) int32}}``; each prompt is sampled
    ``group_size`` times. ``reward_fn`` scores images, e.g. the digits world's ``jaxpipe.digits.rewards.scorer_reward(scorer_card)``. The card
    renders through its family's program (or ``program``), which must run one denoise loop; of its
    bound denoisers (``denoisers``) those some SDE-window step routes to train (``trained_experts``).
    """

    def __init__(self, card: Card, reward_fn: RewardFn, config: FlowGRPOConfig = FlowGRPOConfig(), *, program=None):
        if config.dtype is not None:
            card = with_dtype(card, config.dtype)
        self.config = config
        self.spec = card.spec
        self.reward_fn = reward_fn
        self.program = registry.default_program(card) if program is None else program
        self.program.check(card)
        self.loop = rollout.denoise_loop(card, self.program)
        self.artifact = rollout.rendered_artifact(self.program)  # what reward_fn scores: "image" or "video"
        self.denoisers = self.loop.binds
        self.sampling = config.sampling_on(self.loop.config)
        self._trained = rollout.window_experts(self.loop, self.sampling)
        self._graphdef, params, self._frozen, self._rest = split_trainable(card, self._trained)
        self._params = master_weights(params)
        self.tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
        self.rollout = jax.jit(self._rollout)
        self.update = jax.jit(self._update)
        self._step = jax.jit(self.step_fn)

    @property
    def trained_experts(self) -> tuple[str, ...]:
        """The bound denoisers this method trains: those some step of the SDE window routes to (all of
        ``denoisers`` for a one-expert loop). The others are frozen: not in ``params``, the reference
        or the optimiser state."""
        return self._trained

    @property
    def transformer(self) -> str:
        """The (first) denoiser component that trains."""
        return self._trained[0]

    def init(self, key: jax.Array | None = None) -> FlowGRPOState:
        """Start from the card's weights; the reference is a frozen copy of the trained denoiser(s)."""
        del key
        params, frozen = jax.tree.map(jnp.array, (self._params, self._frozen))
        reference = jax.tree.map(jnp.array, self._params)
        return FlowGRPOState(params, frozen, reference, self.tx.init(params), jnp.zeros((), jnp.int32))

    def components(self, params: nnx.State, frozen: nnx.State) -> dict:
        return nnx.merge(self._graphdef, nnx.State({**params, **frozen}), self._rest)

    def card(self, state: FlowGRPOState) -> Card:
        """The card with the state's denoiser weights."""
        return Card(self.components(state.params, state.frozen), self.spec)

    def _models_of(self, frozen: nnx.State) -> Callable[[nnx.State], tuple]:
        return lambda params: tuple(self.components(params, frozen)[name] for name in self.denoisers)

    def _rollout(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> Rollout:
        cfg = self.config
        card = Card(self.components(jax.lax.stop_gradient(state.params), state.frozen), self.spec)
        ids, labels = rollout.repeat_groups(batch, cfg.group_size)
        keys = jax.random.split(key, ids.shape[0])
        settings = loop_settings(**{self.loop.id: self.sampling})
        run = rollout.run(card, self.program, settings, rollout.text_slots(self.program, ids, keys), capture=(self.loop.id,))
        generated = rollout.generated(run, self.loop.id, self.artifact)
        rewards, advantages = rollout.score(self.reward_fn, generated.images, labels, cfg.group_size, cfg.adv_clip)
        return Rollout(generated, rewards, advantages)

    def step_stats(self, params: nnx.State, frozen: nnx.State, ro: Rollout) -> tuple[jax.Array, jax.Array]:
        """Per captured step ``(S, B)`` log-probs and ``(S, B, ...)`` SDE means of the rollout's samples
        under ``params`` (teacher-forced, the trainer's own batching: ``rollout.generator_stats``)."""
        return rollout.generator_stats(self._models_of(frozen)(params), ro.generated, self.sampling)

    def _update(self, state: FlowGRPOState, ro: Rollout, key: jax.Array | None = None) -> tuple[FlowGRPOState, dict]:
        """Every update the rollout feeds (``config.schedule``; ``key`` orders the minibatches), then the
        all-or-nothing finite guard: ``(state, metrics)``."""
        schedule = self.config.schedule
        models_of = self._models_of(state.frozen)

        def one(carry, rows, k):
            params, opt_state = carry
            params, opt_state, loss, metrics, grad_norm = generator_minibatch_update(
                self.tx, models_of, params, state.reference, opt_state, ro.generated, ro.advantages, rows, k,
                self.config, self.sampling,
            )
            return (params, opt_state), {**metrics, "grad_norm": grad_norm}, jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        (params, opt_state), metrics, finite = ppo.run(
            one, (state.params, state.opt_state), key, ro.advantages.shape[0], schedule
        )
        new = state._replace(params=params, opt_state=opt_state, step=state.step + 1)
        new = guarded_update(finite, new, state._replace(step=state.step + 1))
        return new, {**metrics, "skipped": 1.0 - finite.astype(jnp.float32)}

    def step_fn(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> tuple[FlowGRPOState, dict]:
        """The pure, unjitted step (rollout + update), for custom ``jit``/sharding."""
        ro = self._rollout(state, batch, key)
        state, metrics = self._update(state, ro, jax.random.fold_in(key, UPDATE_KEY))
        return state, {**metrics, "reward_mean": jnp.mean(ro.rewards), "reward_std": jnp.std(ro.rewards)}

    def step(self, state: FlowGRPOState, batch: Mapping[str, Any], key: jax.Array) -> tuple[FlowGRPOState, dict]:
        """Rollout then its updates as ONE jitted function: ``(state, metrics)`` with the rollout's reward
        statistics. A non-finite loss or gradient leaves the weights unchanged (``metrics["skipped"] == 1``)."""
        check_batch(batch)
        self.config.schedule.check_rows(batch["ids"].shape[0] * self.config.group_size)
        return self._step(state, batch, key)
