"""jaxpipe: multi-model generative pipelines and their joint RL post-training, in JAX."""

from jaxpipe import cards, loops, nn, samplers
from jaxpipe.card import Card, CardSpec, CardValidationError, LoopSpec
from jaxpipe.request import Output, Request
from jaxpipe.program import Program
from jaxpipe.workflow import Stage, Workflow
from jaxpipe.generate import generate
from jaxpipe.engine import Engine
from jaxpipe import cache, parity

__version__ = "0.1.0"

__all__ = [
    "Card", "CardSpec", "CardValidationError", "LoopSpec", "cards", "loops", "nn", "samplers",
    "Engine", "Output", "Program", "Request", "Stage", "Workflow", "cache", "generate", "parity",
]
