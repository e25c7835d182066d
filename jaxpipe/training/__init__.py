"""Training: every method is one ``Trainer`` shape — ``init(key) -> state``, a jitted
``step(state, batch, key) -> (state, metrics)``, ``card(state)``, ``roles`` / ``role_card`` (``trainer``).

The methods (``methods/``): ``Finetune`` (flow matching), ``FlowGRPO``, ``UnifiedRL`` and
``JointMultiExpertRL`` (refiner LM(s) + generator), ``SharedMoTRL`` (one MoT thinks and generates),
``DiffusionNFT``, ``DMD2`` and ``SelfForcing``; the denoiser methods take ``lora`` (a ``LoRAConfig``:
train adapters only, ``jaxpipe.nn.lora``). Each is built from the shared pieces: ``parts`` (the
card split into trained parts), ``optim`` (``Optimizer``), ``update`` (the guarded optimiser step),
``rollout`` (rendering a grouped batch through the card's own program, ``Group``, ``Sampling``,
scoring it with a ``jaxpipe.rewards`` reward), ``grpo`` (the generator's FlowGRPO objective),
``refine`` (the refiner's token objective), ``distribution_matching`` (DMD2's scores and critic),
``ppo`` (several updates per rollout), ``noise`` and ``losses``, ``ema`` (the old policy's and the
evaluation averages); ``loss_trainer`` (``LossTrainer``) trains any module on any loss (the pretraining recipes), ``fit`` runs any trainer, ``runs`` executes a whole run.

Names are imported on first use (``from jaxpipe.training import FlowGRPO`` works), so importing
this package stays cheap.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from jaxpipe._exports import deprecated, typed_imports

# `fit` is imported now: a lazy name equal to a submodule's would be shadowed by the submodule once it is imported
from jaxpipe.training.fit import fit

if TYPE_CHECKING:  # the one list of the public names: for type checkers, the API reference, and ``_LAZY`` below
    from jaxpipe.nn.lora import LoRAConfig
    from jaxpipe.training.autoencoder import AutoencoderTrainConfig, AutoencoderTrainer
    from jaxpipe.training.distribution_matching import DistributionMatching
    from jaxpipe.training.ema import EMA, EvalEMA
    from jaxpipe.training.loss_trainer import LossTrainer
    from jaxpipe.training.losses import (
        flow_grpo_kl,
        flow_grpo_loss,
        group_advantages,
        k3_kl,
        ppo_clip_loss,
        token_loss,
        token_pg_loss,
    )
    from jaxpipe.training.methods.dmd2 import DMD2, DMD2Config
    from jaxpipe.training.methods.finetune import Finetune, FinetuneConfig
    from jaxpipe.training.methods.flow_grpo import FlowGRPO, FlowGRPOConfig
    from jaxpipe.training.methods.joint_rl import (
        JointMultiExpertRL,
        JointMultiExpertRLConfig,
        UnifiedRL,
        UnifiedRLConfig,
    )
    from jaxpipe.training.methods.mot_rl import SharedMoTRL, SharedMoTRLConfig
    from jaxpipe.training.methods.nft import DiffusionNFT, DiffusionNFTConfig
    from jaxpipe.training.methods.self_forcing import SelfForcing, SelfForcingConfig
    from jaxpipe.training.noise import NoiseLevels
    from jaxpipe.training.optim import Optimizer
    from jaxpipe.training.refine import RefinerConfig
    from jaxpipe.training.rollout import Group, Sampling
    from jaxpipe.training.trainer import Method, Trainer, TrainState


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    return _renamed(name)


_renamed = deprecated(
    __name__,
    {
        "JointRLConfig": ("jaxpipe.training.methods.joint_rl", "JointMultiExpertRLConfig"),
        "MoTRLConfig": ("jaxpipe.training.methods.mot_rl", "SharedMoTRLConfig"),
        "Supervised": ("jaxpipe.training.loss_trainer", "LossTrainer"),
    },
)
"""The names renamed in this release: they still answer, with a ``DeprecationWarning``, for one release."""


_LAZY = typed_imports(__file__)
"""Each public name -> the module it is imported from on first use: the ``TYPE_CHECKING`` block above, read once."""

# a literal list: ruff and the API reference read __all__ statically (a test keeps it equal to _LAZY + fit)
__all__ = [
    "AutoencoderTrainConfig",
    "AutoencoderTrainer",
    "DMD2",
    "DMD2Config",
    "DiffusionNFT",
    "DiffusionNFTConfig",
    "DistributionMatching",
    "EMA",
    "EvalEMA",
    "Finetune",
    "FinetuneConfig",
    "FlowGRPO",
    "FlowGRPOConfig",
    "Group",
    "JointMultiExpertRL",
    "JointMultiExpertRLConfig",
    "LoRAConfig",
    "LossTrainer",
    "Method",
    "NoiseLevels",
    "Optimizer",
    "RefinerConfig",
    "Sampling",
    "SelfForcing",
    "SelfForcingConfig",
    "SharedMoTRL",
    "SharedMoTRLConfig",
    "TrainState",
    "Trainer",
    "UnifiedRL",
    "UnifiedRLConfig",
    "fit",
    "flow_grpo_kl",
    "flow_grpo_loss",
    "group_advantages",
    "k3_kl",
    "ppo_clip_loss",
    "token_loss",
    "token_pg_loss",
]
