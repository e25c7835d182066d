"""The engine: resident cards and workflows by id, and the scheduler that serves requests.

``engine.py`` (the ``Engine``: the public facade: register, publish, submit / tick, run / run_many),
``registry.py`` (resident cards, roles, versions and workflows as a state value; publish, replace and
remove as change values applied between ticks), ``scheduler.py`` (requests in flight, a tick at a time,
reading the registry through the read-only ``Served`` protocol), ``strategies.py`` (serial, interleaved,
batched), ``work.py`` (jobs, cohorts, groups), ``features.py`` (feature-cache lookups), ``previews.py``
(decoded previews), ``handle.py`` (a submitted request's ``Handle``: status, result, events), ``batch.py``
(the jitted batch operations), ``publish.py`` (resident weights, layout checks, expert slices).
"""

from jaxpipe.engine.engine import Engine
from jaxpipe.engine.errors import EngineError, UnknownComponentError
from jaxpipe.engine.handle import Event, EventStream, Handle, Progress
from jaxpipe.engine.strategies import MODES
from jaxpipe.engine.work import MIN_WIDTH, Load, StepEvent

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
