"""The ``toy_t2v`` family: text-to-video on one DiT (text encoder, DiT, autoencoder). The digits world's ``wan-t2v`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_t2v.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.toy_t2v.program import program

FAMILY = Family(name="toy_t2v", config=Config, build=build, programs={"t2v": program}, flow=generator.TEXT_FLOW)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
