"""The ``wan22_moe`` family: the ``wan22-moe`` card (text encoder, high- and low-noise DiT experts switched by
σ in one denoise loop, autoencoder)."""

from jaxpipe.cards import generator
from jaxpipe.cards.family import Family
from jaxpipe.cards.wan22_moe.card import EXPERTS, LOOP_ID, MODEL_ID, Config, build, spec
from jaxpipe.cards.wan22_moe.program import program

FAMILY = Family(
    name="wan22_moe",
    config=Config,
    build=build,
    programs={"t2v": program},
    model_id=MODEL_ID,
    flow=generator.TextFlow(denoiser=EXPERTS[0]),
)

__all__ = ["EXPERTS", "FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program", "spec"]
