"""Prompts as data: a batch that crosses ``jax.jit`` (``Prompts``) and the set it is drawn from (``PromptSet``).

An RL step renders K samples per prompt inside one jitted function, so its prompts travel as
arrays: ``Prompts`` holds a batch of P prompts as the card's token ids ``(P, L)`` int32, the
prompts' UTF-8 bytes ``(P, W)`` uint8 (zero-padded, so host code recovers the exact strings) and
optional numeric ``metadata`` ``{name: (P, ...)}`` (a world's labels, a target score ...).

A ``PromptSet`` is the user's N prompts (``read("prompts.txt")``, ``.jsonl`` with metadata, or a
list), split into train / held-out parts and cut into endless batches of fixed shape::

    train, heldout = prompts.read("prompts.jsonl").split(0.1, seed=0)
    for batch in train.batches(card, prompts_per_step=8, seed=0):   # Prompts, P = 8 rows
        state, metrics = step(state, batch.repeat(K))               # B = 8·K rows, one compile

``tokenize`` gives the ids the card's own serving path gives (its default program's ``bind``), so
the vocabulary and length checks a card serves with apply to training prompts too.
"""

from jaxpipe.prompts.batch import Prompts, check, tokenize
from jaxpipe.prompts.sets import PromptSet, load, read
from jaxpipe.prompts.text import WIDTH_MULTIPLE, decode_text, encode_text, text_width

__all__ = [
    "Prompts",
    "PromptSet",
    "check",
    "encode_text",
    "decode_text",
    "text_width",
    "tokenize",
    "read",
    "load",
    "WIDTH_MULTIPLE",
]
