"""The ``toy_i2v`` family: image-to-video (text encoder, first-frame DiT, autoencoder). The digits world's ``wan-i2v`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_i2v.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.toy_i2v.program import program

FAMILY = Family(name="toy_i2v", config=Config, build=build, programs={"i2v": program}, flow=generator.TEXT_FLOW)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
