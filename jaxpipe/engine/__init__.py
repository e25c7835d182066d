"""The engine: resident cards and workflows by id, and the scheduler that serves requests.

``engine.py`` (the ``Engine``: registry, weight versions, publish, run / run_many),
``scheduler.py`` (one ``run_many`` call, behind the narrow ``Host`` interface), ``batch.py`` (the
jitted batch operations), ``publish.py`` (resident weights, layout checks, expert slices).
"""

from jaxpipe.engine.engine import MODES, Engine
from jaxpipe.engine.errors import EngineError, UnknownComponentError
from jaxpipe.engine.scheduler import MIN_WIDTH, StepEvent

__all__ = ["Engine", "EngineError", "MIN_WIDTH", "MODES", "StepEvent", "UnknownComponentError"]
