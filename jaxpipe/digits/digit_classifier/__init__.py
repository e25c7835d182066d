"""The ``digit_classifier`` family: a digit classifier that shares nothing with the reward, to judge generators by."""

from jaxpipe.cards.family import Family
from jaxpipe.digits.digit_classifier.card import (
    COMPONENT,
    FAMILY_NAME,
    LOOP_ID,
    MODEL_ID,
    build,
    check_images,
    logits,
    predict,
    probabilities,
)
from jaxpipe.digits.digit_classifier.network import ClassifierNet, Config
from jaxpipe.digits.digit_classifier.program import program

FAMILY = Family(name=FAMILY_NAME, config=Config, build=build, programs={"classify": program}, model_id=MODEL_ID)

__all__ = [
    "COMPONENT",
    "FAMILY",
    "FAMILY_NAME",
    "LOOP_ID",
    "MODEL_ID",
    "ClassifierNet",
    "Config",
    "build",
    "check_images",
    "logits",
    "predict",
    "probabilities",
    "program",
]
