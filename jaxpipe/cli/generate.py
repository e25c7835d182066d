"""``jaxpipe generate``: render a prompt with a card or a workflow, through an ``Engine``, and write what its program makes.

It dispatches on the card's loops and program, never on its id: a ``.gif`` for a video, a ``.png`` for an image,
the text it answers printed; a text-to-image card asked for a ``.gif`` has its image animated by ``--video-model``
through the bundled ``image_video.t2i_i2v`` workflow (``DEFAULT_ROUTE``).
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import Any

import typer

from jaxpipe.cli.common import check_kinds, fail, load, writable
from jaxpipe.stopping import Stopper

__all__ = ["DEFAULT_I2V", "DEFAULT_OUT", "DEFAULT_ROUTE", "DEFAULT_T2I", "check_settings", "generate", "stopped"]

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


def stopped(stop, when: str) -> None:
    """Say that ``stop``'s signal ended the command ``when`` (nothing written) and exit with its status.

    Args:
      stop: the ``Stopper`` whose signal arrived.
      when: where the command was (``"while starting"``).

    Raises:
      typer.Exit: 130 (SIGINT) or 143 (SIGTERM).
    """
    from jaxpipe.stopping import exit_code

    typer.echo(f"stopped ({signal.Signals(stop.signum).name}) {when}: nothing written", err=True)
    raise typer.Exit(code=exit_code(stop.signum))


def check_settings(seed: int, steps: int | None, guidance: float | None) -> None:
    """Fail, naming the flag, on a setting no request accepts (the engine would name ``Request`` fields).

    Args:
      seed: ``--seed``.
      steps: ``--steps`` (``None``: the card's).
      guidance: ``--guidance`` (``None``: the card's).

    Raises:
      typer.Exit: via ``fail``, naming the first bad flag.
    """
    from jaxpipe.request import check_settings as check

    try:
        check(seed, steps, guidance, names={"seed": "--seed", "num_steps": "--steps", "guidance": "--guidance"})
    except ValueError as err:
        fail(str(err))


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
    \f
    Args:
      ctx: typer's context (its ``obj``: the stop handler the command line installed).
      prompt: what to render (a card that reads ``image`` may take none).
      out: the output file (``.gif`` or ``.png``).
      model: the card, or ``None`` for the default route.
      video_model: the image-to-video card animating a text-to-image card's image.
      seed: the generation seed.
      steps: denoising steps (``None``: the card's).
      workflow: a registered workflow to run instead of a card.
      image: an input image.
      guidance: the CFG scale (``None``: the card's).
      overwrite: replace existing outputs.

    Raises:
      typer.Exit: code 2 (``fail``) on bad input, 130 / 143 on a stop.
    """
    stop = ctx.obj if isinstance(ctx.obj, Stopper) else ctx.with_resource(Stopper())
    if out is not None and out.suffix.lower() not in (".gif", ".png"):
        fail(f"--out must end in .gif or .png (got {out.name!r})")
    if workflow is not None and (model, video_model, image) != (None, None, None):
        fail("--workflow names its own cards: drop --model, --video-model and --image")
    check_settings(seed, steps, guidance)
    if prompt is None and image is None:
        fail('PROMPT is missing: what to render, e.g. jaxpipe generate "seven thick moving right"')
    if prompt is not None and not prompt.strip():  # rendered, an empty prompt is the unconditional blob
        fail(f"PROMPT must have at least one word (got {prompt!r})")
    import jax

    from jaxpipe import Engine
    from jaxpipe.io import save_gif, save_png

    settings = dict(seed=seed, num_steps=steps, guidance=guidance)
    if stop():
        stopped(stop, "before loading")
    try:
        plan = (
            _workflow_plan(workflow, prompt, out, settings)
            if workflow is not None
            else _card_plan(model, video_model, image, prompt, out, settings)
        )
    except ValueError as err:  # a Request the settings cannot make
        fail(_in_flag_terms(str(err)))
    if stop():
        stopped(stop, "before rendering")
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
        stopped(stop, "before rendering")

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
        stopped(stop, f"at step {step} of {total}")
    if stop():  # the signal came during the last step or the decode
        stopped(stop, "after rendering")
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
