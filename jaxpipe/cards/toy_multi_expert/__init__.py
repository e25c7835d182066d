"""The ``toy_multi_expert`` family: N refiner LMs, stored stacked, in front of a text-to-image generator.
The digits world's ``multi-expert`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_multi_expert.card import (
    COMPONENT,
    DENOISE_LOOP,
    EXPERT_PREFIX,
    MODEL_ID,
    REFINE_LOOP,
    Config,
    build,
    compose,
    expert,
    expert_keys,
    expert_names,
    from_unified,
    slot_models,
    stack,
    stacked_components,
)
from jaxpipe.cards.toy_multi_expert.program import expert_major, program

FAMILY = Family(
    name="toy_multi_expert",
    config=Config,
    build=build,
    programs={"refine_t2i": program},
    stacked=stacked_components,
    flow=generator.TEXT_FLOW,
)

__all__ = [
    "COMPONENT",
    "DENOISE_LOOP",
    "EXPERT_PREFIX",
    "FAMILY",
    "MODEL_ID",
    "REFINE_LOOP",
    "Config",
    "build",
    "compose",
    "expert",
    "expert_keys",
    "expert_major",
    "expert_names",
    "from_unified",
    "program",
    "slot_models",
    "stack",
    "stacked_components",
]
