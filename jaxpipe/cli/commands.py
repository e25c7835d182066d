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

import dataclasses
import functools
import hashlib
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import typer

from jaxpipe.cli.common import check_kinds, fail, load, writable
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


DEFAULT_OUT = Path("out/jaxpipe.gif")
DEFAULT_T2I, DEFAULT_I2V = "flux-t2i", "wan-i2v"
DEFAULT_ROUTE = "image_video.t2i_i2v"
"""The workflow a text-to-image card's .gif goes through: its image animated by an image-to-video card."""
_FLAGS = (
    ("Request.num_steps", "--steps"),
    ("Request.guidance", "--guidance"),
    ("Request.seed", "--seed"),
    ("Request.image", "--image"),
    ("Request.prompt", "PROMPT"),
)
"""The engine's names for what the command's flags set, as ``generate`` reports them."""


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
        _stopped(stop, "while starting")


def _enable_cache() -> None:
    from jaxpipe import compilation

    compilation.enable_cache()


def _stopped(stop, when: str) -> None:
    from jaxpipe.stopping import exit_code

    typer.echo(f"stopped ({signal.Signals(stop.signum).name}) {when}: nothing written", err=True)
    raise typer.Exit(code=exit_code(stop.signum))


def _check_settings(seed: int, steps: int | None, guidance: float | None) -> None:
    """Fail, naming the flag, on a setting no request accepts (the engine would name ``Request`` fields)."""
    from jaxpipe.request import MAX_SEED

    if steps is not None and steps <= 0:
        fail(f"--steps must be a positive integer (got {steps})")
    if not 0 <= seed <= MAX_SEED:
        fail(f"--seed must be an int in [0, {MAX_SEED}] (got {seed})")
    if guidance is not None and not (math.isfinite(guidance) and guidance >= 0):
        fail(f"--guidance must be a finite number >= 0 (got {guidance})")


def _in_flag_terms(message: str) -> str:
    for field, flag in _FLAGS:
        message = message.replace(field, flag)
    return message


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What ``generate`` runs: the cards (each with the program to serve it with) and workflows to register,
    the request, what it makes (``"image"``, ``"video"`` or ``"text"``), how many card stages it has, and
    whether a video's first image is written next to it (``OUT.png``)."""

    cards: tuple
    workflows: tuple
    request: Any
    makes: str
    stages: int = 1
    first_image: bool = False


def _makes(program) -> str | None:
    """``"video"``, ``"image"`` or ``"text"``: the artifact the command writes (or prints) for ``program``."""
    outputs = {name for name, _ in program.outputs}
    return "video" if "video" in outputs else "image" if "image" in outputs else "text" if program.texts else None


def _serving(card, with_image: bool):
    """The program ``generate`` serves ``card`` with and what it makes: its default program, or with ``--image``
    the first of its family's programs for this card that reads an image (``bagel-mot``: ``understand``)."""
    from jaxpipe import cards
    from jaxpipe.program import ProgramError

    loops = ", ".join(f"{loop.id} ({loop.kind})" for loop in card.spec.loops)
    does = ", ".join(card.spec.capabilities) or "no listed task"
    if all(loop.kind == "score" for loop in card.spec.loops):
        fail(
            f"{card.model_id!r} is a judge, not a generator: it scores images (loops: {loops}); "
            f"`jaxpipe evaluate` and the RL rewards use it"
        )

    def fits(program) -> bool:  # a family's other programs may be for its other kind of card (wan: t2v / i2v)
        try:
            program.check(card)
        except ProgramError:
            return False
        return True

    default = cards.registry.default_program(card)
    others = (factory() for factory in cards.family_of(card).programs.values())
    programs = [default, *(p for p in others if p is not default and fits(p))]
    if with_image:
        program = next((p for p in programs if "image" in p.inputs), None)
        if program is None:
            fail(f"--image: {card.model_id!r} ({does}) reads no image")
    else:
        program = programs[0]
        if "image" in program.inputs:
            also = f", or let it animate a text-to-image card's: --video-model {card.model_id}" if "i2v" in does else ""
            fail(f"{card.model_id!r} ({does}) starts from an image: pass --image FILE.png{also}")
    makes = _makes(program)
    if makes is None:
        fail(f"{card.model_id!r}: its program {program.name!r} makes no image, video or text (loops {loops})")
    return program, makes


def _read_image(path: Path, card):
    """``path`` as ``(H, W, C)`` floats in [0, 1] at ``card``'s image size (``jaxpipe.io.read_image``)."""
    from jaxpipe.io import image_shape, read_image

    if not path.is_file():
        fail(f"--image {path}: no such file")
    try:
        return read_image(path, image_shape(card))
    except ValueError as err:
        fail(f"--image {path} {err}")


def _card_plan(
    model: str | None, video_model: str | None, image: Path | None, prompt: str | None, out: Path | None, settings: dict
) -> _Plan:
    """The plan for ``--model``: dispatched on what its program makes, never on its id."""
    from jaxpipe import Request
    from jaxpipe import workflow as workflows

    name = model or DEFAULT_T2I
    suffix = None if out is None else out.suffix.lower()
    if (
        model is None and image is None and suffix != ".png"
    ):  # the default route: its prompt checked before any card loads
        flow = workflows.factory(DEFAULT_ROUTE)()
        try:
            flow.check(Request(flow.id, prompt=prompt))
        except ValueError as err:
            fail(_in_flag_terms(str(err)))
    if name in {flow.id for flow in workflows.bundled()}:
        fail(f"{name!r} is a workflow, not a card: pass --workflow {name}")
    (card,) = load(name)
    program, makes = _serving(card, image is not None)
    if makes == "image" and image is None and suffix != ".png":  # the image animated: the t2i_i2v workflow
        (i2v,) = load(video_model or DEFAULT_I2V)
        check_kinds((i2v,), [("--video-model", "i2v")])
        flow = workflows.factory(DEFAULT_ROUTE)(t2i=card.model_id, i2v=i2v.model_id)
        request = Request(flow.id, prompt=prompt, **settings)
        return _Plan(((card, None), (i2v, None)), (flow,), request, "video", stages=2, first_image=True)
    if video_model is not None:
        fail(f"--video-model animates a text-to-image card's image into a .gif; {card.model_id!r} makes {makes} itself")
    if makes == "text" and out is not None:
        fail(f"{card.model_id!r} answers in text, printed here: it writes no file (drop --out)")
    if makes != "text" and suffix is not None and suffix != (".gif" if makes == "video" else ".png"):
        wanted, what = (".gif", "a video") if makes == "video" else (".png", "an image")
        fail(f"{card.model_id!r} makes {what}: --out must end in {wanted} (got {out.name!r})")
    pixels = None if image is None else _read_image(image, card)
    request = Request(card.model_id, prompt=prompt, image=pixels, **settings)
    return _Plan(((card, program),), (), request, makes)


def _workflow_plan(workflow_id: str, prompt: str | None, out: Path | None, settings: dict) -> _Plan:
    """The plan for ``--workflow``: its cards and nested workflows (dependencies first); it makes what its
    last stage's card makes."""
    from jaxpipe import Request
    from jaxpipe import workflow as workflows
    from jaxpipe.cards.registry import default_program

    known = {flow.id: flow for flow in workflows.bundled()}
    if workflow_id not in known:
        fail(f"--workflow {workflow_id!r} is not a registered workflow; registered: {', '.join(sorted(known))}")
    order: list[str] = []  # the workflows to register, each after the workflows it runs
    card_ids: list[str] = []
    seen: set[str] = set()

    def visit(flow_id: str) -> None:
        seen.add(flow_id)
        for model in known[flow_id].requires:
            if model in known and model in seen and model not in order:
                fail(f"workflow {flow_id!r} runs {model!r}, which runs {flow_id!r} again: a cycle")
            if model in known and model not in seen:
                visit(model)
            elif model not in known and model not in card_ids:
                card_ids.append(model)
        order.append(flow_id)

    visit(workflow_id)
    loaded = dict(zip(card_ids, load(*card_ids)))
    made = {model_id: _makes(default_program(card)) for model_id, card in loaded.items()}

    def leaves(flow_id: str) -> int:
        return sum(leaves(stage.model) if stage.model in known else 1 for stage in known[flow_id].stages)

    def last(flow_id: str) -> str:
        model = known[flow_id].stages[-1].model
        return last(model) if model in known else model

    makes = made[last(workflow_id)]
    if makes not in ("video", "image"):
        fail(
            f"--workflow {workflow_id} ends with {last(workflow_id)!r}, which makes {makes or 'nothing'}: "
            f"no image or video to write"
        )
    wanted = ".gif" if makes == "video" else ".png"
    if out is not None and out.suffix.lower() != wanted:
        fail(
            f"--workflow {workflow_id} makes {'a video' if makes == 'video' else 'an image'}: --out must end in {wanted} "
            f"(got {out.name!r})"
        )
    first_image = makes == "video" and "image" in made.values()
    return _Plan(
        tuple((card, None) for card in loaded.values()),
        tuple(known[i] for i in order),
        Request(workflow_id, prompt=prompt, **settings),
        makes,
        leaves(workflow_id),
        first_image,
    )


@app.command()
def generate(
    ctx: typer.Context,
    prompt: str | None = typer.Argument(
        None,
        metavar="PROMPT",
        help='What to render, e.g. "seven thick moving right" (the digits cards\' '
        "words); with --image, optional words the answer starts with.",
    ),
    out: Path | None = typer.Option(
        None,
        "-o",
        "--out",
        show_default="out/jaxpipe.gif",
        help="Output: .gif for a video, .png for an image (a text answer is printed).",
    ),
    seed: int = typer.Option(0, help="Random seed (same seed, same machine: same bits)."),
    steps: int | None = typer.Option(None, help="Denoising steps per stage (default: each card's own)."),
    model: str | None = typer.Option(
        None,
        show_default=DEFAULT_T2I,
        help=(
            "The card: a bundled id (`jaxpipe cards`) or a card directory. A text-to-image card writes a .png, or a .gif "
            "with its image animated by --video-model; a text-to-video card writes a .gif; with --image, what the card "
            "does with an image."
        ),
    ),
    video_model: str | None = typer.Option(
        None, show_default=DEFAULT_I2V, help="Image-to-video card animating --model's image into the .gif."
    ),
    workflow: str | None = typer.Option(
        None,
        help="Run a registered workflow instead of one card "
        "(image_video.t2i_i2v, image_video.t2i_i2v_extended, video.t2v_continue ...).",
    ),
    image: Path | None = typer.Option(
        None,
        help="An input image for a card that reads one (wan-i2v animates it, "
        "bagel-mot captions it); resized to the card's size.",
    ),
    guidance: float | None = typer.Option(None, help="Classifier-free guidance scale (default: the card's)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace existing output files instead of refusing."),
) -> None:
    """Render PROMPT with a card or a workflow. By default: an image with flux-t2i, animated by wan-i2v into a GIF.

    What it writes follows what the card's program makes: a text-to-video card a .gif, a text-to-image card
    a .png (or, for a .gif, its image animated by --video-model); with --image, an image-to-video card
    animates that image and an understanding card (bagel-mot) prints what it reads. Judges are refused.
    """
    stop = ctx.obj if isinstance(ctx.obj, Stopper) else ctx.with_resource(Stopper())
    if out is not None and out.suffix.lower() not in (".gif", ".png"):
        fail(f"--out must end in .gif or .png (got {out.name!r})")
    if workflow is not None and (model, video_model, image) != (None, None, None):
        fail("--workflow names its own cards: drop --model, --video-model and --image")
    _check_settings(seed, steps, guidance)
    if prompt is None and image is None:
        fail('PROMPT is missing: what to render, e.g. jaxpipe generate "seven thick moving right"')
    if prompt is not None and not prompt.strip():  # rendered, an empty prompt is the unconditional blob
        fail(f"PROMPT must have at least one word (got {prompt!r})")
    import jax

    from jaxpipe import Engine
    from jaxpipe.io import save_gif, save_png

    settings = dict(seed=seed, num_steps=steps, guidance=guidance)
    if stop():
        _stopped(stop, "before loading")
    try:
        plan = (
            _workflow_plan(workflow, prompt, out, settings)
            if workflow is not None
            else _card_plan(model, video_model, image, prompt, out, settings)
        )
    except ValueError as err:  # a Request the settings cannot make
        fail(_in_flag_terms(str(err)))
    if stop():
        _stopped(stop, "before rendering")
    if prompt is None and plan.makes != "text":
        fail(f"PROMPT is missing: {plan.request.model!r} renders it (from --image {image})")
    out = out or (DEFAULT_OUT if plan.makes == "video" else DEFAULT_OUT.with_suffix(".png"))
    if plan.makes != "text":
        writable([out, out.with_suffix(".png")] if plan.first_image else [out], overwrite)
    engine = Engine()
    try:
        for card, program in plan.cards:
            engine.register(card, program)
        for flow in plan.workflows:
            engine.register_workflow(flow)
        engine.check(plan.request)
    except ValueError as err:
        fail(_in_flag_terms(str(err)))
    if stop():
        _stopped(stop, "before rendering")

    seen = set()

    def announce(event) -> None:
        if event.stage not in seen:
            seen.add(event.stage)
            where = f" (seed {seed}, JAX on {jax.default_backend()})" if len(seen) == 1 else ""
            given = f"{image} " if image is not None and len(seen) == 1 else ""
            said = "" if event.request.prompt is None else repr(event.request.prompt)
            typer.echo(f"[{len(seen)}/{plan.stages}] {event.request.model}: {given}{said}".rstrip() + where)

    start = time.perf_counter()
    result = engine.run(plan.request, on_step=announce, cancel=stop)
    if result.cancelled:
        step, total = result.cancelled_at
        _stopped(stop, f"at step {step} of {total}")
    if stop():  # the signal came during the last step or the decode
        _stopped(stop, "after rendering")
    for name, value in result.items():
        if name.endswith("_text") and isinstance(value, str):  # what a card said: a thought, a caption ...
            typer.echo(f"{name.removesuffix('_text')}: {value!r}")
    took = f"in {time.perf_counter() - start:.1f} s"
    if plan.makes == "text":
        typer.echo(f"answered {took}")
    elif plan.makes == "image":
        typer.echo(f"wrote {save_png(result['image'], out)} {took}")
    else:
        frames = result["video"]
        first = (
            f" and {save_png(result['image'], out.with_suffix('.png'))}"
            if plan.first_image and "image" in result
            else ""
        )
        typer.echo(f"wrote {save_gif(frames, out)} ({frames.shape[0]} frames){first} {took}")


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
    _check_settings(seed, steps, guidance)
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
