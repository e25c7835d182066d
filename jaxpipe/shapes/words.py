"""The words of the shapes world: shapes, colours (and the RGB each is drawn in), sizes, counts, relations, motions."""

__all__ = [
    "SHAPES",
    "PLURALS",
    "COLOURS",
    "PALETTE",
    "BACKGROUND",
    "SIZES",
    "COUNTS",
    "RELATIONS",
    "MOTIONS",
    "VOCABULARY",
]

SHAPES = ("circle", "square", "triangle")
"""The shape names; shape ``s`` is ``SHAPES[s]``."""
PLURALS = tuple(f"{shape}s" for shape in SHAPES)
"""The plural of each shape (counting prompts: ``"three green circles"``)."""
COLOURS = ("red", "green", "blue", "yellow", "purple", "cyan")
"""The colour names; colour ``c`` is drawn in ``PALETTE[c]``."""
PALETTE = (
    (0.92, 0.12, 0.12),  # red
    (0.10, 0.78, 0.15),  # green
    (0.12, 0.25, 0.95),  # blue
    (0.95, 0.88, 0.10),  # yellow
    (0.72, 0.15, 0.88),  # purple
    (0.10, 0.85, 0.88),  # cyan
)
"""RGB in [0, 1] of each colour, at least 0.6 apart from each other and from the background."""
BACKGROUND = (0.08, 0.08, 0.10)
"""RGB in [0, 1] of the empty canvas."""
SIZES = ("small", "big")
"""The size words; an object's half-extent is ``RADIUS[size]`` of the canvas side (``scenes``)."""
COUNTS = ("two", "three", "four")
"""The count words of counting prompts (2, 3, 4 objects)."""
RELATIONS = ("left", "right", "above", "below")
"""The spatial relations: ``"A left of B"``, ``"A right of B"``, ``"A above B"``, ``"A below B"``."""
MOTIONS = ("left", "right", "up", "down", "still")
"""The motions of a video's objects: ``"a red circle moving right"`` (``still``: ``"a red circle still"``)."""

VOCABULARY: tuple[str, ...] = tuple(
    dict.fromkeys(("a", "and", "of", "moving") + SHAPES + PLURALS + COLOURS + SIZES + COUNTS + RELATIONS + MOTIONS)
)
"""Every word of the shapes world, once each."""
