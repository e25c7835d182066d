"""The ``wan_i2v`` family: the ``wan-i2v`` image-to-video card (text encoder, first-frame DiT, autoencoder)."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.wan_i2v.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.wan_i2v.program import program

FAMILY = Family(
    name="wan_i2v", config=Config, build=build, programs={"i2v": program}, model_id=MODEL_ID, flow=generator.TEXT_FLOW
)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
