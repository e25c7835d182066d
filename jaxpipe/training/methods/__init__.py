"""The training methods, one module each, all of one shape (``jaxpipe.training.trainer``): ``finetune``,
``flow_grpo``, ``joint_rl`` (``UnifiedRL``, ``JointMultiExpertRL``), ``mot_rl``, ``nft``, ``dmd2``, ``self_forcing``."""

__all__: list[str] = []  # a package of method modules: it defines no names of its own
