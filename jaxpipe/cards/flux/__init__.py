"""The ``flux`` family: the real FLUX.1 pipeline from a diffusers folder (``jp.cards.load("FLUX.1-dev/")``)."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.flux.card import LOOP_ID, PIPELINES, Config, Sampling, Tokenizers, build, load_pipeline
from jaxpipe.cards.flux.program import program, split_ids

FAMILY = Family(
    name="flux",
    config=Config,
    build=build,
    programs={"t2i": program},
    pipelines={name: load_pipeline for name in PIPELINES},
)

__all__ = [
    "FAMILY",
    "LOOP_ID",
    "PIPELINES",
    "Config",
    "Sampling",
    "Tokenizers",
    "build",
    "load_pipeline",
    "program",
    "split_ids",
]
