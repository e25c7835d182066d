"""Loops: pure step functions plus fused ``lax.scan`` runners."""

from jaxpipe.loops import denoise

__all__ = ["denoise"]
