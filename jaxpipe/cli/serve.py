"""``jaxpipe serve``: the OpenAI-compatible HTTP server (``jaxpipe.serve``) over an engine of the given cards.

    jaxpipe serve                                        # every bundled card and workflow on 127.0.0.1:8000
    jaxpipe serve --model flux-t2i --model wan-i2v       # two cards (and the bundled workflows they complete)
    jaxpipe serve --model ./my-card --port 9000 --max-rows 16 --max-memory-gb 8 --grace 60
    jaxpipe serve --reward digit-scorer --reward clipscore:DIR   # reward models for POST /v1/rewards

SIGTERM (or Ctrl-C) drains: new requests get 503, the running ones get ``--grace`` seconds, then it
exits 0. It needs the ``serve`` extra (``pip install "jaxpipe[serve]"``).
"""

from __future__ import annotations

import importlib.util
import math
import signal

import typer

from jaxpipe.cli.common import fail, load

__all__ = ["serve"]

_EXTRA = ("fastapi", "uvicorn", "prometheus_client", "multipart")
_MODES = ("batched", "serial", "interleaved")


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default: nothing outside this machine)."),
    port: int = typer.Option(8000, help="Port to bind."),
    model: list[str] = typer.Option(
        [],
        "--model",
        show_default="every bundled card and workflow",
        help=(
            "A card to serve: a bundled id (`jaxpipe cards`), a card directory, or a bundled workflow id "
            "(image_video.t2i_i2v). Repeatable. The bundled workflows whose cards are all served are served too."
        ),
    ),
    reward: list[str] = typer.Option(
        [],
        "--reward",
        help=(
            "A reward model for POST /v1/rewards (a reward spec: digit-scorer, clipscore:DIR, a URL ...). Repeatable."
        ),
    ),
    mode: str = typer.Option(
        "batched",
        help="How requests step: batched (rows of compatible requests step together), "
        "serial (one at a time, bit for bit as offline) or interleaved.",
    ),
    max_rows: int = typer.Option(64, "--max-rows", help="Rows (requests, or images of one call) stepping at once."),
    max_queued: int = typer.Option(256, "--max-queued", help="Rows admitted beyond --max-rows; past it: 429 busy."),
    max_memory_gb: float | None = typer.Option(
        None,
        "--max-memory-gb",
        show_default="no limit",
        help="Memory budget of the requests in flight (estimated from shapes).",
    ),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", help="How long work arriving at an idle server waits for more to fill its first batch."
    ),
    grace: float = typer.Option(30.0, "--grace", help="Seconds the running requests get to finish after SIGTERM."),
    warm: int = typer.Option(
        0,
        "--warm",
        help="Compile every prompt-only card's batched step for bursts of up to this many requests before listening "
        "(a progress bar; the compiled steps also persist in the compilation cache for the next start). 0: off, "
        "and the first burst at each new batch size compiles.",
    ),
) -> None:
    """Serve cards over an OpenAI-compatible HTTP API: images, video jobs, chat, rewards, /v1/models, /metrics.

    SIGTERM (or Ctrl-C) drains: new requests get 503, the running ones get --grace seconds, then it exits 0.
    \f
    Args:
      host: the address to bind.
      port: the port to bind.
      model: the cards (ids or directories) and bundled workflow ids to serve; empty: every bundled one.
      reward: reward specs served by ``POST /v1/rewards`` besides the built-in ones.
      mode: the engine's mode (``batched``, ``serial``, ``interleaved``).
      max_rows: ``Budget.max_rows`` and the engine's ``max_batch``.
      max_queued: ``Budget.max_queued``.
      max_memory_gb: ``Budget.max_memory_bytes`` in GiB (``None``: no limit).
      max_wait_ms: ``Budget.max_wait_ms``.
      grace: seconds the admitted work gets after SIGTERM.
      warm: compile the batched steps of bursts up to this many rows before listening (0: off).

    Raises:
      typer.Exit: code 2 (``fail``) for a bad flag or an unusable card; else the server's exit status.
    """
    missing = [name for name in _EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        fail(f'jaxpipe serve needs the serve extra ({", ".join(missing)} missing): pip install "jaxpipe[serve]"')
    budget = _budget(port, mode, max_rows, max_queued, max_memory_gb, max_wait_ms, grace)
    if warm < 0:
        fail(f"--warm must be a number of rows >= 0 (got {warm})")

    from jaxpipe.stopping import Stopper

    with Stopper() as stop:  # loading cards takes a while: a signal now is a clean stop, not a traceback
        engine = _engine(model, mode, max_rows)
        from jaxpipe.serve.chat import register_text_programs

        register_text_programs(engine)  # bagel-mot:understand and the like, next to their cards
        rewards = _rewards(reward, engine)
        if warm and not stop():
            from jaxpipe.serve.warmup import warm as warm_batches

            warm_batches(engine, min(warm, max_rows), should_stop=stop)
        from jaxpipe.serve.app import create_app
        from jaxpipe.serve.front import Front
        from jaxpipe.serve.server import run

        front = Front(engine, budget)
        app = create_app(front, rewards=rewards)
    if stop():
        from jaxpipe.stopping import exit_code

        front.close()
        typer.echo(f"stopped ({signal.Signals(stop.signum).name}) while starting: nothing served", err=True)
        raise typer.Exit(code=exit_code(stop.signum))

    def ready(url: str) -> None:
        typer.echo(
            f"jaxpipe serve: {len(engine.models())} models on {url} (mode {mode}; OpenAI base URL {url}/v1)", err=True
        )

    raise typer.Exit(code=run(app, front, host=host, port=port, grace_s=grace, on_ready=ready))


def _budget(
    port: int, mode: str, max_rows: int, max_queued: int, max_memory_gb: float | None, max_wait_ms: float, grace: float
):
    """The ``Budget`` of the flags, or one error line naming the bad flag."""
    if not 0 <= port <= 65535:
        fail(f"--port must be in [0, 65535] (got {port})")
    if mode not in _MODES:
        fail(f"--mode must be one of {', '.join(_MODES)} (got {mode!r})")
    if max_rows < 1:
        fail(f"--max-rows must be a positive integer (got {max_rows})")
    if max_queued < 0:
        fail(f"--max-queued must be an integer >= 0 (got {max_queued})")
    if max_memory_gb is not None and not (math.isfinite(max_memory_gb) and max_memory_gb > 0):
        fail(f"--max-memory-gb must be a positive number (got {max_memory_gb})")
    if not (math.isfinite(max_wait_ms) and max_wait_ms >= 0):
        fail(f"--max-wait-ms must be a finite number >= 0 (got {max_wait_ms})")
    if not (math.isfinite(grace) and grace >= 0):
        fail(f"--grace must be a finite number of seconds >= 0 (got {grace})")
    from jaxpipe.serve.front import Budget

    memory = None if max_memory_gb is None else int(max_memory_gb * 2**30)
    return Budget(max_rows=max_rows, max_queued=max_queued, max_memory_bytes=memory, max_wait_ms=max_wait_ms)


def _engine(models: list[str], mode: str, max_rows: int):
    """An engine serving ``models`` (default: every bundled card and workflow), batching up to ``max_rows`` rows."""
    from jaxpipe import cards
    from jaxpipe import workflow as workflows
    from jaxpipe.engine import Engine
    from jaxpipe.progress import progress_bar

    bundled = {wf.id: wf for wf in workflows.bundled()}
    card_names = list(dict.fromkeys(m for m in models if m not in bundled)) if models else list(cards.available())
    asked = [m for m in dict.fromkeys(models) if m in bundled]
    engine = Engine(mode=mode, max_batch=max_rows)
    with progress_bar(total=len(card_names), desc="jaxpipe serve: loading cards", unit="card") as shown:
        for name in card_names:  # one at a time, so a long start says where it is
            shown.set_postfix_str(name)
            (card,) = load(name)
            if engine.serves(card.model_id):
                fail(f"--model {card.model_id!r} is given twice (two directories of one card id?)")
            engine.register(card)
            shown.update()
    pending = list(bundled.values())
    while pending:  # a workflow may require another workflow: register in dependency order
        ready = [wf for wf in pending if all(engine.serves(m) for m in wf.requires)]
        if not ready:
            break
        for wf in ready:
            engine.register_workflow(wf)
            pending.remove(wf)
    for wf_id in asked:
        if not engine.serves(wf_id):
            needs = [m for m in bundled[wf_id].requires if not engine.serves(m)]
            fail(f"--model {wf_id!r} is a workflow over {list(bundled[wf_id].requires)}: add --model for {needs}")
    return engine


def _rewards(specs: list[str], engine):
    """The reward models for ``POST /v1/rewards``: the built-in ones plus the ``--reward`` specs, or one error
    line naming the bad spec."""
    from jaxpipe.serve.rewards import RewardModels

    try:
        return RewardModels.from_specs(specs, engine=engine)
    except (KeyError, OSError, ValueError, TypeError, ImportError) as err:
        message = str(err).strip('"')
        fail(message if message.startswith("--reward") else f"--reward: {message}")
