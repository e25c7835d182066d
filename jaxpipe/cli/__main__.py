"""``python -m jaxpipe.cli``: the ``jaxpipe`` command."""

from jaxpipe.cli import main

main()
