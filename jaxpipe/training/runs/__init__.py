"""Training runs: ``execute`` trains a ``Run`` and writes its metrics, curves, report and trained card.

A ``Run`` bundles a trainer, an endless stream of batches, a before/after evaluation and the
curves to draw. Worlds build them for their cards (``jaxpipe.digits.runs``: what ``jaxpipe train``
runs); the run loop itself is world-free.
"""

from jaxpipe.training.runs.reports import DIVERSITY_COLLAPSE, OUTPUTS, TIMING, execute, finished, summary_lines
from jaxpipe.training.runs.run import Run

__all__ = ["DIVERSITY_COLLAPSE", "OUTPUTS", "Run", "TIMING", "execute", "finished", "summary_lines"]
