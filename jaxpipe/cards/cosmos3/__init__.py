"""The ``cosmos3`` family: one shared-weights MoT reasons about the prompt, then denoises a video."""

from jaxpipe.cards.cosmos3.card import MODEL_ID, OPTIONAL, REASON_LOOP, VIDEO_LOOP, Config, build, eos_id
from jaxpipe.cards.cosmos3.program import reason_t2v
from jaxpipe.cards.family import Family

FAMILY = Family(name="cosmos3", config=Config, build=build, programs={"reason_t2v": reason_t2v}, model_id=MODEL_ID)

__all__ = ["FAMILY", "MODEL_ID", "OPTIONAL", "REASON_LOOP", "VIDEO_LOOP", "Config", "build", "eos_id", "reason_t2v"]
