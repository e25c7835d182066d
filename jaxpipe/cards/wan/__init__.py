"""The ``wan`` family: the real Wan 2.1 / 2.2 text-to-video pipeline from a diffusers folder."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.wan.card import LOOP_ID, PIPELINES, Config, build, load_pipeline
from jaxpipe.cards.wan.program import program, tokenize

FAMILY = Family(name="wan", config=Config, build=build, programs={"t2v": program},
                pipelines={name: load_pipeline for name in PIPELINES})

__all__ = ["FAMILY", "LOOP_ID", "PIPELINES", "Config", "build", "load_pipeline", "program", "tokenize"]
