"""The ``ltx2_two_stage`` family: the ``ltx2-two-stage`` card (text encoder, one DiT on two loops, latent
upsampler, autoencoder)."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.ltx2_two_stage.card import BASE_LOOP, MODEL_ID, RATIO, REFINE_LOOP, Config, build, pool_latents
from jaxpipe.cards.ltx2_two_stage.program import program

FAMILY = Family(
    name="ltx2_two_stage", config=Config, build=build, programs={"t2v": program}, model_id=MODEL_ID, flow=generator.TEXT_FLOW
)

__all__ = ["FAMILY", "BASE_LOOP", "MODEL_ID", "RATIO", "REFINE_LOOP", "Config", "build", "pool_latents", "program"]
