"""The training methods ``jaxpipe train`` offers, one registration each (cheap to import: no JAX until a run).

A ``MethodInfo`` names a method's command, its trainer and config, the flag groups it takes
(``methods.flags``) and where its config and trainer are built from those flags — functions in the method's
own module, named ``"module:function"`` and imported only when the command runs. ``jaxpipe train`` builds one
subcommand per registration, all through one code path (``jaxpipe.cli.train``). Adding a method is its
module plus one ``register_method`` line here (docs/training/new-method.md):

    register_method(MethodInfo("my-rl", "MyRL on a text-to-image card.", trainer=f"{_M}.my_rl:MyRL",
                               config=f"{_M}.my_rl:config_from_flags", flags=(PolicyFlags,)))

The world's run a command trains (its card, prompts, reward, evaluation) is registered by the world
(``jaxpipe.training.runs.recipes``); the official presets by method name (``jaxpipe.training.presets``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib import import_module
from typing import Any

from jaxpipe import validate
from jaxpipe.training.methods.flags import (
    DMD2Flags,
    JointFlags,
    LoRAFlags,
    MoTFlags,
    NFTFlags,
    PolicyFlags,
    RefinerFlags,
    SelfForcingFlags,
)

__all__ = ["MethodInfo", "method", "methods", "register_method", "resolve", "unregister_method"]

MODEL_HELP = "The card to train: a bundled id, a card directory or a diffusers folder (default: the world's, {})."
"""``--model``'s help for a method trained on a world's text-to-image card (``{}``: the worlds' cards)."""


@dataclasses.dataclass(frozen=True)
class MethodInfo:
    """One training method as ``jaxpipe train`` offers it.

    Attributes:
      name: the command (``"flow-grpo"``); also the key of its world recipes and presets.
      summary: the command's help line.
      trainer: ``"module:Class"`` of the trainer, built ``Class(card, reward, config)`` on the user's prompts
        and reward (unless ``build`` is given).
      config: ``"module:function"`` building the method's config, ``function(run, *groups)``: ``run`` the
        run's settings (``flags.RunSettings``), ``groups`` one instance per ``flags`` group, in order.
      flags: the flag groups the command takes besides every command's run flags (``flags.PolicyFlags``,
        the method's own group ...).
      build: ``"module:function"`` building the trainer instead, ``function(card, reward, config, *groups,
        load=...)`` (``load``: the command's card loader; ``None``: ``trainer(card, reward, config)``).
      model_help: ``--model``'s help.
      preset_help: ``--preset``'s help (``None``: the method has no presets and no ``--preset`` flag).
      needs_reward: whether the user's ``--prompts`` need a ``--reward`` (distillation: no).
      gradient_snr: whether a run measures the gradient signal-to-noise by default.
      world_options: fields of the method's groups handed to a world's recipe as its options
        (``"teacher"``), when given.

    Raises:
      ValueError: on construction, if a name or a ``module:attribute`` path is malformed.
    """

    name: str
    summary: str
    trainer: str
    config: str
    flags: tuple[type, ...] = ()
    build: str | None = None
    model_help: str = MODEL_HELP.format("digits: flux-t2i, shapes: shapes-t2i")
    preset_help: str | None = None
    needs_reward: bool = True
    gradient_snr: bool = False
    world_options: tuple[str, ...] = ()

    def __post_init__(self):
        validate.rule(
            bool(self.name) and self.name == self.name.strip().lower() and " " not in self.name,
            f"a method's name is its command: lowercase, no spaces (got {self.name!r})",
        )
        for field in ("trainer", "config", "build"):
            path = getattr(self, field)
            validate.rule(
                path is None or (isinstance(path, str) and path.count(":") == 1),
                f"MethodInfo.{field} must be 'module:attribute' (got {path!r})",
            )
        validate.rule(
            all(dataclasses.is_dataclass(group) for group in self.flags),
            f"MethodInfo.flags must be flag group dataclasses (got {self.flags!r})",
            TypeError,
        )

    def make_config(self, run: Any, *groups: Any) -> Any:
        """The method's config from the run's settings and its flag groups (imports the method's module).

        Args:
          run: the run's settings (``flags.RunSettings``).
          *groups: one instance per ``flags`` group, in order.

        Returns:
          The config.

        Raises:
          ValueError: if a setting is out of range.
        """
        return resolve(self.config)(run, *groups)

    def make_trainer(self, card: Any, reward: Any, config: Any, *groups: Any, load: Callable) -> Any:
        """The trainer on the user's card and reward.

        Args:
          card: the card to train.
          reward: the user's reward (``None`` for a method that needs none).
          config: the method's config.
          *groups: one instance per ``flags`` group, in order.
          load: the command's card loader (``id or directory -> (card,)``), for a method that loads another card.

        Returns:
          The trainer.
        """
        if self.build is not None:
            return resolve(self.build)(card, reward, config, *groups, load=load)
        return resolve(self.trainer)(card, reward, config)


_METHODS: dict[str, MethodInfo] = {}


def resolve(path: str) -> Any:
    """The object a ``"module:attribute"`` path names (importing the module).

    Args:
      path: ``"package.module:name"``.

    Returns:
      The attribute.
    """
    module, name = path.split(":")
    return getattr(import_module(module), name)


def register_method(info: MethodInfo, *, replace: bool = False) -> MethodInfo:
    """Register a training method: ``jaxpipe train`` offers it as the command ``info.name``.

    Args:
      info: the method.
      replace: replace a different method registered under the same name.

    Returns:
      ``info``.

    Raises:
      TypeError: if ``info`` is not a ``MethodInfo``.
      ValueError: if another method is registered under the name (and not ``replace``).
    """
    validate.rule(
        isinstance(info, MethodInfo), f"register_method takes a MethodInfo (got {type(info).__name__})", TypeError
    )
    known = _METHODS.get(info.name)
    validate.rule(
        known is None or known == info or replace,
        f"a method named {info.name!r} is already registered (pass replace=True to replace it)",
    )
    _METHODS[info.name] = info
    return info


def unregister_method(name: str) -> None:
    """Remove the method registered as ``name`` (nothing if none is).

    Args:
      name: the method's command.
    """
    _METHODS.pop(name, None)


def methods() -> dict[str, MethodInfo]:
    """Every registered method, by command, in registration order.

    Returns:
      ``{name: MethodInfo}`` (a copy).
    """
    return dict(_METHODS)


def method(name: str) -> MethodInfo:
    """The method registered as ``name``.

    Args:
      name: the command (``"nft"``).

    Returns:
      Its ``MethodInfo``.

    Raises:
      ValueError: naming the registered methods, if none is registered as ``name``.
    """
    validate.rule(name in _METHODS, f"no training method {name!r} (registered: {', '.join(_METHODS)})")
    return _METHODS[name]


_M = "jaxpipe.training.methods"
_PRESET_HELP = "An official recipe instead of the method flags ({}); none: the method flags. Default: the world's ({})."

# The built-in methods: one registration each.
register_method(
    MethodInfo(
        "flow-grpo",
        "FlowGRPO on a text-to-image card (digits: the digit-scorer reward; shapes: the GenEval reward).",
        trainer=f"{_M}.flow_grpo:FlowGRPO",
        config=f"{_M}.flow_grpo:config_from_flags",
        flags=(PolicyFlags, LoRAFlags),
        preset_help=_PRESET_HELP.format(
            "geneval: FlowGRPO's geneval_sd3, CFG in the policy, K 24, LoRA r 32, AdamW 3e-4, EMA evaluation; "
            "fast-nocfg: FlowGRPO-Fast at guidance 1",
            "shapes: fast-nocfg; digits: none",
        ),
        gradient_snr=True,
    )
)
register_method(
    MethodInfo(
        "nft",
        "DiffusionNFT on a text-to-image card: likelihood-free RL on the forward process.",
        trainer=f"{_M}.nft:DiffusionNFT",
        config=f"{_M}.nft:config_from_flags",
        flags=(LoRAFlags, NFTFlags),
        preset_help=_PRESET_HELP.format(
            "geneval: DiffusionNFT's sd3_geneval, CFG-free, K 24, 9 levels per sample, adaptive weighting, "
            "KL 1e-4, LoRA r 32, AdamW 3e-4, EMA evaluation",
            "geneval on both worlds",
        ),
        gradient_snr=True,
    )
)
register_method(
    MethodInfo(
        "dmd2",
        "DMD2: distil a text-to-image card into a 1-2 step student (its card is served like any other).",
        trainer=f"{_M}.dmd2:DMD2",
        config=f"{_M}.dmd2:config_from_flags",
        flags=(LoRAFlags, DMD2Flags),
        build=f"{_M}.dmd2:from_flags",
        model_help=MODEL_HELP.format("digits: flux-t2i"),
        needs_reward=False,
    )
)
register_method(
    MethodInfo(
        "self-forcing",
        "SelfForcing: a causal video card trained on its own chunked rollouts against a bidirectional teacher.",
        trainer=f"{_M}.self_forcing:SelfForcing",
        config=f"{_M}.self_forcing:config_from_flags",
        flags=(SelfForcingFlags,),
        build=f"{_M}.self_forcing:from_flags",
        model_help="Causal (chunk_rollout) card to train: a bundled id or a card directory (default wan-causal).",
        needs_reward=False,
        world_options=("teacher",),
    )
)
register_method(
    MethodInfo(
        "unified",
        "UnifiedRL: the refiner LM and the generator trained from one reward (--prompt-only: the LM alone).",
        trainer=f"{_M}.joint_rl:UnifiedRL",
        config=f"{_M}.joint_rl:unified_from_flags",
        flags=(PolicyFlags, RefinerFlags, LoRAFlags),
        model_help="Card with a refiner LM to train: a bundled id or a card directory (default unified).",
    )
)
register_method(
    MethodInfo(
        "mot",
        "RL on shared weights: one MoT transformer thinks and generates; one summed update, one optimiser.",
        trainer=f"{_M}.mot_rl:SharedMoTRL",
        config=f"{_M}.mot_rl:config_from_flags",
        flags=(PolicyFlags, MoTFlags),
        model_help="Mixture-of-Transformers card to train: a bundled id or a card directory (default bagel-mot).",
    )
)
register_method(
    MethodInfo(
        "joint",
        "JointMultiExpertRL: N refiner experts (one mapped update) and the generator from one reward.",
        trainer=f"{_M}.joint_rl:JointMultiExpertRL",
        config=f"{_M}.joint_rl:joint_from_flags",
        flags=(PolicyFlags, RefinerFlags, JointFlags),
        build=f"{_M}.joint_rl:joint_trainer_from_flags",
        model_help="Card with a refiner LM whose LM initialises every refiner (bundled id or directory; default unified).",
        world_options=("refiners",),
    )
)
