"""jaxpipe: multi-model generative pipelines and their joint RL post-training, in JAX."""

from jaxpipe import cards, data, loops, nn, samplers
from jaxpipe.card import Card, CardSpec, CardValidationError, LoopSpec

__version__ = "0.1.0"

__all__ = ["Card", "CardSpec", "CardValidationError", "LoopSpec", "cards", "data", "loops", "nn", "samplers"]
