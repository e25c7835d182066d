"""The ``wan_t2v`` family: the ``wan-t2v`` text-to-video card (text encoder, DiT, autoencoder)."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.wan_t2v.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.wan_t2v.program import program

FAMILY = Family(
    name="wan_t2v", config=Config, build=build, programs={"t2v": program}, model_id=MODEL_ID, flow=generator.TEXT_FLOW
)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
