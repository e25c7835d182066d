"""Warm-up: compile a server's batched steps before it listens, so a first burst of requests does not wait on XLA.

The engine compiles one batched step per group layout and batch capacity (``engine.batch.bucket``: 1, 2, 3, 4, 6,
8, ...); a burst that reaches a capacity no earlier call used compiles it first, which on a CPU takes longer than
the steps themselves. ``warm(engine, rows)`` runs, for every served card that renders from a prompt alone, one
batch of each capacity up to ``rows`` at the card's own settings, with a progress bar. Compiled executables also
persist in JAX's compilation cache (``jaxpipe.compilation``), so a second start reads them from disk.
"""

from __future__ import annotations

from jaxpipe.card import Card
from jaxpipe.cards import registry
from jaxpipe.engine.batch import bucket
from jaxpipe.program import Program
from jaxpipe.progress import progress_bar
from jaxpipe.request import Request

__all__ = ["capacities", "warm", "warm_prompt"]


def warm_prompt(card: Card, program: Program | None = None) -> str | None:
    """A prompt ``card`` renders from alone (its first vocabulary word, or plain words for a real tokenizer), or
    ``None`` when the program it is served with needs more than a prompt (an image) or it makes no image or video.

    Args:
      card: a resident card.
      program: the program it is served with (``None``: its family's default), e.g. ``engine.program(model_id)``:
        ``bagel-mot:understand`` is ``bagel-mot``'s card served with a program that reads an image.

    Returns:
      The prompt, or ``None``.
    """
    program = registry.default_program(card) if program is None else program
    if "image" in program.inputs or not {"t2i", "t2v"} & set(card.spec.capabilities):
        return None
    words = getattr(card.spec.tokenizer, "words", None)
    return words[2] if words is not None and len(words) > 2 else "a photo"


def capacities(rows: int, max_batch: int) -> list[int]:
    """The batch capacities a burst of up to ``rows`` requests of one card can use.

    Args:
      rows: the largest burst to warm.
      max_batch: the engine's ``max_batch``.

    Returns:
      The distinct capacities, ascending.
    """
    return sorted({min(max_batch, bucket(k)) for k in range(1, max(rows, 0) + 1)})


def warm(engine, rows: int, *, progress: bool = True, should_stop=None) -> list[tuple[str, int]]:
    """Compile the batched step of every served prompt-only card at each capacity up to ``rows`` by serving one burst
    of each size through the live path (``submit`` then ``tick``, as the server's front does; seeds
    ``0..capacity-1``, the card's default steps and guidance).

    Args:
      engine: the engine, before it serves (nothing else may be submitted to it or tick it meanwhile).
      rows: the largest burst to warm (0: nothing).
      progress: show a progress bar.
      should_stop: polled between batches; once it returns True the warm-up ends where it is.

    Returns:
      The ``(model id, capacity)`` pairs run, in order.
    """
    if engine.mode != "batched":  # one request per step: the single-row step is all there is to compile
        rows = min(rows, 1)
    plan = []
    for model_id in engine.cards():
        prompt = warm_prompt(engine.card(model_id), engine.program(model_id))
        if prompt is not None:
            plan += [(model_id, prompt, c) for c in capacities(rows, engine.max_batch)]
    done = []
    with progress_bar(total=len(plan), desc="jaxpipe serve: warming batches", disable=not progress) as shown:
        for model_id, prompt, capacity in plan:
            if should_stop is not None and should_stop():
                break
            shown.set_postfix_str(f"{model_id} × {capacity}")
            # through the live path a server ticks (one step per tick, requests joining as they come), which
            # compiles other executables than ``run_many``'s fused calls
            handles = [engine.submit(Request(model_id, prompt=prompt, seed=i)) for i in range(capacity)]
            while engine.tick():
                pass
            for handle in handles:
                handle.result()  # a failure says so now, not at the first user's request
            shown.update()
            done.append((model_id, capacity))
    return done
