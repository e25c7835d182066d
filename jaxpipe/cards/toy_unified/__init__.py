"""The ``toy_unified`` family: a refiner LM in front of a text-to-image generator, trained jointly. The digits
world's ``unified`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_unified.card import (
    DENOISE_LOOP,
    MODEL_ID,
    REFINE_LOOP,
    Config,
    build,
    compact,
    eos_id,
    refined_ids,
)
from jaxpipe.cards.toy_unified.program import program

FAMILY = Family(
    name="toy_unified", config=Config, build=build, programs={"refine_t2i": program}, flow=generator.TEXT_FLOW
)

__all__ = [
    "DENOISE_LOOP",
    "FAMILY",
    "MODEL_ID",
    "REFINE_LOOP",
    "Config",
    "build",
    "compact",
    "eos_id",
    "program",
    "refined_ids",
]
