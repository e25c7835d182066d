"""The ``toy_two_stage`` family: two-stage text-to-video (text encoder, one DiT on two loops, latent upsampler,
autoencoder). The digits world's ``ltx2-two-stage`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_two_stage.card import BASE_LOOP, MODEL_ID, RATIO, REFINE_LOOP, Config, build, pool_latents
from jaxpipe.cards.toy_two_stage.program import program

FAMILY = Family(name="toy_two_stage", config=Config, build=build, programs={"t2v": program}, flow=generator.TEXT_FLOW)

__all__ = ["FAMILY", "BASE_LOOP", "MODEL_ID", "RATIO", "REFINE_LOOP", "Config", "build", "pool_latents", "program"]
