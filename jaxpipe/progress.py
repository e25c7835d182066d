"""Progress bars that work in a terminal and in a notebook kernel, with or without ipywidgets.

``tqdm.auto`` picks the widget bar in a notebook and warns (``IProgress not found``) when ipywidgets
is missing; here the widget bar is used only when ipywidgets imports, the text bar otherwise.
"""

from __future__ import annotations

from typing import Any

__all__ = ["progress_bar"]


def progress_bar(*args: Any, **kwargs: Any):
    """A ``tqdm`` bar: the notebook widget where it can be drawn, the text bar everywhere else."""
    try:
        import ipywidgets  # noqa: F401  (the widget bar needs it)
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm.std import tqdm
    return tqdm(*args, **kwargs)
