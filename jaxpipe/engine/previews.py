"""Decoded previews of a request's loop latents (``Engine.submit(..., previews=True)``).

A program decodes a loop by itself when some node after the loop reads only the loop's result and
writes an image or video; ``Previews.decode`` runs that node on one request's latents (best effort:
a failure gives no image, the request goes on).
"""

from __future__ import annotations

import numpy as np

from jaxpipe.engine import batch as ops
from jaxpipe.engine.publish import Resident
from jaxpipe.program import ComponentNode, LoopNode, Program

__all__ = ["Previews", "decoder_of"]


class Previews:
    """Decodes preview latents per (program, loop), finding each program's decoder once."""

    def __init__(self):
        self._decoders: dict = {}

    def decode(self, resident: Resident, loop: str, latents: np.ndarray):
        """``latents`` decoded by the program's own decoder of ``loop``'s result, else ``None``.

        Args:
          resident: the card the request runs on.
          loop: the loop id.
          latents: one request's latents ``(*latent_shape)``.

        Returns:
          The image ``(H, W, C)`` / video ``(T, H, W, C)`` clipped to [0, 1], or ``None``.
        """
        program = resident.program
        key = (id(program), loop)
        if key not in self._decoders:
            self._decoders[key] = decoder_of(program, loop)
        found = self._decoders[key]
        if found is None:
            return None
        name, slot, output = found
        try:
            out = ops.node(program, name, (), resident.treedef, resident.leaves, {slot: latents[None]})
        except Exception:  # noqa: BLE001 - a preview is best effort: the request itself goes on
            return None
        return np.clip(np.asarray(out[output][0]), 0.0, 1.0)


def decoder_of(program: Program, loop: str) -> tuple[str, str, str] | None:
    """``(node name, slot, output)`` of the node decoding ``loop``'s result into an image / video, or ``None``.

    Args:
      program: the program.
      loop: the loop id.

    Returns:
      The decoder, or ``None`` when the program has none.
    """
    nodes = list(program.nodes)
    at = next((i for i, n in enumerate(nodes) if isinstance(n, LoopNode) and n.loop == loop), None)
    if at is None:
        return None
    written = tuple(nodes[at].writes)
    for node in nodes[at + 1 :]:
        if not isinstance(node, ComponentNode) or node.loop is not None:
            continue
        out = next((w for w in node.writes if w in ("image", "video")), None)
        if out is not None and tuple(node.reads) == written:
            return node.name, written[0], out
    return None
