"""``SharedMoTRL``: joint RL where the thinker and the generator are the SAME parameters.

On a MoT card (``toy_mot``, e.g. ``bagel-mot``) one ``transformer`` thinks (the ``generate_text``
AR loop) and generates (the ``generate_image`` denoise loop). Per prompt a group of K samples: the
first K − skip think first, the last ``skip`` render the prompt as written (``training.refine``);
one reward and one group advantage drive ONE update of ONE parameter set with ONE optimiser state:

    loss(θ) = token_weight · [token PG (PPO-clipped) + β_lm · k3 KL](θ)  +  [FlowGRPO + β · KL](θ)

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
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxpipe import validate
from jaxpipe._exports import deprecated
from jaxpipe.card import Card
from jaxpipe.cards import registry, toy_mot
from jaxpipe.loops import ar
from jaxpipe.nn.mot import TEXT, MoT, MoTCond
from jaxpipe.prompts import Prompts
from jaxpipe.rewards import Reward
from jaxpipe.training import ppo, rollout, update
from jaxpipe.training.grpo import generator_loss
from jaxpipe.training.methods.flow_grpo import FlowGRPOConfig
from jaxpipe.training.parts import Parts
from jaxpipe.training.refine import (
    RefinerConfig,
    check_room,
    prefixed,
    render_rewrites,
    restrict,
    reward_stats,
    token_objective,
)
from jaxpipe.training.trainer import RolloutMethod, TrainState

if TYPE_CHECKING:  # the command line's flag groups, for the builders below (no import at run time)
    from jaxpipe.training.methods.flags import MoTFlags, PolicyFlags, RunSettings

__all__ = [
    "config_from_flags",
    "ROLES",
    "SharedMoTRLConfig",
    "MoTRollout",
    "SharedMoTRL",
    "gradient_roles",
    "role_cosines",
    "text_cond",
    "MODEL",
]

ROLES = ("shared", "understanding", "generation", "io")
"""The parameter roles the gradient cosines are reported on (``gradient_roles``)."""
MODEL = "model"
"""The one trained part (key of ``TrainState.params``): the MoT transformer."""


@dataclasses.dataclass(frozen=True)
class SharedMoTRLConfig:
    """Settings of a shared-weights run (hashable: static under ``jit``).

    Attributes:
      generator: the image part's FlowGRPO settings: the group, its SDE rollout, PPO clip and KL,
        updates per rollout, and the ONE optimiser of the shared parameters.
      thinking: ``skip`` (samples per group rendered without thinking) and the thoughts' token
        objective (clip, k3-KL weight).
      token_weight: the thinking part's weight in the summed loss, >= 0.

    Raises:
      ValueError: on construction, if ``thinking.skip`` leaves no thinking sample in a group,
        ``token_weight`` is negative, or ``generator.lora`` is set (the shared weights train whole).
    """

    generator: FlowGRPOConfig = FlowGRPOConfig(beta=0.04)
    thinking: RefinerConfig = RefinerConfig()
    token_weight: float = 1.0

    def __post_init__(self):
        self.thinking.check_group(self.generator.group.size)
        validate.rule(self.token_weight >= 0, f"token_weight must be >= 0 (got {self.token_weight})")
        validate.rule(
            self.generator.lora is None,
            "SharedMoTRL trains its shared MoT weights whole: generator.lora is not supported",
        )


__getattr__ = deprecated(__name__, {"MoTRLConfig": (__name__, "SharedMoTRLConfig")})


class MoTRollout(NamedTuple):
    """One rollout (B = P·K rows).

    Attributes:
      thought: the captured thoughts (``ar.Continuation``, mask restricted to thinking rows).
      think: ``(B,)`` bool, the rows that thought first.
      text: ``(B, max_text)`` the text each image was conditioned on (prompt + thought, or the prompt).
      text_length: ``(B,)`` its length.
      generated: the rendered batch with its captured trajectory.
      rewards: ``(B,)`` rewards.
      parts: ``{name: (B,)}`` their parts.
      advantages: ``(B,)`` group advantages.
    """

    thought: ar.Continuation
    think: jax.Array
    text: jax.Array
    text_length: jax.Array
    generated: rollout.Generated
    rewards: jax.Array
    parts: dict[str, jax.Array]
    advantages: jax.Array


def text_cond(mot: MoT, text: jax.Array, length: jax.Array) -> MoTCond:
    """The denoiser's conditioning recomputed under ``mot``: the K/V of the first ``length`` tokens of ``text``.

    Args:
      mot: the MoT transformer.
      text: ``(B, T)`` text ids.
      length: ``(B,)`` how many tokens of each row to read.

    Returns:
      The ``MoTCond`` the image loop conditions on.
    """
    width = text.shape[1]
    _, cache = mot.prefill(text, jnp.maximum(length, 1), mot.init_cache(text.shape[0]))
    return mot.text_cond(cache, jnp.minimum(length, width))


def gradient_roles(cfg) -> Any:
    """A function ``path -> role`` over the MoT's parameter paths.

    Outside the layers a parameter is ``"io"``; in a layer's attention or FFN group it is ``"shared"``
    where the config does not route that group by modality, otherwise ``"understanding"`` (the text
    expert) or ``"generation"``.

    Args:
      cfg: the MoT's ``MoTConfig`` (its ``routing``).

    Returns:
      ``role(path) -> str``, one of ``ROLES``.
    """

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
    """The cosine between gradient pytrees ``a`` and ``b``, over all leaves and over each role's leaves.

    Args:
      a: the token part's gradient.
      b: the generator part's gradient (same structure).
      role_of: ``path -> role`` (``gradient_roles``).

    Returns:
      ``cos_all`` and ``cos_<role>`` (0 for a role with no parameters or a zero gradient), plus
      ``token_grad_norm_<role>`` and ``gen_grad_norm_<role>``, each part's norm per role; scalars.
    """
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


class SharedMoTRL(RolloutMethod):
    """Joint RL on a MoT card's one transformer: ``init(key)``, jitted ``rollout`` / ``update``, ``step``.

    A batch is a ``jaxpipe.prompts.Prompts`` of prompts of at most ``card.spec.config.max_prompt_words``
    words; ``reward(artifacts, prompts)`` scores the rendered rows.

    Args:
      card: a MoT card (family ``toy_mot``, e.g. ``bagel-mot``).
      reward: the reward.
      config: the settings.

    Raises:
      ValueError: if the card is not a MoT card.
    """

    def __init__(self, card: Card, reward: Reward, config: SharedMoTRLConfig = SharedMoTRLConfig()):
        if card.spec.family != toy_mot.FAMILY.name:
            raise ValueError(
                f"SharedMoTRL trains a MoT card (family {toy_mot.FAMILY.name!r}); {card.model_id!r} is "
                f"{card.spec.family!r}"
            )
        self.config, self.spec, self.reward = config, card.spec, reward
        self.program = registry.family_of(card).program("think_t2i")
        self.max_prompt_words = card.spec.config.max_prompt_words
        self.ar_config = card.spec.loop(toy_mot.THINK_LOOP).config.replace(temperature=1.0)
        self.sampling = config.generator.sampling.on(card.spec.loop(toy_mot.IMAGE_LOOP).config)
        if self.sampling.guidance != 1.0:
            # the update recomputes the text conditioning under each weight set; an unconditional branch
            # would keep the rollout's, so its CFG policy would not be the trained one
            raise ValueError(
                f"SharedMoTRL samples its image loop at guidance 1 (got {self.sampling.guidance}): the shared "
                "transformer's conditioning is recomputed under the trained weights, its unconditional branch is not"
            )
        self.parts = Parts(card, {MODEL: ("transformer",)})
        self.tx = config.generator.optimizer.make()
        self.optimizers = {MODEL: self.tx}
        self._role = gradient_roles(card["transformer"].cfg)
        self._jit(card, reward, config)

    def copies(self, params: dict[str, Any]) -> dict[str, Any]:
        """The frozen reference of both KL terms: a copy of the transformer."""
        return {"reference": params[MODEL]}

    def check_batch(self, batch: Prompts) -> None:
        super().check_batch(batch)
        check_room(batch, self.max_prompt_words)
        self.config.generator.ppo.check_rows(len(batch) * self.config.generator.group.size)

    def _mot(self, params, frozen) -> MoT:
        return self.components({MODEL: params}, frozen)["transformer"]

    def _rollout(self, state: TrainState, batch: Prompts, key: jax.Array, reward_weights: Any = None) -> MoTRollout:
        cfg = self.config
        group = cfg.generator.group
        run, think = render_rewrites(
            self.rollout_card(state.params, state.frozen),
            self.program,
            batch,
            key,
            group=group,
            skip=cfg.thinking.skip,
            loops={toy_mot.THINK_LOOP: self.ar_config, toy_mot.IMAGE_LOOP: self.sampling},
            capture=(toy_mot.THINK_LOOP, toy_mot.IMAGE_LOOP),
        )
        thought = restrict(rollout.refinement(run.execution, toy_mot.THINK_LOOP), think)
        prompt_length = jnp.sum(run.prompts.ids != 0, axis=1).astype(jnp.int32)
        text_length = jnp.where(think, thought.length, prompt_length)
        generated = rollout.generated(run.execution, toy_mot.IMAGE_LOOP)
        scored = rollout.score_rollout(
            self.reward_at(reward_weights), rollout.artifacts_of(run.execution, self.program), run.prompts, group
        )
        return MoTRollout(
            thought, think, thought.tokens, text_length, generated, scored.rewards, scored.parts, scored.advantages
        )

    def token_part(self, params, reference, frozen, ro: MoTRollout) -> tuple[jax.Array, dict]:
        """Token policy gradient of the thoughts (PPO-clipped against the captured log-probs) + β_lm · k3 KL."""
        return token_objective(
            self._mot(params, frozen), self._mot(reference, frozen), ro.thought, ro.advantages, self.config.thinking
        )

    def generator_part(self, params, reference, frozen, ro: MoTRollout) -> tuple[jax.Array, dict]:
        """FlowGRPO on the captured steps, conditioned on the text K/V recomputed under ``params`` (and the
        reference's own K/V for its KL term)."""
        mot, ref_mot = self._mot(params, frozen), self._mot(reference, frozen)
        now = ro.generated._replace(cond=text_cond(mot, ro.text, ro.text_length))
        ref = (
            ro.generated._replace(cond=text_cond(ref_mot, ro.text, ro.text_length))
            if self.config.generator.beta > 0
            else None
        )
        return generator_loss(
            (mot,), (ref_mot,), now, ro.advantages, self.config.generator, self.sampling, reference_generated=ref
        )

    def loss(self, params, reference, frozen, ro: MoTRollout) -> jax.Array:
        """The summed objective (what the update's gradient is the gradient of)."""
        token, _ = self.token_part(params, reference, frozen, ro)
        generator, _ = self.generator_part(params, reference, frozen, ro)
        return self.config.token_weight * token + generator

    def _minibatch(self, ro: MoTRollout, rows, key) -> MoTRollout:
        if rows is not None:
            ro = ro._replace(
                thought=jax.tree.map(lambda a: a[rows], ro.thought),
                think=ro.think[rows],
                text=ro.text[rows],
                text_length=ro.text_length[rows],
                generated=rollout.take_rows(ro.generated, rows),
                rewards=ro.rewards[rows],
                parts={k: v[rows] for k, v in ro.parts.items()},
                advantages=ro.advantages[rows],
            )
        return ro._replace(generated=ppo.subsample(ro.generated, key, self.config.generator.ppo))

    def gradients(self, params, reference, frozen, ro: MoTRollout):
        """``(token part, its metrics, its gradient), (generator part, its metrics, its gradient)``."""
        token = jax.value_and_grad(self.token_part, has_aux=True)(params, reference, frozen, ro)
        generator = jax.value_and_grad(self.generator_part, has_aux=True)(params, reference, frozen, ro)
        return token, generator

    def _update(self, state: TrainState, ro: MoTRollout, key: jax.Array | None = None) -> tuple[TrainState, dict]:
        """Every update the rollout feeds (``generator.ppo``): the two parts' gradients summed into one
        optimiser step each, guarded."""
        weight = self.config.token_weight
        reference = state.copies["reference"]

        def one(carry, rows, k):
            params, opt_state = carry
            part = self._minibatch(ro, rows, k)
            ((token, token_metrics), g_token), ((gen, gen_metrics), g_gen) = self.gradients(
                params, reference, state.frozen, part
            )
            grads = jax.tree.map(lambda a, b: weight * a + b, g_token, g_gen)
            updates, new_opt = self.tx.update(grads, opt_state, params)
            grad_norm = optax.tree.norm(grads)
            finite = jnp.isfinite(token) & jnp.isfinite(gen) & jnp.isfinite(grad_norm)
            metrics = {
                **prefixed("lm_", token_metrics),
                **prefixed("gen_", gen_metrics),
                "grad_norm": grad_norm,
                **role_cosines(g_token, g_gen, self._role),
            }
            carry = update.guard(finite, (optax.apply_updates(params, updates), new_opt), (params, opt_state))
            return carry, metrics, finite

        (params, opt_state), metrics, finite = ppo.run(
            one, (state.params[MODEL], state.opt_state[MODEL]), key, ro.advantages.shape[0], self.config.generator.ppo
        )
        new = state._replace(params={MODEL: params}, opt_state={MODEL: opt_state}, step=state.step + 1)
        return new, {**metrics, "skipped": update.skipped(finite)}

    def rollout_metrics(self, ro: MoTRollout) -> dict[str, jax.Array]:
        stats = reward_stats(ro.rewards, ro.think, jnp.sum(ro.thought.mask, axis=-1))
        return {**stats, **{f"reward_{term}": jnp.mean(part) for term, part in ro.parts.items()}}


def config_from_flags(run: RunSettings, policy: PolicyFlags, own: MoTFlags) -> SharedMoTRLConfig:
    """``jaxpipe train mot``'s config from its flags.

    Args:
      run: the run's settings.
      policy: the image part's policy-gradient flags.
      own: the thinking part's skip, weight and KL.

    Returns:
      The ``SharedMoTRLConfig``.
    """
    return SharedMoTRLConfig(
        generator=policy.generator(run),
        thinking=RefinerConfig(skip=own.skip, beta=own.lm_beta),
        token_weight=own.token_weight,
    )
