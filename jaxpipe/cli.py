"""The ``jaxpipe`` command line.

    jaxpipe generate "seven thick moving right" -o seven.gif [--seed S] [--steps N] [--model ID]
    jaxpipe cards
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="jaxpipe: multi-model generative pipelines in JAX.")


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


@app.command()
def generate(
    prompt: str = typer.Argument(..., help='Digit, then attributes and an optional motion, e.g. "seven thick moving right".'),
    out: Path = typer.Option(Path("out/jaxpipe.gif"), "-o", "--out", help="Output .gif (video) or .png (image)."),
    seed: int = typer.Option(0, help="Random seed (same seed, same machine: same bits)."),
    steps: int | None = typer.Option(None, help="Denoising steps per stage (default: each card's own)."),
    model: str = typer.Option("flux-t2i", help="Text-to-image card: a bundled id or a card directory."),
    video_model: str = typer.Option("wan-i2v", help="Image-to-video card: a bundled id or a card directory."),
    guidance: float | None = typer.Option(None, help="Classifier-free guidance scale (default: the card's)."),
) -> None:
    """Render PROMPT as an image with the text-to-image card, then animate it with the image-to-video card."""
    import jax

    from jaxpipe import cards
    from jaxpipe.cards import flux_t2i, wan_i2v
    from jaxpipe.data import split_prompt
    from jaxpipe.io import save_gif, save_png

    if out.suffix.lower() not in (".gif", ".png"):
        _fail(f"--out must end in .gif or .png (got {out.name!r})")
    if steps is not None and steps <= 0:
        _fail(f"--steps must be a positive integer (got {steps})")
    try:
        image_prompt, motion_prompt = split_prompt(prompt)
    except ValueError as err:
        _fail(str(err))
    if out.suffix.lower() == ".gif" and motion_prompt is None:
        motion_prompt = split_prompt(f"{image_prompt} still")[1]
    try:
        t2i = cards.load(model)
        i2v = cards.load(video_model) if out.suffix.lower() == ".gif" else None
    except (KeyError, FileNotFoundError, ValueError) as err:
        _fail(str(err).strip('"'))

    start = time.perf_counter()
    typer.echo(f"[1/2] {t2i.model_id}: {image_prompt!r} (seed {seed}, JAX on {jax.default_backend()})")
    image = flux_t2i.generate(t2i, image_prompt, seed=seed, num_steps=steps, guidance=guidance)[0]
    if i2v is None:
        typer.echo(f"wrote {save_png(image, out)} in {time.perf_counter() - start:.1f} s")
        return
    typer.echo(f"[2/2] {i2v.model_id}: {motion_prompt!r}")
    video = wan_i2v.animate(i2v, motion_prompt, image, seed=seed, num_steps=steps, guidance=guidance)[0]
    first = save_png(image, out.with_suffix(".png"))
    typer.echo(f"wrote {save_gif(video, out)} ({video.shape[0]} frames) and {first} in {time.perf_counter() - start:.1f} s")


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
    """Measure C4 quality: scorer-judged digit and attribute accuracy, I2V motion and first-frame fidelity."""
    import json

    from jaxpipe import cards, quality

    if samples <= 0:
        _fail(f"--samples must be a positive integer (got {samples})")
    try:
        t2i, i2v, scorer = cards.load(model), cards.load(video_model), cards.load("digit-scorer")
    except (KeyError, FileNotFoundError, ValueError) as err:
        _fail(str(err).strip('"'))
    report = {
        "t2i": quality.t2i_quality(t2i, scorer, samples=samples, seed=seed, num_steps=steps, guidance=guidance),
        "i2v": quality.i2v_quality(i2v, scorer, samples=max(samples // 2, 1), seed=seed, num_steps=steps, guidance=guidance),
    }
    text = json.dumps(report, indent=2)
    typer.echo(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


@app.command("cards")
def list_cards() -> None:
    """List the bundled pretrained cards."""
    from jaxpipe import cards

    for model_id in cards.available():
        typer.echo(model_id)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
