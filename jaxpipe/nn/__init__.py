"""Flax NNX components: jaxpipe's own small networks (word tokenizer and text encoder, DiT, autoencoder,
refiner LMs, MoT, latent upsampler) and the real ones, named like their diffusers / transformers references and loaded from their
folders (``flux``, ``wan``, ``autoencoder_kl``, ``wan_vae``, ``t5``, ``clip``; ``hf`` reads the folders,
``tokenizer`` the tokenizers); ``lora`` adds LoRA adapters to any of them, in peft's and diffusers' files."""

from jaxpipe import tracing  # noqa: F401  (cheap tracer probes before any network is built or traced)
from jaxpipe.nn import autoencoder_kl, clip, flux, hf, lora, t5, tokenizer, wan, wan_vae
from jaxpipe.nn.dit import DiT, DiTCond, DiTConfig
from jaxpipe.nn.lm import KVCache, LMConfig, MaskedLM, RefinerLM
from jaxpipe.nn.text import TextEncoder, TextEncoderConfig, Tokenizer
from jaxpipe.nn.upsampler import LatentUpsampler, LatentUpsamplerConfig
from jaxpipe.nn.vae import Autoencoder, AutoencoderConfig

__all__ = [
    "autoencoder_kl",
    "clip",
    "flux",
    "hf",
    "lora",
    "t5",
    "tokenizer",
    "wan",
    "wan_vae",
    "Autoencoder",
    "AutoencoderConfig",
    "DiT",
    "DiTCond",
    "DiTConfig",
    "KVCache",
    "LatentUpsampler",
    "LatentUpsamplerConfig",
    "LMConfig",
    "MaskedLM",
    "RefinerLM",
    "TextEncoder",
    "TextEncoderConfig",
    "Tokenizer",
]
