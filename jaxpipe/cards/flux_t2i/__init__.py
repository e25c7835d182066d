"""The ``flux_t2i`` family: the ``flux-t2i`` text-to-image card (text encoder, DiT, autoencoder)."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.flux_t2i.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.flux_t2i.program import program

FAMILY = Family(
    name="flux_t2i", config=Config, build=build, programs={"t2i": program}, model_id=MODEL_ID, flow=generator.TEXT_FLOW
)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
