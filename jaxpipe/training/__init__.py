"""Training: every method is ``init(key) -> state`` and a jitted ``step(state, batch, key) -> (state, metrics)``.

Submodules are imported on first use (``from jaxpipe.training import FlowGRPO`` works), so
importing this package stays cheap and ``python -m jaxpipe.training.<module>`` runs cleanly.
"""

from importlib import import_module

_LAZY = {
    "FlowGRPO": "jaxpipe.training.flow_grpo",
    "FlowGRPOConfig": "jaxpipe.training.flow_grpo",
    "DiffusionNFT": "jaxpipe.training.nft", "DiffusionNFTConfig": "jaxpipe.training.nft",
    "SelfForcing": "jaxpipe.training.self_forcing", "SelfForcingConfig": "jaxpipe.training.self_forcing",
    "DMD2": "jaxpipe.training.dmd2", "DMD2Config": "jaxpipe.training.dmd2",
    "UnifiedRL": "jaxpipe.training.unified_rl",
    "UnifiedRLConfig": "jaxpipe.training.unified_rl",
    "JointMultiExpertRL": "jaxpipe.training.joint_rl",
    "JointRLConfig": "jaxpipe.training.joint_rl",
    "Finetune": "jaxpipe.training.finetune",
    "FinetuneConfig": "jaxpipe.training.finetune",
    "AutoencoderTrainer": "jaxpipe.training.autoencoder",
    "AutoencoderTrainConfig": "jaxpipe.training.autoencoder",
    "group_advantages": "jaxpipe.training.losses",
    "ppo_clip_loss": "jaxpipe.training.losses",
    "flow_grpo_kl": "jaxpipe.training.losses",
    "flow_grpo_loss": "jaxpipe.training.losses",
    "token_pg_loss": "jaxpipe.training.losses",
    "k3_kl": "jaxpipe.training.losses",
    "token_loss": "jaxpipe.training.losses",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jaxpipe.training' has no attribute {name!r}")


__all__ = sorted(_LAZY)
