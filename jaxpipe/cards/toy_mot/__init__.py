"""The ``toy_mot`` family: one Mixture-of-Transformers that thinks, generates images and understands them.
The digits world's ``bagel-mot`` is one."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_mot.card import IMAGE_LOOP, MODEL_ID, THINK_LOOP, UNDERSTAND_LOOP, Config, build, eos_id
from jaxpipe.cards.toy_mot.program import think_t2i, understand

FAMILY = Family(name="toy_mot", config=Config, build=build, programs={"think_t2i": think_t2i, "understand": understand})

__all__ = [
    "FAMILY",
    "IMAGE_LOOP",
    "MODEL_ID",
    "THINK_LOOP",
    "UNDERSTAND_LOOP",
    "Config",
    "build",
    "eos_id",
    "think_t2i",
    "understand",
]
