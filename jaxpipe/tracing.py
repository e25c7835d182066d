"""Tracing without JAX's quadratic attribute probes: ``Tracer.sharding`` / ``Tracer.device`` made cheap.

A JAX tracer has no ``sharding`` or ``device``; asking raises ``AttributeError`` so that ``getattr(x, "sharding",
None)`` works. Up to at least jax 0.10.2 the error's message also names the traced operations the value came from,
found by walking every equation traced so far (jax-ml/jax#40041 removes that part). Flax NNX probes
``value.sharding`` on every ``Variable`` assignment, each RNG draw included, so building a network under
``nnx.eval_shape`` (how every checkpoint and real-size card is built) costs time quadratic in its size: Wan 2.1
1.3B took 33 s here, 1.5 s without it; the 14B image-to-video card over 5 minutes.

``install()`` replaces the two properties with ones whose message leaves the walk out, once per process and only
where JAX still walks; every module that builds or traces networks calls it on import (``jaxpipe.card``, which they
all import). Errors that stop a program (``ConcretizationTypeError``) keep their full message.
"""

from __future__ import annotations

import inspect

from jax._src import core

__all__ = ["install"]


def _cheap(name: str) -> property:
    def probe(self):
        raise AttributeError(f"The {name!r} attribute is not available on {self._error_repr()}.")

    probe.__name__ = name
    return property(probe)


def install() -> bool:
    """Make ``Tracer.sharding`` and ``Tracer.device`` probes cheap (idempotent).

    Returns:
      Whether the properties were replaced now (``False``: already done, or this JAX no longer walks the trace).
    """
    changed = False
    for name in ("sharding", "device"):
        current = getattr(core.Tracer, name, None)
        if isinstance(current, property) and "_origin_msg" in inspect.getsource(current.fget):
            setattr(core.Tracer, name, _cheap(name))
            changed = True
    return changed


install()
