"""Loops: pure step functions plus fused ``lax.scan`` runners."""

from jaxpipe.loops import ar, denoise

__all__ = ["ar", "denoise"]
