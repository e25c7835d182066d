"""The ``jaxpipe`` command line.

    jaxpipe generate "seven thick moving right" -o seven.gif [--seed S] [--steps N]   # flux-t2i, then wan-i2v
    jaxpipe generate "seven moving right" --model wan-t2v -o seven.gif               # any card (jaxpipe cards)
    jaxpipe generate "seven" --model bagel-mot -o seven.png                          # an image (it thinks first)
    jaxpipe generate --model bagel-mot --image seven.png                              # prints its caption
    jaxpipe generate "six moving down" --workflow video.t2v_continue -o six.gif       # a registered workflow
    jaxpipe evaluate [--samples N] [--guidance G]
    jaxpipe train flow-grpo --steps N --out DIR [...]     # RL on flux-t2i (generator only)
    jaxpipe train unified --steps N --out DIR [...]       # RL on the unified card (refiner LM + generator)
    jaxpipe train mot --steps N --out DIR [...]           # RL on shared weights (bagel-mot: one MoT thinks and generates)
    jaxpipe train joint --steps N --out DIR [...]         # N-way: N refiner experts (one vmap) + generator
    jaxpipe cards
    jaxpipe serve [--model ID|DIR ...] [--port 8000]        # an OpenAI-compatible HTTP server (the serve extra)

``generate`` serves its request through an ``Engine`` and writes what the card's program makes: a
``.gif`` for a video, a ``.png`` for an image, the text it answers printed; a text-to-image card asked
for a ``.gif`` (the default) has its image animated by ``--video-model`` through the
``image_video.t2i_i2v`` workflow: the same route as ``engine.run(Request("image_video.t2i_i2v", ...))``.
It dispatches on the card's loops and program, never on its id, so a card directory of any of those
kinds works too. Every command uses JAX's persistent compilation cache (``jaxpipe.compilation``), so a
second run starts without recompiling; a Ctrl-C (or SIGTERM) at any moment ends ``generate`` with exit
130 (143) and nothing written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import signal
import sys
from pathlib import Path

import typer

from jaxpipe.cli.common import check_kinds, fail, load, writable
from jaxpipe.cli.generate import check_settings, generate, stopped
from jaxpipe.cli.serve import serve
from jaxpipe.cli.train import train_app
from jaxpipe.stopping import Stopper

__all__ = ["app", "run"]

HELP_SETTINGS = {"max_content_width": 120}
"""Help text up to 120 columns wide where the terminal is (click's default stops at 80)."""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: click rewraps paragraphs to the terminal, nothing shows as raw markup
    context_settings=HELP_SETTINGS,
    help="jaxpipe: multi-model generative pipelines in JAX.",
)


app.add_typer(train_app, name="train")
app.command("serve")(serve)
app.command()(generate)


@app.callback()
def _main(ctx: typer.Context) -> None:
    # the command's stop handler: ``jaxpipe.cli.main`` installed it before typer and JAX loaded (``obj``);
    # invoked as a library (``app`` in tests), it is installed here, before JAX loads (compilation imports it)
    stop = ctx.obj if isinstance(ctx.obj, Stopper) else Stopper().__enter__()
    ctx.obj = None
    if "" not in sys.path and os.getcwd() not in sys.path:  # --reward mymodule:fn finds ./mymodule.py, as uvicorn does
        sys.path.insert(0, os.getcwd())
    if ctx.invoked_subcommand == "generate":
        ctx.obj = stop  # held until generate returns: it checks the flag at every safe point
        ctx.call_on_close(lambda: stop.__exit__(None, None, None))
        _enable_cache()
        return
    try:  # the other commands install their own handlers where they can stop safely
        _enable_cache()
    finally:
        stop.__exit__(None, None, None)
    if stop():
        stopped(stop, "while starting")


def _enable_cache() -> None:
    from jaxpipe import compilation

    compilation.enable_cache()


@app.command()
def evaluate(
    samples: int | None = typer.Option(
        None, help="Prompts (and videos) to judge (default: 200; shapes: 24 prompts per category, 2 seeds each)."
    ),
    seed: int = typer.Option(0, help="Seed of the prompts and the sampling."),
    steps: int | None = typer.Option(None, help="Denoising steps (default: each card's own)."),
    model: str | None = typer.Option(
        None, help="Text-to-image card to judge (default: the world's: flux-t2i, shapes-t2i)."
    ),
    video_model: str | None = typer.Option(
        None, help="Video card to judge (default: the world's: wan-i2v, shapes-t2v)."
    ),
    guidance: float | None = typer.Option(None, help="Classifier-free guidance scale (default: each card's)."),
    world: str = typer.Option(
        "digits",
        help="digits: C4 quality by the digit-scorer and independent judges; "
        "shapes: GenEval's six categories by the analytic judge.",
    ),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the report as JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (for machines) instead of tables."),
) -> None:
    """Measure quality. --world digits: digit and attribute accuracy judged by the digit-scorer (the RL reward)
    and, under "independent", by evaluators that share no weights with it (digit-classifier + pixel readers); I2V
    motion and first-frame fidelity. --world shapes: GenEval's table (six categories and overall, test and
    held-out colour-shape pairs) and the text-to-video card's motion, by the analytic judge."""
    import json

    from jaxpipe import evaluations
    from jaxpipe.stopping import Stopped, Stopper, exit_code

    try:
        chosen = evaluations.evaluation(world)
    except ValueError as err:
        fail(str(err))
    samples = chosen.samples if samples is None else samples
    if samples <= 0:
        fail(f"--samples must be a positive integer (got {samples})")
    check_settings(seed, steps, guidance)
    if out is not None:
        writable([out], overwrite=True)
    image, video = load(model or chosen.image[0], video_model or chosen.video[0])
    check_kinds((image, video), [("--model", chosen.image[1]), ("--video-model", chosen.video[1])])
    try:
        with Stopper() as stop:
            report = chosen.judge(
                image,
                video,
                samples=samples,
                seed=seed,
                num_steps=steps,
                guidance=guidance,
                progress=True,
                should_stop=stop,
            )
    except Stopped:
        typer.echo(f"stopped ({signal.Signals(stop.signum).name}): no report written", err=True)
        raise typer.Exit(code=exit_code(stop.signum)) from None
    text = json.dumps(report, indent=2)
    if as_json:
        typer.echo(text)
    else:
        from rich.console import Console

        from jaxpipe.cli.tables import tables

        console = Console()
        for table in tables(report):
            console.print(table)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


@app.command("cards")
def list_cards() -> None:
    """The bundled pretrained cards: id, family, parameters, loops and what each does."""
    from jaxpipe import cards

    rows = [("id", "family", "parameters", "loops", "does")]
    for model_id in cards.available():
        directory = cards.path(model_id)
        try:
            family = json.loads((directory / "config.json").read_text())["family"]
            parameters = sum(_stored_sizes(directory).values())
            loops = ", ".join(f"{loop_id} ({kind})" for loop_id, kind in _loops(directory))
        except (OSError, ValueError, KeyError, TypeError) as err:
            fail(f"{model_id}: {str(err).strip(chr(34))}")
        rows.append((model_id, family, f"{parameters:,}", loops, _description(model_id, family)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])


def _checkpoint_dir(name: str) -> Path:
    """The folder of card ``name``: a bundled id's asset folder, else ``name`` as a path."""
    from jaxpipe import cards

    entry = cards.card_entry(name)
    return entry.path if entry is not None and entry.bundled else Path(name)


def _stored_sizes(directory: Path) -> dict[str, int]:
    """Component -> how many numbers the checkpoint in ``directory`` holds for it, from the safetensors
    header alone (no tensor is read), with the components it takes from its base card counted in the base's."""
    from safetensors import safe_open

    sizes: dict[str, int] = {}
    path = directory / "weights.safetensors"
    try:
        with safe_open(str(path), framework="numpy") as weights:
            for key in weights.keys():
                component = key.split("/", 1)[0]
                sizes[component] = sizes.get(component, 0) + math.prod(weights.get_slice(key).get_shape())
    except Exception as err:  # safetensors raises its own SafetensorError on a damaged header
        raise ValueError(f"{path} cannot be read ({err}): the checkpoint is damaged or truncated") from None
    meta = json.loads((directory / "config.json").read_text())
    if meta.get("base") is not None:
        base = _stored_sizes(_checkpoint_dir(meta["base"]))
        sizes.update({name: base.get(name, 0) for name in meta.get("base_components") or ()})
    return sizes


def _loops(directory: Path) -> list[tuple[str, str]]:
    """``(id, kind)`` of each loop the card in ``directory`` declares.

    They are in its spec, which only a build gives (abstract, but flax traces every initialiser: 0.5-2 s a
    card), so the answer is kept under the compile cache's folder, keyed by the card's config.json and
    jaxpipe's own source: a second ``jaxpipe cards`` builds nothing.
    """
    from jaxpipe import compilation
    from jaxpipe.cards.checkpoint import abstract_card

    key = hashlib.sha256((directory / "config.json").read_bytes() + _source_digest()).hexdigest()[:40]
    kept = compilation.cache_dir() / "jaxpipe-cards" / f"{key}.json"
    try:
        return [(str(loop_id), str(kind)) for loop_id, kind in json.loads(kept.read_text())]
    except (OSError, ValueError, TypeError):
        pass  # not kept yet (or unreadable): build it
    loops = [(loop.id, loop.kind) for loop in abstract_card(directory).spec.loops]
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f"{kept.name}.{os.getpid()}")
        partial.write_text(json.dumps(loops))
        os.replace(partial, kept)  # whole or not at all, for a concurrent reader
    except OSError:
        pass  # a read-only cache: list without keeping
    return loops


@functools.cache
def _source_digest() -> bytes:
    """SHA-256 of jaxpipe's Python source (a card's loops change only with its family's code)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.digest()


def _description(model_id: str, family: str) -> str:
    """One line saying what card ``model_id`` does: its registry entry's description, else the first
    paragraph of its family package's docstring (on one line)."""
    import importlib

    from jaxpipe import cards

    entry = cards.card_entry(model_id)
    if entry is not None and entry.description:
        return entry.description
    package = importlib.import_module(cards.family(family).build.__module__.rsplit(".", 1)[0])
    paragraph = (package.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split()).split(": ", 1)[-1].rstrip(".").replace("``", "")


def run(stop: Stopper) -> None:
    """Run the ``jaxpipe`` command with the stop handler ``stop`` its entry point installed (``jaxpipe.cli.main``).

    Args:
      stop: the entered ``Stopper``; the command takes it over (it exits it where it installs its own).
    """
    app(obj=stop)
