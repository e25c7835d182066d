"""Deprecated: ``Supervised`` is ``jaxpipe.training.loss_trainer.LossTrainer`` (this module goes in the next release)."""

from jaxpipe._exports import deprecated

__all__: list[str] = []  # the names below answer with a DeprecationWarning

__getattr__ = deprecated(
    __name__,
    {
        "Supervised": ("jaxpipe.training.loss_trainer", "LossTrainer"),
        "PART": ("jaxpipe.training.loss_trainer", "PART"),
        "Loss": ("jaxpipe.training.loss_trainer", "Loss"),
    },
)
