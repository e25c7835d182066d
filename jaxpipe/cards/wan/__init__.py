"""The ``wan`` family: the real Wan 2.1 / 2.2 text-to-video and Wan 2.1 image-to-video pipelines from diffusers folders."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.wan.card import I2V_LOOP_ID, LOOP_ID, PIPELINES, Config, build, load_pipeline
from jaxpipe.cards.wan.program import i2v_program, program, program_for, tokenize

FAMILY = Family(
    name="wan",
    config=Config,
    build=build,
    programs={"t2v": program, "i2v": i2v_program},
    pipelines={name: load_pipeline for name in PIPELINES},
    program_for=program_for,
)

__all__ = [
    "FAMILY",
    "I2V_LOOP_ID",
    "LOOP_ID",
    "PIPELINES",
    "Config",
    "build",
    "load_pipeline",
    "i2v_program",
    "program",
    "program_for",
    "tokenize",
]
