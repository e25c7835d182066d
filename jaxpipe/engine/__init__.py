"""The engine: resident cards and workflows by id, and the scheduler that serves requests.

``engine.py`` (the ``Engine``: registry, weight versions, publish, submit / tick, run / run_many),
``scheduler.py`` (requests in flight, a tick at a time, behind the narrow ``Host`` interface),
``handle.py`` (a submitted request's ``Handle``: status, result, events), ``batch.py`` (the jitted
batch operations), ``publish.py`` (resident weights, layout checks, expert slices).
"""

from jaxpipe.engine.engine import MODES, Engine
from jaxpipe.engine.errors import EngineError, UnknownComponentError
from jaxpipe.engine.handle import Event, EventStream, Handle, Progress
from jaxpipe.engine.scheduler import MIN_WIDTH, Load, StepEvent

__all__ = [
    "Engine",
    "EngineError",
    "Event",
    "EventStream",
    "Handle",
    "Load",
    "MIN_WIDTH",
    "MODES",
    "Progress",
    "StepEvent",
    "UnknownComponentError",
]
