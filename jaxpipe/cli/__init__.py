"""The ``jaxpipe`` command line.

    jaxpipe generate "seven thick moving right" -o seven.gif [--seed S] [--steps N] [--model ID]
    jaxpipe evaluate [--samples N] [--guidance G]
    jaxpipe train flow-grpo --steps N --out DIR [...]     # RL on flux-t2i (generator only)
    jaxpipe train unified --steps N --out DIR [...]       # RL on the unified card (refiner LM + generator)
    jaxpipe train mot --steps N --out DIR [...]           # RL on shared weights (bagel-mot: one MoT thinks and generates)
    jaxpipe train joint --steps N --out DIR [...]         # N-way: N refiner experts (one vmap) + generator
    jaxpipe cards

``generate`` serves the prompt through an ``Engine`` running the ``image_video.t2i_i2v`` workflow
(or, for a ``.png``, the text-to-image card alone): the same route as
``engine.run(Request("image_video.t2i_i2v", ...))``. Every command uses JAX's persistent
compilation cache (``jaxpipe.compilation``), so a second run starts without recompiling.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import typer

from jaxpipe.cli.common import check_kinds, fail, load, writable
from jaxpipe.cli.train import train_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help="jaxpipe: multi-model generative pipelines in JAX.")


app.add_typer(train_app, name="train")


@app.callback()
def _main() -> None:
    from jaxpipe import compilation

    compilation.enable_cache()


@app.command()
def generate(
    prompt: str = typer.Argument(..., help='Digit, then attributes and an optional motion, e.g. "seven thick moving right".'),
    out: Path = typer.Option(Path("out/jaxpipe.gif"), "-o", "--out", help="Output .gif (video) or .png (image)."),
    seed: int = typer.Option(0, help="Random seed (same seed, same machine: same bits)."),
    steps: int | None = typer.Option(None, help="Denoising steps per stage (default: each card's own)."),
    model: str = typer.Option("flux-t2i", help="Text-to-image card: a bundled id or a card directory."),
    video_model: str = typer.Option("wan-i2v", help="Image-to-video card: a bundled id or a card directory."),
    guidance: float | None = typer.Option(None, help="Classifier-free guidance scale (default: the card's)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files instead of refusing."),
) -> None:
    """Render PROMPT as an image with the text-to-image card, then animate it with the image-to-video card."""
    import jax

    from jaxpipe import Engine, Request
    from jaxpipe.digits import split_prompt, workflows
    from jaxpipe.io import save_gif, save_png

    video = out.suffix.lower() == ".gif"
    if out.suffix.lower() not in (".gif", ".png"):
        fail(f"--out must end in .gif or .png (got {out.name!r})")
    if steps is not None and steps <= 0:
        fail(f"--steps must be a positive integer (got {steps})")
    try:
        image_prompt, _ = split_prompt(prompt)
    except ValueError as err:
        fail(str(err))
    writable([out, out.with_suffix(".png")] if video else [out], overwrite)
    loaded = load(model, video_model) if video else load(model)
    check_kinds(loaded, [("--model", "t2i"), ("--video-model", "i2v")])
    engine = Engine()
    try:
        for card in loaded:
            engine.register(card)
        if video:
            flow = workflows.t2i_i2v(t2i=loaded[0].model_id, i2v=loaded[1].model_id)
            engine.register_workflow(flow)
            request = Request(flow.id, prompt=prompt, seed=seed, num_steps=steps, guidance=guidance)
        else:
            request = Request(loaded[0].model_id, prompt=image_prompt, seed=seed, num_steps=steps, guidance=guidance)
        engine.check(request)
    except ValueError as err:
        fail(str(err))

    stages = ["t2i", "i2v"] if video else [""]
    seen = set()

    def announce(event) -> None:
        if event.stage not in seen:
            seen.add(event.stage)
            where = f" (seed {seed}, JAX on {jax.default_backend()})" if len(seen) == 1 else ""
            typer.echo(f"[{len(seen)}/{len(stages)}] {event.request.model}: {event.request.prompt!r}{where}")

    from jaxpipe.stopping import Stopper, exit_code

    start = time.perf_counter()
    with Stopper() as stop:
        result = engine.run(request, on_step=announce, cancel=stop)
    if result.cancelled:
        step, total = result.cancelled_at
        typer.echo(f"stopped ({signal.Signals(stop.signum).name}) at step {step} of {total}: nothing written", err=True)
        raise typer.Exit(code=exit_code(stop.signum))
    if not video:
        typer.echo(f"wrote {save_png(result['image'], out)} in {time.perf_counter() - start:.1f} s")
        return
    first = save_png(result["image"], out.with_suffix(".png"))
    frames = result["video"]
    typer.echo(f"wrote {save_gif(frames, out)} ({frames.shape[0]} frames) and {first} in {time.perf_counter() - start:.1f} s")


@app.command()
def evaluate(
    samples: int = typer.Option(200, help="Prompts (and videos) to judge."),
    seed: int = typer.Option(0, help="Seed of the prompts and the sampling."),
    steps: int | None = typer.Option(None, help="Denoising steps (default: each card's own)."),
    model: str = typer.Option("flux-t2i", help="Text-to-image card to judge."),
    video_model: str = typer.Option("wan-i2v", help="Image-to-video card to judge."),
    guidance: float | None = typer.Option(None, help="Classifier-free guidance scale (default: each card's)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the report as JSON here."),
) -> None:
    """Measure C4 quality: digit and attribute accuracy judged by the digit-scorer (the RL reward) and, under
    "independent", by evaluators that share no weights with it (digit-classifier + pixel readers); I2V motion
    and first-frame fidelity."""
    import json

    from jaxpipe.digits import quality
    from jaxpipe.stopping import Stopped, Stopper, exit_code

    if samples <= 0:
        fail(f"--samples must be a positive integer (got {samples})")
    if out is not None:
        writable([out], overwrite=True)
    t2i, i2v, scorer = load(model, video_model, "digit-scorer")
    check_kinds((t2i, i2v), [("--model", "t2i"), ("--video-model", "i2v")])
    try:
        with Stopper() as stop:
            common = dict(seed=seed, num_steps=steps, guidance=guidance, progress=True, should_stop=stop)
            report = {
                "t2i": quality.t2i_quality(t2i, scorer, samples=samples, **common),
                "i2v": quality.i2v_quality(i2v, scorer, samples=max(samples // 2, 1), **common),
            }
    except Stopped:
        typer.echo(f"stopped ({signal.Signals(stop.signum).name}): no report written", err=True)
        raise typer.Exit(code=exit_code(stop.signum)) from None
    text = json.dumps(report, indent=2)
    typer.echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


@app.command("cards")
def list_cards() -> None:
    """The bundled pretrained cards: id, family, parameters, loops and what each does."""
    import importlib

    from jaxpipe import cards
    from jaxpipe.cards.checkpoint import abstract_card

    rows = [("id", "family", "parameters", "loops", "does")]
    for model_id in cards.available():
        card = abstract_card(cards.path(model_id))  # from its config alone: no weights read
        loops = ", ".join(f"{loop.id} ({loop.kind})" for loop in card.spec.loops)
        package = importlib.import_module(cards.family(card.spec.family).build.__module__.rsplit(".", 1)[0])
        what = (package.__doc__ or "").strip().splitlines()[0].split(": ", 1)[-1].rstrip(".").replace("``", "")
        rows.append((model_id, card.spec.family, f"{card.num_params():,}", loops, what))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])




def main() -> None:
    app()


if __name__ == "__main__":
    main()
