"""The ``wan_causal`` family: the ``wan-causal`` chunked autoregressive video card (text encoder,
block-causal DiT with a chunk KV cache, autoencoder; the ``chunk_rollout`` loop)."""

from jaxpipe.cards.family import Family
from jaxpipe.cards.wan_causal.card import LOOP_ID, MODEL_ID, Config, build
from jaxpipe.cards.wan_causal.program import program

FAMILY = Family(name="wan_causal", config=Config, build=build, programs={"t2v": program}, model_id=MODEL_ID)

__all__ = ["FAMILY", "LOOP_ID", "MODEL_ID", "Config", "build", "program"]
