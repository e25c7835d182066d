"""The ``toy_sigma_moe`` family: text-to-video with high- and low-noise DiT experts switched by σ in one
denoise loop (text encoder, two DiTs, autoencoder). The digits world's ``wan22-moe`` is one."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_sigma_moe.card import EXPERTS, LOOP_ID, MODEL_ID, Config, build, spec
from jaxpipe.cards.toy_sigma_moe.program import program

FAMILY = Family(
    name="toy_sigma_moe",
    config=Config,
    build=build,
    programs={"t2v": program},
    flow=generator.TextFlow(denoiser=EXPERTS[0]),
)

__all__ = ["EXPERTS", "FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program", "spec"]
