"""The engine's feature cache lookups: a request's cached program nodes (text encodings, image encodings),
computed once per (card, component, weight version, content) and reused across requests.
"""

from __future__ import annotations

from typing import Any

from jaxpipe.cache import CacheKey, FeatureCache, content_hash
from jaxpipe.engine import batch as ops
from jaxpipe.engine.publish import Resident
from jaxpipe.program import Bound, config_of

__all__ = ["resolve"]


def resolve(cache: FeatureCache, resident: Resident, bound: Bound) -> dict[str, Any]:
    """The bound slots plus the outputs of the program's cached nodes, looked up in ``cache`` per request (a
    miss runs the node and stores its output, keyed by the node's component's weight version).

    Args:
      cache: the feature cache.
      resident: the card the request runs on.
      bound: the request bound to its program.

    Returns:
      Slot name -> value: every slot the program's loops start from.
    """
    slots = dict(bound.slots)
    model_id = resident.card.model_id
    for node in resident.program.cached_nodes:
        reads = {r: slots[r] for r in node.reads}
        # a node that runs a loop depends on that loop's settings too: they key its entries
        settings = ((node.loop, config_of(bound.settings, node.loop)),) if node.loop else ()
        digest = content_hash(f"{node.name}|{settings!r}" if settings else node.name, reads)
        key = CacheKey(model_id, node.component, resident.version(node.component), digest)
        value = cache.get(key)
        if value is None:
            value = ops.node(resident.program, node.name, settings, resident.treedef, resident.leaves, reads)
            cache.put(key, value)
        slots.update(value)
    return slots
