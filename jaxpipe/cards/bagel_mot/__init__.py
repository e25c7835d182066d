"""The ``bagel_mot`` family: one Mixture-of-Transformers that thinks, generates images and understands them."""

from jaxpipe.cards.bagel_mot.card import IMAGE_LOOP, MODEL_ID, THINK_LOOP, UNDERSTAND_LOOP, Config, build, eos_id
from jaxpipe.cards.bagel_mot.program import think_t2i, understand
from jaxpipe.cards.family import Family

FAMILY = Family(
    name="bagel_mot", config=Config, build=build, programs={"think_t2i": think_t2i, "understand": understand}, model_id=MODEL_ID
)

__all__ = ["FAMILY", "IMAGE_LOOP", "MODEL_ID", "THINK_LOOP", "UNDERSTAND_LOOP", "Config", "build", "eos_id", "think_t2i", "understand"]
