"""The ``jaxpipe`` command line: ``main`` is the console script (``python -m jaxpipe.cli`` runs it too).

The commands live in ``jaxpipe.cli.commands`` (``app``, the typer application; ``train``, ``serve`` and the shared
flags beside it). This package imports nothing heavy: ``main`` installs the stop handler first, so a Ctrl-C from
the command's first moment — while typer and JAX load — is a clean stop (exit 130, nothing written), then loads
the commands and runs them.
"""

from __future__ import annotations

__all__ = ["app", "main"]


def main() -> None:
    """Run the ``jaxpipe`` command, its stop handler installed before anything heavy loads."""
    from jaxpipe.stopping import Stopper

    stop = Stopper().__enter__()
    from jaxpipe.cli.commands import run

    run(stop)


def __getattr__(name: str):
    if name == "app":  # ``from jaxpipe.cli import app``: the typer application, loaded on first use
        from jaxpipe.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
