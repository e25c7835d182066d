"""The programs of the bundled card families (the program layer: cards below, the engine above).

``default_program(card)`` is what ``Engine.register(card)`` serves a card with when no program
is given: its family's program, or the generic reward program for a card whose recipe is a
single ``score`` loop.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxpipe.card import Card
from jaxpipe.program import Program, ProgramError, score_program
from jaxpipe.programs import flux_t2i, multi_expert, unified, wan_i2v

PROGRAMS: dict[str, Callable[[], Program]] = {
    "flux_t2i": flux_t2i.program,
    "multi_expert": multi_expert.program,
    "unified": unified.program,
    "wan_i2v": wan_i2v.program,
    "digit_scorer": score_program,
}
"""Card family -> its program."""


def default_program(card: Card) -> Program:
    """The program a card is served with by default (``ProgramError`` if its family has none)."""
    if card.spec.family in PROGRAMS:
        return PROGRAMS[card.spec.family]()
    if {card.spec.loop(loop_id).kind for loop_id in card.spec.recipe} == {"score"}:
        return score_program()
    raise ProgramError(
        f"card {card.model_id!r} (family {card.spec.family!r}) has no default program; pass one: register(card, program)"
    )


__all__ = ["PROGRAMS", "default_program", "flux_t2i", "multi_expert", "unified", "wan_i2v"]
