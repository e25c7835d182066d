"""JAX's persistent compilation cache, on by default for the ``jaxpipe`` command and the test suite.

Compiling dominates a fresh process here (a ``jaxpipe generate`` spends most of its seconds in
XLA); with the cache, a second process loads the compiled executables from disk instead. The
default folder is per user and per jax/jaxlib version (an executable compiled by one jaxlib is
never loaded by another, so each version's entries live, and can be removed, together). The folder
can be deleted at any time; it is not bounded in size (JAX's bound rescans the whole folder at every
write, which costs more than it saves here): the whole test suite fills about 150 MB.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jaxlib

__all__ = ["cache_dir", "enable_cache"]


def cache_dir() -> Path:
    """Where compiled executables go: ``$JAXPIPE_CACHE_DIR`` if set, else
    ``jaxpipe/xla/jax-<version>-jaxlib-<version>`` under the user's cache directory (``$XDG_CACHE_HOME``,
    default ``~/.cache``)."""
    if os.environ.get("JAXPIPE_CACHE_DIR"):
        return Path(os.environ["JAXPIPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxpipe" / "xla" / f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}"


def enable_cache(directory: str | os.PathLike | None = None) -> Path:
    """Turn on JAX's persistent compilation cache in ``directory``.

    Every compilation is cached (no minimum compile time: on a CPU most of jaxpipe's take well under
    a second each, and there are hundreds). Call it before the first ``jit`` call.

    Args:
      directory: the cache folder, created if missing (default ``cache_dir()``).

    Returns:
      The cache folder.
    """
    path = Path(directory) if directory is not None else cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
