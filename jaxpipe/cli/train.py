"""``jaxpipe train <method>``: RL post-training and distillation, on a world (digits by default) or on your own card,
prompts and reward.

    jaxpipe train flow-grpo --steps N --out DIR                           # the digits world's flux-t2i, digit-scorer reward
    jaxpipe train nft --world shapes --steps 150 --out DIR                # shapes-t2i, GenEval reward, preset geneval
    jaxpipe train flow-grpo --steps N --out DIR --model FLUX_DIR \\
        --prompts prompts.txt --reward my_rewards:brightness [--reward-weight 1.0]    # your card, prompts and reward

Every command writes ``DIR/metrics.jsonl`` (one JSON object per step), ``DIR/*.png`` (curves),
``DIR/report.json`` and the trained card (``jp.cards.load(DIR)``). Without ``--prompts`` / ``--reward`` the run is
the one ``--world`` registered for the method (``jaxpipe.training.runs.recipes``): its card, prompts, reward,
evaluation and default preset — the digits world's prompt grammar, the ``digit-scorer``'s reward over ``--terms``
and independent judges beside it; the shapes world's GenEval reward and GenEval's table on the test prompts
and held-out colour-shape pairs. With ``--reward`` (a JAX function or a ``@jaxpipe.rewards.host`` one; repeat
it to combine several, ``--reward-weight`` each) and ``--prompts`` (a ``.txt`` file, one prompt per line, or
``.jsonl`` with per-prompt metadata; a ``--heldout`` fraction held out), the card is judged before and after on
the held-out prompts by that reward (``jaxpipe.training.runs.heldout``).
``flow-grpo``, ``nft``, ``dmd2`` and ``unified`` take ``--lora-rank N`` (``--lora-alpha``, ``--lora-targets``):
LoRA adapters on the denoiser train instead of all its weights (``jaxpipe.nn.lora``); the saved card has
them merged into the base weights, so it loads and serves like any other.

Flags shared by commands are declared once, as fields of a dataclass whose metadata is the typer
option (``train_flags``); ``with_flags(*groups)`` adds a group's flags to a command's signature and hands the
command one object per group; ``train_run.run_training`` runs every command. A new method is one subcommand (its own flags and config) and, per world, one recipe.
"""

from __future__ import annotations

import dataclasses

import typer

from jaxpipe.cli.common import load
from jaxpipe.cli.train_flags import LoRAFlags, PolicyFlags, RefinerFlags, RunFlags, with_flags
from jaxpipe.cli.train_run import FAILED_EXIT, preset_config, run_training

__all__ = ["train_app", "RunFlags", "PolicyFlags", "RefinerFlags", "LoRAFlags", "FAILED_EXIT"]

train_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
    help="RL post-training and distillation (the digits world by default; --world shapes; --model/--prompts/--reward for your own): "
    "writes DIR/metrics.jsonl, DIR/*.png, DIR/report.json and the trained card (jp.cards.load(DIR)).",
)


_MODEL_HELP = "The card to train: a bundled id, a card directory or a diffusers folder (default: the world's, {})."
_PRESET_HELP = "An official recipe instead of the method flags ({}); none: the method flags. Default: the world's ({})."


@train_app.command("flow-grpo")
@with_flags(RunFlags, PolicyFlags, LoRAFlags)
def train_flow_grpo(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    loraflags: LoRAFlags,
    model: str | None = typer.Option(None, "--model", help=_MODEL_HELP.format("digits: flux-t2i, shapes: shapes-t2i")),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=_PRESET_HELP.format(
            "geneval: FlowGRPO's geneval_sd3, CFG in the policy, K 24, LoRA r 32, AdamW 3e-4, EMA evaluation; "
            "fast-nocfg: FlowGRPO-Fast at guidance 1",
            "shapes: fast-nocfg; digits: none",
        ),
    ),
) -> None:
    """FlowGRPO on a text-to-image card (digits: the digit-scorer reward; shapes: the GenEval reward)."""
    from jaxpipe.training import FlowGRPO

    def config(chosen):
        if chosen is not None:
            return preset_config("flow-grpo", chosen, runflags, policyflags, loraflags)
        return policyflags.generator(runflags, loraflags.config())

    run_training(runflags, "flow-grpo", model, config, FlowGRPO, preset=preset)


@train_app.command("nft")
@with_flags(RunFlags, LoRAFlags)
def train_nft(
    runflags: RunFlags,
    loraflags: LoRAFlags,
    num_steps: int = typer.Option(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation."),
    beta: float = typer.Option(
        1.0, "--beta", help="NFT step beta in (0, 1]: the implicit policies v± = v_old ± beta·(v_θ − v_old)."
    ),
    adv_clip: float = typer.Option(
        2.0, "--adv-clip", help="Advantage clip; r = 0.5 + 0.5·A/adv_clip is the optimality weight."
    ),
    ema_start: float = typer.Option(
        0.0, "--ema-start", help="The old policy's EMA decay at the first update (0: on-policy)."
    ),
    ema_end: float = typer.Option(0.5, "--ema-end", help="The old policy's EMA decay after the ramp."),
    ema_ramp: int = typer.Option(
        100, "--ema-ramp", help="Updates over which the decay ramps linearly from --ema-start to --ema-end."
    ),
    sampler: str = typer.Option("ode", "--sampler", help="The rollout's sampler: ode (no log-probs needed) or sde."),
    guidance: float = typer.Option(1.0, "--guidance", help="CFG scale of the rollouts."),
    sigma_sampling: str = typer.Option(
        "uniform", "--sigma-sampling", help="How the update re-noises clean samples: uniform or logit_normal."
    ),
    model: str | None = typer.Option(None, "--model", help=_MODEL_HELP.format("digits: flux-t2i, shapes: shapes-t2i")),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=_PRESET_HELP.format(
            "geneval: DiffusionNFT's sd3_geneval, CFG-free, K 24, 9 levels per sample, adaptive weighting, "
            "KL 1e-4, LoRA r 32, AdamW 3e-4, EMA evaluation",
            "geneval on both worlds",
        ),
    ),
) -> None:
    """DiffusionNFT on a text-to-image card: likelihood-free RL on the forward process."""
    from jaxpipe.training import EMA, DiffusionNFT, DiffusionNFTConfig, NoiseLevels, Sampling

    def config(chosen):
        if chosen is not None:
            own = {
                "--num-steps": (num_steps, 8),
                "--beta": (beta, 1.0),
                "--adv-clip": (adv_clip, 2.0),
                "--ema-start": (ema_start, 0.0),
                "--ema-end": (ema_end, 0.5),
                "--ema-ramp": (ema_ramp, 100),
                "--sampler": (sampler, "ode"),
                "--guidance": (guidance, 1.0),
                "--sigma-sampling": (sigma_sampling, "uniform"),
            }
            return preset_config("nft", chosen, runflags, loraflags, **own)
        return DiffusionNFTConfig(
            group=runflags.group(adv_clip=adv_clip),
            sampling=Sampling(num_steps=num_steps, sampler=sampler, guidance=guidance),
            beta=beta,
            ema=EMA(ema_start, ema_end, ema_ramp),
            noise=NoiseLevels(sigma_sampling),
            optimizer=runflags.optimizer(DiffusionNFTConfig().optimizer),
            lora=loraflags.config(),
        )

    run_training(runflags, "nft", model, config, DiffusionNFT, preset=preset)


def _no_preset(method: str, make):
    """A config maker for a method without presets."""

    def config(chosen):
        if chosen is not None:
            raise ValueError(f"{method} has no presets (got --preset {chosen})")
        return make()

    return config


@train_app.command("dmd2")
@with_flags(RunFlags, LoRAFlags)
def train_dmd2(
    runflags: RunFlags,
    loraflags: LoRAFlags,
    student_steps: int = typer.Option(
        2, "--student-steps", help="The student's sampling steps (1 or 2; at most the teacher's)."
    ),
    critic_steps: int = typer.Option(5, "--critic-steps", help="Fake-score critic updates per student update."),
    critic_lr: float = typer.Option(2e-4, "--critic-lr", help="The critic's learning rate (--lr is the student's)."),
    guidance: float | None = typer.Option(
        None, "--guidance", help="The teacher's (real score's) CFG scale (default: the teacher card's)."
    ),
    model: str | None = typer.Option(None, "--model", help=_MODEL_HELP.format("digits: flux-t2i")),
) -> None:
    """DMD2: distil a text-to-image card into a 1-2 step student (its card is served like any other)."""
    from jaxpipe.training import DMD2, DistributionMatching, DMD2Config

    def config():
        base = DMD2Config()
        dm = DistributionMatching(
            critic=dataclasses.replace(base.dm.critic, learning_rate=critic_lr),
            critic_steps=critic_steps,
            real_guidance=guidance,
        )
        return DMD2Config(
            student_steps=student_steps,
            group=runflags.group(),
            student=runflags.optimizer(base.student),
            dm=dm,
            lora=loraflags.config(),
        )

    run_training(
        runflags,
        "dmd2",
        model,
        _no_preset("dmd2", config),
        lambda card, reward, cfg: DMD2(card, cfg),
        needs_reward=False,
    )


@train_app.command("self-forcing")
@with_flags(RunFlags)
def train_self_forcing(
    runflags: RunFlags,
    teacher: str | None = typer.Option(
        None,
        "--teacher",
        help="Bidirectional text-to-video teacher (the real score): a bundled id or a card directory (default wan-t2v).",
    ),
    critic_steps: int | None = typer.Option(
        None, "--critic-steps", help="Fake-score critic updates per student update (default: SelfForcingConfig's)."
    ),
    critic_lr: float | None = typer.Option(
        None, "--critic-lr", help="The critic's learning rate; --lr is the student's (defaults: SelfForcingConfig's)."
    ),
    critic_warmup: int | None = typer.Option(
        None, "--critic-warmup", help="First steps that train only the critic (default: SelfForcingConfig's)."
    ),
    num_steps: int | None = typer.Option(
        None,
        "--num-steps",
        help="Denoising steps per chunk, in training and in the card it returns (default: the card's).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Causal (chunk_rollout) card to train: a bundled id or a card directory (default wan-causal).",
    ),
) -> None:
    """SelfForcing: a causal video card trained on its own chunked rollouts against a bidirectional teacher."""
    from jaxpipe.training import Sampling, SelfForcing, SelfForcingConfig

    def config():
        base = SelfForcingConfig()
        dm = dataclasses.replace(
            base.dm,
            critic=base.dm.critic
            if critic_lr is None
            else dataclasses.replace(base.dm.critic, learning_rate=critic_lr),
            critic_steps=base.dm.critic_steps if critic_steps is None else critic_steps,
        )
        return SelfForcingConfig(
            student=runflags.optimizer(base.student),
            dm=dm,
            group=runflags.group(),
            critic_warmup=base.critic_warmup if critic_warmup is None else critic_warmup,
            sampling=Sampling(num_steps=num_steps, guidance=None),
        )

    def method(card, reward, cfg):
        (real,) = load(teacher or "wan-t2v")
        return SelfForcing(card, real, cfg)

    run_training(
        runflags,
        "self-forcing",
        model,
        _no_preset("self-forcing", config),
        method,
        options={"teacher": teacher},
        needs_reward=False,
    )


@train_app.command("unified")
@with_flags(RunFlags, PolicyFlags, RefinerFlags, LoRAFlags)
def train_unified(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    refinerflags: RefinerFlags,
    loraflags: LoRAFlags,
    model: str | None = typer.Option(
        None, "--model", help="Card with a refiner LM to train: a bundled id or a card directory (default unified)."
    ),
) -> None:
    """UnifiedRL: the refiner LM and the generator trained from one reward (--prompt-only: the LM alone)."""
    from jaxpipe.training import UnifiedRL

    make = lambda: refinerflags.joint(policyflags, runflags, loraflags.config())  # noqa: E731
    run_training(runflags, "unified", model, _no_preset("unified", make), UnifiedRL)


@train_app.command("mot")
@with_flags(RunFlags, PolicyFlags)
def train_mot(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    skip: int = typer.Option(1, "--skip", help="Samples per group rendered without thinking (0 <= skip < K)."),
    token_weight: float = typer.Option(
        1.0, "--token-weight", help="Weight of the thinking (token policy-gradient) part of the one summed loss."
    ),
    lm_beta: float = typer.Option(0.01, "--lm-beta", help="k3-KL weight of the thoughts to the frozen reference."),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Mixture-of-Transformers card to train: a bundled id or a card directory (default bagel-mot).",
    ),
) -> None:
    """RL on shared weights: one MoT transformer thinks and generates; one summed update, one optimiser."""
    from jaxpipe.training import RefinerConfig, SharedMoTRL, SharedMoTRLConfig

    def config():
        return SharedMoTRLConfig(
            generator=policyflags.generator(runflags),
            thinking=RefinerConfig(skip=skip, beta=lm_beta),
            token_weight=token_weight,
        )

    run_training(runflags, "mot", model, _no_preset("mot", config), SharedMoTRL)


@train_app.command("joint")
@with_flags(RunFlags, PolicyFlags, RefinerFlags)
def train_joint(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    refinerflags: RefinerFlags,
    refiners: int = typer.Option(
        3,
        "--refiners",
        "-N",
        help="Refiner experts (digits: each owns one attribute slot: stroke, position, brightness, cycling).",
    ),
    credit: str = typer.Option(
        "per_expert",
        "--credit",
        help="shared (one advantage for every refiner) or per_expert (each refiner's own reward term).",
    ),
    expert_map: str = typer.Option(
        "auto",
        "--expert-map",
        help="How the N refiner updates map over the experts: vmap, map (lax.map) or auto (map on one CPU device, vmap on GPU/TPU).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Card with a refiner LM whose LM initialises every refiner (bundled id or directory; default unified).",
    ),
) -> None:
    """JointMultiExpertRL: N refiner experts (one mapped update) and the generator from one reward."""
    from jaxpipe.cards import toy_multi_expert
    from jaxpipe.training import JointMultiExpertRL

    def method(base, reward, cfg):  # the user's card: every refiner may say every word (no slots)
        return JointMultiExpertRL(toy_multi_expert.from_unified(base, refiners, model_id=base.model_id), reward, cfg)

    make = lambda: refinerflags.joint(policyflags, runflags, credit=credit, expert_map=expert_map)  # noqa: E731
    run_training(runflags, "joint", model, _no_preset("joint", make), method, options={"refiners": refiners})
