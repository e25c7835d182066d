"""Flax NNX components: text encoder, diffusion transformer, autoencoder, digit scorer."""

from jaxpipe.nn.dit import DiT, DiTCond, DiTConfig
from jaxpipe.nn.lm import KVCache, LMConfig, MaskedLM, RefinerLM
from jaxpipe.nn.reward import DigitScorer, ScorerConfig
from jaxpipe.nn.text import TextEncoder, TextEncoderConfig, Tokenizer
from jaxpipe.nn.vae import Autoencoder, AutoencoderConfig

__all__ = ["Autoencoder", "AutoencoderConfig", "DiT", "DiTCond", "DiTConfig", "DigitScorer", "KVCache", "LMConfig", "MaskedLM", "RefinerLM", "ScorerConfig", "TextEncoder", "TextEncoderConfig", "Tokenizer"]
