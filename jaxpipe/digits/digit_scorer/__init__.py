"""The ``digit_scorer`` family: the digits world's reward model (a CNN with digit and attribute heads)."""

from jaxpipe.cards.family import Family
from jaxpipe.digits.digit_scorer.card import COMPONENT, HEADS, LOOP_ID, MODEL_ID, Config, build, logits, predict, score
from jaxpipe.digits.digit_scorer.program import program

FAMILY = Family(name="digit_scorer", config=Config, build=build, programs={"score": program}, model_id=MODEL_ID)

__all__ = [
    "COMPONENT",
    "FAMILY",
    "HEADS",
    "LOOP_ID",
    "MODEL_ID",
    "Config",
    "build",
    "logits",
    "predict",
    "program",
    "score",
]
