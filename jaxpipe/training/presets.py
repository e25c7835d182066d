"""The official RL recipes as named presets: FlowGRPO's ``geneval`` and ``fast-nocfg``, DiffusionNFT's ``geneval``.

Each field cites where it comes from: the official FlowGRPO code (yifan123/flow_grpo at ac4c86e:
``config/base.py``, ``config/grpo.py::geneval_sd3``, ``scripts/train_sd3.py``) and the official DiffusionNFT
code (NVlabs/DiffusionNFT: ``config/base.py``, ``config/nft.py::sd3_geneval``, ``scripts/train_nft_sd3.py``).
What a 2-core machine forces is one number, the prompts per step (``Preset.prompts_per_step``; the official
runs use 48 prompts × 24 samples = 1,152 images per step), stated beside it. Two settings follow the card
rather than SD3.5-M: the guidance a CFG recipe rolls out at is the card's served one (the official 4.5 is
SD3.5-M's), and the LoRA targets are the network's own ``LORA_TARGETS``.

    preset = presets.get("flow-grpo", "geneval")
    method = FlowGRPO(card, reward, preset.config)
    fit(method.step, method.init(), prompts.batches(card, preset.prompts_per_step), steps=...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxpipe.nn.lora import LoRAConfig
from jaxpipe.training import ppo
from jaxpipe.training.ema import EMA, EvalEMA
from jaxpipe.training.methods.flow_grpo import FlowGRPOConfig
from jaxpipe.training.methods.nft import DiffusionNFTConfig
from jaxpipe.training.optim import Optimizer
from jaxpipe.training.rollout import Group, Sampling

__all__ = ["Preset", "PRESETS", "get", "names"]

OFFICIAL_PROMPTS_PER_STEP = 48
"""Prompts per step in both official GenEval recipes (``num_groups = 48``; 48/(32 GPUs·9/24) batches)."""

PROMPTS_PER_STEP = 4
"""What this project's 2-core machine runs instead: 4 prompts × 24 samples = 96 images per step."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named recipe: the method's config and how many prompts each step renders.

    Attributes:
      method: ``"flow-grpo"`` or ``"nft"``.
      name: the preset's name.
      config: the method's config (``FlowGRPOConfig`` / ``DiffusionNFTConfig``).
      prompts_per_step: P, the batch size to train with (K = ``config.group.size`` samples each).
      official_prompts_per_step: the official recipe's P.
      summary: one line on where it comes from and what differs.
    """

    method: str
    name: str
    config: Any
    prompts_per_step: int
    official_prompts_per_step: int
    summary: str

    @property
    def images_per_step(self) -> int:
        """``P · K``, the rollout's rows."""
        return self.prompts_per_step * self.config.group.size


def _official_optimizer() -> Optimizer:
    return Optimizer(
        3e-4,  # base.py train.learning_rate (both repositories)
        grad_clip=1.0,  # train.max_grad_norm
        b1=0.9,  # train.adam_beta1
        b2=0.999,  # train.adam_beta2
        weight_decay=1e-4,  # train.adam_weight_decay: AdamW
    )


_LORA = LoRAConfig(32, alpha=64.0)  # train_sd3.py / train_nft_sd3.py: LoraConfig(r=32, lora_alpha=64)
_GROUP = Group(
    24,  # geneval_sd3 / _get_config: sample.num_image_per_prompt = 24
    adv_clip=5.0,  # base.py train.adv_clip_max = 5
    global_std=True,  # sample.global_std = True (PerPromptStatTracker(global_std))
)


def _flow_grpo_geneval() -> Preset:
    config = FlowGRPOConfig(
        group=_GROUP,
        sampling=Sampling(
            num_steps=10,  # geneval_sd3: sample.num_steps = 10 (evaluation at 40)
            sampler="sde",
            noise_level=0.7,  # base.py sample.noise_level = 0.7
            sde_window=None,  # every step is an SDE step
            guidance=None,  # train.cfg = True at sample.guidance_scale: here the card's served guidance
        ),
        clip_eps=1e-4,  # base.py train.clip_range = 1e-4
        beta=0.04,  # geneval_sd3: train.beta = 0.04 ...
        kl="flowgrpo",  # ... in the official code's KL convention (mean((Δμ)²) / (2·std_dev_t²))
        ppo=ppo.Schedule(
            minibatches=2,  # gradient_accumulation_steps = num_batches_per_epoch // 2: two updates per rollout
            inner_epochs=1,  # train.num_inner_epochs = 1
            timestep_fraction=0.9,  # train.timestep_fraction = 0.99: int(10 · 0.99) = 9 of 10 steps
        ),
        optimizer=_official_optimizer(),
        lora=_LORA,
        detach_uncond=True,  # compute_log_prob: noise_pred_uncond.detach()
        filter_zero_advantages=True,  # train_sd3.py: samples whose advantages are all 0 are dropped
        # EMAModuleWrapper(decay=0.9, update_step_interval=8) over optimiser steps, train.ema = True: 8 updates are 4
        # rollouts of 2 here
        eval_ema=EvalEMA(0.9, every=4),
    )
    return Preset(
        "flow-grpo",
        "geneval",
        config,
        PROMPTS_PER_STEP,
        OFFICIAL_PROMPTS_PER_STEP,
        "FlowGRPO's geneval_sd3: CFG in the policy at the card's guidance, 10 SDE steps (9 trained), K 24, "
        "LoRA r 32 / α 64, AdamW 3e-4, β 0.04 (official KL), clip 1e-4, EMA 0.9 for evaluation",
    )


def _flow_grpo_fast_nocfg() -> Preset:
    geneval = _flow_grpo_geneval().config
    config = dataclasses.replace(
        geneval,
        # FlowGRPO-Fast with No-CFG training (the official README, 2025-08-14 / 2025-10-14): SDE on 2 steps only,
        # the rest ODE, at guidance 1; the two SDE steps are the first two here (a fixed window: the policy is static)
        sampling=dataclasses.replace(geneval.sampling, sde_window=(0, 2), guidance=1.0),
        ppo=ppo.Schedule(minibatches=2, inner_epochs=1, timestep_fraction=1.0),  # both captured steps train
    )
    return Preset(
        "flow-grpo",
        "fast-nocfg",
        config,
        PROMPTS_PER_STEP,
        OFFICIAL_PROMPTS_PER_STEP,
        "FlowGRPO-Fast without CFG: the geneval recipe at guidance 1 with the SDE on the first 2 of 10 steps",
    )


def _nft_geneval() -> Preset:
    config = DiffusionNFTConfig(
        group=_GROUP,
        sampling=Sampling(
            num_steps=10,  # _get_config: sample.num_steps = 10
            sampler="ode",  # sample.deterministic = True (its solver "dpm2"; here the card's Euler ODE)
            guidance=1.0,  # sample.guidance_scale = 1.0: CFG-free
        ),
        beta=1.0,  # config.beta = 1.0 (the implicit policies' step)
        ema=EMA(start=0.001, end=0.5, ramp_steps=499),  # decay_type 1: min(0.001 · (n + 1), 0.5) after update n
        weighting="adaptive",  # train_nft_sd3.py's adaptive x0-space weighting
        kl_beta=1e-4,  # train.beta = 0.0001: mean((v_θ − v_ref)²) to the base (LoRA adapters disabled)
        schedule_levels=9,  # train.timestep_fraction = 0.99: int(10 · 0.99) = 9 of the schedule's levels
        optimizer=_official_optimizer(),
        lora=_LORA,
        eval_ema=EvalEMA(0.9, every=1),  # EMAModuleWrapper(decay=0.9, update_step_interval=1)
    )
    return Preset(
        "nft",
        "geneval",
        config,
        PROMPTS_PER_STEP,
        OFFICIAL_PROMPTS_PER_STEP,
        "DiffusionNFT's sd3_geneval: CFG-free ODE rollouts of 10 steps, K 24, 9 levels per sample, adaptive "
        "weighting, KL 1e-4 to the base, old-policy decay min(0.001·step, 0.5), LoRA r 32 / α 64, AdamW 3e-4",
    )


PRESETS: dict[tuple[str, str], Callable[[], Preset]] = {
    ("flow-grpo", "geneval"): _flow_grpo_geneval,
    ("flow-grpo", "fast-nocfg"): _flow_grpo_fast_nocfg,
    ("nft", "geneval"): _nft_geneval,
}
"""``(method, name) -> the preset's builder``."""


def names(method: str) -> tuple[str, ...]:
    """The preset names of a method.

    Args:
      method: ``"flow-grpo"`` or ``"nft"``.

    Returns:
      Its preset names (empty for a method without presets).
    """
    return tuple(name for m, name in PRESETS if m == method)


def get(method: str, name: str, *, prompts_per_step: int | None = None) -> Preset:
    """The preset ``name`` of ``method``.

    Args:
      method: ``"flow-grpo"`` or ``"nft"``.
      name: one of ``names(method)``.
      prompts_per_step: P to train with instead of the 2-core default (the official recipes: 48).

    Returns:
      The ``Preset``.

    Raises:
      ValueError: for an unknown method or name, or ``prompts_per_step < 1``.
    """
    if (method, name) not in PRESETS:
        known = names(method)
        if not known:
            raise ValueError(f"no presets for method {method!r}; methods with presets: flow-grpo, nft")
        raise ValueError(f"{method} has no preset {name!r}; its presets: {', '.join(known)}")
    preset = PRESETS[(method, name)]()
    if prompts_per_step is None:
        return preset
    if isinstance(prompts_per_step, bool) or not isinstance(prompts_per_step, int) or prompts_per_step < 1:
        raise ValueError(f"prompts_per_step must be a positive int (got {prompts_per_step!r})")
    return dataclasses.replace(preset, prompts_per_step=prompts_per_step)
