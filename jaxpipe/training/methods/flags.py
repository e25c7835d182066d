"""The settings a training method takes on the command line, declared once as flag groups (no typer, no JAX).

A flag group is a dataclass whose fields are declared with ``flag(default, "--name", help=...)``: the field's
metadata holds the option's names and help, from which ``jaxpipe train`` builds its typer options
(``jaxpipe.cli.train_flags``). The groups several methods share are here — ``PolicyFlags`` (the SDE
rollout, PPO and KL of FlowGRPO and the methods built on it), ``RefinerFlags`` (the refiner LMs), ``LoRAFlags``
(adapters on the denoiser) — with each method's own group (``NFTFlags``, ``DMD2Flags``, ``SelfForcingFlags``,
``MoTFlags``, ``JointFlags``). A method names its groups in its registration (``registry.MethodInfo.flags``) and
turns them into its config in its own module.

The config builders read a few run-wide settings from ``run`` (the ``RunSettings`` protocol: what every
command's flags give — the group size, the learning rate, the prompts per step), so nothing here depends on
the command line.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

__all__ = [
    "DMD2Flags",
    "JointFlags",
    "LoRAFlags",
    "MoTFlags",
    "NFTFlags",
    "PolicyFlags",
    "RefinerFlags",
    "RunSettings",
    "SelfForcingFlags",
    "flag",
    "flag_fields",
    "sde_window",
]


def flag(default: Any, *names: str, help: str) -> Any:
    """A flag group's field: its default and the option's names and help (read by ``jaxpipe train``).

    Args:
      default: the default value (``...``: required; a list: a repeatable flag, copied per instance).
      *names: the option's names, the long one first (``"--group-size", "-K"``).
      help: the option's help line.

    Returns:
      A ``dataclasses.field`` whose metadata holds ``names`` and ``help``.
    """
    metadata = {"names": names, "help": help}
    if isinstance(default, list):  # a repeatable flag
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag_fields(group: type) -> list[dataclasses.Field]:
    """The fields of flag group ``group`` that are command-line flags (declared with ``flag``).

    Args:
      group: a flag group dataclass.

    Returns:
      Its fields whose metadata names an option.
    """
    return [f for f in dataclasses.fields(group) if "names" in f.metadata]


class RunSettings(Protocol):
    """What a method's config builder reads from the run's own flags (``jaxpipe.cli.train_flags.RunFlags``)."""

    prompts_per_step: int
    group_size: int
    lr: float | None

    def group(self, **changes: Any) -> Any:
        """The run's ``Group`` (``group_size`` samples per prompt; ``changes``: other ``Group`` fields)."""

    def optimizer(self, default: Any) -> Any:
        """``default`` (an ``Optimizer``) at the run's learning rate when one is given."""


def sde_window(text: str) -> tuple[int, int] | None:
    """``--sde-window`` as typed: ``"START,STOP"`` -> ``(start, stop)``; ``"all"`` (or empty) -> ``None``.

    Args:
      text: the flag's value.

    Returns:
      The window, or ``None`` for every step.

    Raises:
      ValueError: if it is neither.
    """
    if text.strip().lower() in ("all", "none", ""):
        return None
    try:
        start, stop = (int(p) for p in text.split(","))
    except ValueError:
        raise ValueError(f"--sde-window must be START,STOP (e.g. 0,4) or 'all' (got {text!r})") from None
    return start, stop


@dataclasses.dataclass
class PolicyFlags:
    """The policy-gradient commands (FlowGRPO and the methods built on it): SDE rollouts, PPO, KL."""

    num_steps: int = flag(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation.")
    sde_window: str = flag(
        "0,4",
        "--sde-window",
        help="START,STOP: denoise steps sampled with the SDE and trained (ODE elsewhere); 'all' = every step.",
    )
    noise_level: float = flag(0.7, "--noise-level", help="SDE noise level (eta).")
    beta: float = flag(0.04, "--beta", help="Generator KL weight to the frozen reference DiT.")
    kl: str = flag(
        "exact",
        "--kl",
        help="Generator KL convention: exact (Gaussian KL of the SDE step) or flowgrpo (the official code's: exact x |dt|).",
    )
    clip_eps: float = flag(1e-3, "--clip-eps", help="Generator PPO ratio clip.")
    minibatches: int = flag(
        1,
        "--minibatches",
        help="Updates per epoch over each rollout: its P·K rows split into this many shuffled minibatches.",
    )
    inner_epochs: int = flag(
        1,
        "--inner-epochs",
        help="Passes over each rollout's minibatches (updates per rollout = minibatches × inner epochs).",
    )
    timestep_fraction: float = flag(
        1.0,
        "--timestep-fraction",
        help="Fraction (0, 1] of the captured denoising steps each minibatch trains on, drawn per sample.",
    )

    def generator(self, run: RunSettings, lora: Any = None) -> Any:
        """The generator's ``FlowGRPOConfig``.

        Args:
          run: the run's settings (group size, learning rate, prompts per step).
          lora: the generator's ``LoRAConfig`` (``LoRAFlags.config``; ``None``: full training).

        Returns:
          The config, its PPO schedule checked against the rollout's rows (before any card loads).

        Raises:
          ValueError: if a setting is out of range.
        """
        from jaxpipe.training import FlowGRPOConfig, Sampling
        from jaxpipe.training.ppo import Schedule

        config = FlowGRPOConfig(
            group=run.group(),
            sampling=Sampling(
                num_steps=self.num_steps,
                sampler="sde",
                noise_level=self.noise_level,
                sde_window=sde_window(self.sde_window),
            ),
            clip_eps=self.clip_eps,
            beta=self.beta,
            kl=self.kl,
            ppo=Schedule(self.minibatches, self.inner_epochs, self.timestep_fraction),
            optimizer=run.optimizer(FlowGRPOConfig().optimizer),
            lora=lora,
        )
        config.ppo.check_rows(run.prompts_per_step * run.group_size)
        return config


@dataclasses.dataclass
class RefinerFlags:
    """Commands that train refiner LMs next to the generator."""

    skip: int = flag(1, "--skip", help="Samples per group that keep the original prompt (0 <= skip < K).")
    prompt_only: bool = flag(False, "--prompt-only", help="Train only the refiner(s); the generator stays frozen.")
    lm_lr: float = flag(1e-3, "--lm-lr", help="Refiner learning rate.")
    lm_beta: float = flag(0.01, "--lm-beta", help="Refiner k3-KL weight to its frozen reference.")

    def joint(self, policy: PolicyFlags, run: RunSettings, lora: Any = None, **changes: Any) -> Any:
        """The ``JointMultiExpertRLConfig`` of the refiner and generator flags.

        Args:
          policy: the generator's flags.
          run: the run's settings.
          lora: the generator's ``LoRAConfig`` (``None``: full training).
          **changes: other config fields (``credit``, ``expert_map``).

        Returns:
          The config.

        Raises:
          ValueError: if a setting is out of range.
        """
        from jaxpipe.training import JointMultiExpertRLConfig, Optimizer, RefinerConfig

        return JointMultiExpertRLConfig(
            generator=policy.generator(run, lora),
            refiner=RefinerConfig(skip=self.skip, beta=self.lm_beta),
            refiner_optimizer=Optimizer(self.lm_lr),
            joint=not self.prompt_only,
            **changes,
        )


@dataclasses.dataclass
class LoRAFlags:
    """The denoiser-training commands: train LoRA adapters on the denoiser instead of all its weights."""

    lora_rank: int = flag(
        0,
        "--lora-rank",
        help="Train rank-N LoRA adapters on the denoiser, its base weights frozen; the trained card has them merged (0: off, train every weight).",
    )
    lora_alpha: float | None = flag(
        None, "--lora-alpha", help="LoRA alpha: the adapters are scaled by alpha/rank (default: the rank, scale 1)."
    )
    lora_targets: str | None = flag(
        None,
        "--lora-targets",
        help="Comma-separated layer names the adapters wrap, matched against the end of each layer's name like peft's target_modules, e.g. to_q,to_k,to_v,to_out.0 (default: the network's own: FLUX's attention and feed-forward projections, the DiT's attention and MLP).",
    )

    def config(self) -> Any:
        """The ``LoRAConfig`` of the flags (``None`` without ``--lora-rank``).

        Returns:
          The adapters' settings, or ``None``.

        Raises:
          ValueError: on a negative rank, ``--lora-alpha`` / ``--lora-targets`` without a rank, or bad values.
        """
        from jaxpipe.nn.lora import LoRAConfig

        if self.lora_rank < 0:
            raise ValueError(f"--lora-rank must be >= 0 (0: no adapters; got {self.lora_rank})")
        if self.lora_rank == 0:
            if self.lora_alpha is not None or self.lora_targets is not None:
                raise ValueError(
                    "--lora-alpha and --lora-targets set up LoRA adapters: they need --lora-rank N (N >= 1)"
                )
            return None
        targets = None
        if self.lora_targets is not None:
            targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
            if not targets:
                raise ValueError(f"--lora-targets must name layers, comma-separated (got {self.lora_targets!r})")
        return LoRAConfig(self.lora_rank, alpha=self.lora_alpha, target_modules=targets)


@dataclasses.dataclass
class NFTFlags:
    """``jaxpipe train nft``'s own flags (``methods.nft.config_from_flags``)."""

    num_steps: int = flag(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation.")
    beta: float = flag(
        1.0, "--beta", help="NFT step beta in (0, 1]: the implicit policies v± = v_old ± beta·(v_θ − v_old)."
    )
    adv_clip: float = flag(2.0, "--adv-clip", help="Advantage clip; r = 0.5 + 0.5·A/adv_clip is the optimality weight.")
    ema_start: float = flag(0.0, "--ema-start", help="The old policy's EMA decay at the first update (0: on-policy).")
    ema_end: float = flag(0.5, "--ema-end", help="The old policy's EMA decay after the ramp.")
    ema_ramp: int = flag(
        100, "--ema-ramp", help="Updates over which the decay ramps linearly from --ema-start to --ema-end."
    )
    sampler: str = flag("ode", "--sampler", help="The rollout's sampler: ode (no log-probs needed) or sde.")
    guidance: float = flag(1.0, "--guidance", help="CFG scale of the rollouts.")
    sigma_sampling: str = flag(
        "uniform", "--sigma-sampling", help="How the update re-noises clean samples: uniform or logit_normal."
    )


@dataclasses.dataclass
class DMD2Flags:
    """``jaxpipe train dmd2``'s own flags (``methods.dmd2.config_from_flags``)."""

    student_steps: int = flag(
        2, "--student-steps", help="The student's sampling steps (1 or 2; at most the teacher's)."
    )
    critic_steps: int = flag(5, "--critic-steps", help="Fake-score critic updates per student update.")
    critic_lr: float = flag(2e-4, "--critic-lr", help="The critic's learning rate (--lr is the student's).")
    guidance: float | None = flag(
        None, "--guidance", help="The teacher's (real score's) CFG scale (default: the teacher card's)."
    )


@dataclasses.dataclass
class SelfForcingFlags:
    """``jaxpipe train self-forcing``'s own flags (``methods.self_forcing.config_from_flags``)."""

    teacher: str | None = flag(
        None,
        "--teacher",
        help="Bidirectional text-to-video teacher (the real score): a bundled id or a card directory (default wan-t2v).",
    )
    critic_steps: int | None = flag(
        None, "--critic-steps", help="Fake-score critic updates per student update (default: SelfForcingConfig's)."
    )
    critic_lr: float | None = flag(
        None, "--critic-lr", help="The critic's learning rate; --lr is the student's (defaults: SelfForcingConfig's)."
    )
    critic_warmup: int | None = flag(
        None, "--critic-warmup", help="First steps that train only the critic (default: SelfForcingConfig's)."
    )
    num_steps: int | None = flag(
        None,
        "--num-steps",
        help="Denoising steps per chunk, in training and in the card it returns (default: the card's).",
    )


@dataclasses.dataclass
class MoTFlags:
    """``jaxpipe train mot``'s own flags (``methods.mot_rl.config_from_flags``)."""

    skip: int = flag(1, "--skip", help="Samples per group rendered without thinking (0 <= skip < K).")
    token_weight: float = flag(
        1.0, "--token-weight", help="Weight of the thinking (token policy-gradient) part of the one summed loss."
    )
    lm_beta: float = flag(0.01, "--lm-beta", help="k3-KL weight of the thoughts to the frozen reference.")


@dataclasses.dataclass
class JointFlags:
    """``jaxpipe train joint``'s own flags (``methods.joint_rl.joint_from_flags``)."""

    refiners: int = flag(
        3,
        "--refiners",
        "-N",
        help="Refiner experts (digits: each owns one attribute slot: stroke, position, brightness, cycling).",
    )
    credit: str = flag(
        "per_expert",
        "--credit",
        help="shared (one advantage for every refiner) or per_expert (each refiner's own reward term).",
    )
    expert_map: str = flag(
        "auto",
        "--expert-map",
        help="How the N refiner updates map over the experts: vmap, map (lax.map) or auto (map on one CPU device, vmap on GPU/TPU).",
    )
