"""Loops: pure step functions plus fused ``lax.scan`` runners, each with its engine driver.

``registry.KINDS`` is the one table of loop kinds; ``policies`` holds the small pure pieces a
denoise loop composes (guidance, SDE window, expert routing).
"""

from jaxpipe.loops import ar, denoise, policies, registry

__all__ = ["ar", "denoise", "policies", "registry"]
