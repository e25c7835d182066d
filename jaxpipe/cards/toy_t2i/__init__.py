"""The ``toy_t2i`` family: text-to-image (text encoder, DiT, autoencoder). The digits world's ``flux-t2i`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_t2i.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.toy_t2i.program import program

FAMILY = Family(name="toy_t2i", config=Config, build=build, programs={"t2i": program}, flow=generator.TEXT_FLOW)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
