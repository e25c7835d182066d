"""The ``unified`` family: a refiner LM in front of the ``flux-t2i`` generator, trained jointly."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.unified.card import DENOISE_LOOP, MODEL_ID, REFINE_LOOP, Config, build, compact, eos_id, refined_ids
from jaxpipe.cards.unified.program import program

FAMILY = Family(
    name="unified", config=Config, build=build, programs={"refine_t2i": program}, model_id=MODEL_ID, flow=generator.TEXT_FLOW
)

__all__ = ["DENOISE_LOOP", "FAMILY", "MODEL_ID", "REFINE_LOOP", "Config", "build", "compact", "eos_id", "program", "refined_ids"]
