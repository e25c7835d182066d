"""Flax NNX components: text encoder, diffusion transformer, autoencoder."""

from jaxpipe.nn.dit import DiT, DiTConfig
from jaxpipe.nn.text import TextEncoder, TextEncoderConfig, Tokenizer
from jaxpipe.nn.vae import Autoencoder, AutoencoderConfig

__all__ = ["Autoencoder", "AutoencoderConfig", "DiT", "DiTConfig", "TextEncoder", "TextEncoderConfig", "Tokenizer"]
