"""The ``toy_causal`` family: chunked causal text-to-video (text encoder, block-causal DiT over a chunk KV
cache, autoencoder; the ``chunk_rollout`` loop). The digits world's ``wan-causal`` is one."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.toy_causal.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.toy_causal.program import program

FAMILY = Family(name="toy_causal", config=Config, build=build, programs={"t2v": program})

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
