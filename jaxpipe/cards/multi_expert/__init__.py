"""The ``multi_expert`` family: N refiner LMs, stored stacked, in front of the ``flux-t2i`` generator."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.multi_expert.card import (
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
from jaxpipe.cards.multi_expert.program import expert_major, program

FAMILY = Family(
    name="multi_expert",
    config=Config,
    build=build,
    programs={"refine_t2i": program},
    model_id=MODEL_ID,
    stacked=stacked_components,
    flow=generator.TEXT_FLOW,
)

__all__ = [
    "COMPONENT", "DENOISE_LOOP", "EXPERT_PREFIX", "FAMILY", "MODEL_ID", "REFINE_LOOP", "Config", "build", "compose",
    "expert", "expert_keys", "expert_major", "expert_names", "from_unified", "program", "slot_models", "stack",
    "stacked_components",
]
