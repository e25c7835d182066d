"""The ``toy_mot_video`` family: one shared-weights MoT reasons about the prompt, then denoises a video.
The digits world's ``cosmos3`` is one."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_mot_video.card import MODEL_ID, OPTIONAL, REASON_LOOP, VIDEO_LOOP, Config, build, eos_id
from jaxpipe.cards.toy_mot_video.program import reason_t2v

FAMILY = Family(name="toy_mot_video", config=Config, build=build, programs={"reason_t2v": reason_t2v})

__all__ = ["FAMILY", "MODEL_ID", "OPTIONAL", "REASON_LOOP", "VIDEO_LOOP", "Config", "build", "eos_id", "reason_t2v"]
