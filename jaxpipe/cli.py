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

import dataclasses
import inspect
import os
import shlex
import signal
import sys
import time
import typing
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="jaxpipe: multi-model generative pipelines in JAX.")


@app.callback()
def _main() -> None:
    from jaxpipe import compilation

    compilation.enable_cache()


train_app = typer.Typer(
    no_args_is_help=True,
    help="RL post-training on the digits world: writes DIR/metrics.jsonl, DIR/*.png, DIR/report.json and the "
    "trained card (jp.cards.load(DIR)).",
)
app.add_typer(train_app, name="train")


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def _load(*names: str):
    from jaxpipe import cards

    try:
        return tuple(cards.load(name) for name in names)
    except (KeyError, FileNotFoundError, ValueError) as err:
        _fail(str(err).strip('"'))


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
        _fail(f"--out must end in .gif or .png (got {out.name!r})")
    if steps is not None and steps <= 0:
        _fail(f"--steps must be a positive integer (got {steps})")
    try:
        image_prompt, _ = split_prompt(prompt)
    except ValueError as err:
        _fail(str(err))
    _writable([out, out.with_suffix(".png")] if video else [out], overwrite)
    loaded = _load(model, video_model) if video else _load(model)
    _check_kinds(loaded, [("--model", "t2i"), ("--video-model", "i2v")])
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
        _fail(str(err))

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


def _writable(paths: list[Path], overwrite: bool) -> None:
    """Fail before any compute if an output exists (unless ``overwrite``) or its folder cannot be written."""
    for path in paths:
        if path.exists() and not overwrite:
            _fail(f"{path} exists: pass --overwrite to replace it")
        if path.is_dir():
            _fail(f"{path} is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            _fail(f"cannot create {path.parent}: {err.strerror}")
        if not os.access(path.parent, os.W_OK):
            _fail(f"cannot write to {path.parent}")


def _check_kinds(loaded, roles) -> None:
    """Fail unless each card can do what its flag asks (``roles``: ``(flag, capability)``, in order)."""
    for card, (flag, capability) in zip(loaded, roles):
        if capability not in card.spec.capabilities:
            kinds = ", ".join(card.spec.capabilities) or "nothing this command runs"
            _fail(f"{flag} {card.model_id!r} does {kinds}; this stage needs a card that does {capability}")


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

    from jaxpipe.digits import quality
    from jaxpipe.stopping import Stopped, Stopper, exit_code

    if samples <= 0:
        _fail(f"--samples must be a positive integer (got {samples})")
    if out is not None:
        _writable([out], overwrite=True)
    t2i, i2v, scorer = _load(model, video_model, "digit-scorer")
    _check_kinds((t2i, i2v), [("--model", "t2i"), ("--video-model", "i2v")])
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


# ---------------------------------------------------------------------------------------------- train
# Flags shared by `train` subcommands are declared once, as fields of a dataclass whose metadata is
# the typer option; `_with(*groups)` adds a group's flags to a command's signature and hands the
# command one object per group. A new method is one subcommand: its own flags, its config and a
# `training.runs` builder, then `_execute` (metrics, curves, report, card).


def _flag(default, *names: str, help: str):
    return dataclasses.field(default=default, metadata={"option": typer.Option(default, *names, help=help)})


@dataclasses.dataclass
class RunFlags:
    """Every training command: run length, output, batch shape, learning rate, reward, evaluation."""

    steps: int = _flag(..., "--steps", help="Training steps (one rollout + one update each).")
    out: Path = _flag(..., "--out", "-o", help="Output directory: metrics.jsonl, *.png, report.json and the trained card.")
    prompts_per_step: int = _flag(4, "--prompts-per-step", "-P", help="Prompts per step (P).")
    group_size: int = _flag(4, "--group-size", "-K", help="Samples per prompt (K; RL: the group of the group-relative advantage, K >= 2).")
    lr: typing.Optional[float] = _flag(None, "--lr", help="Learning rate of the trained generator / student (default: the method's; 1e-4 for RL and DMD2, 2e-5 for self-forcing).")
    terms: str = _flag("digit,stroke,position,brightness", "--terms", help="Reward terms, comma-separated: digit,stroke,position,brightness (digit required).")
    seed: int = _flag(0, "--seed", help="Seed of the prompts and of the rollouts.")
    run_eval: bool = _flag(True, "--eval/--no-eval", help="Judge the card before and after (GenEval-style accuracy, diversity).")
    eval_samples: int = _flag(200, "--eval-samples", help="Prompts judged before and after.")
    diversity_prompts: int = _flag(10, "--diversity-prompts", help="Prompts of the diversity measure.")
    diversity_seeds: int = _flag(6, "--diversity-seeds", help="Seeds per prompt of the diversity measure (>= 2).")
    eval_seed: int = _flag(0, "--eval-seed", help="Seed of the evaluation prompts and noise (the same before and after).")
    scorer: str = _flag("digit-scorer", "--scorer", help="Reward model card: a bundled id or a card directory.")
    save_every: int = _flag(50, "--save-every", help="Checkpoint the training state every N steps (and always on a stop).")
    resume: bool = _flag(False, "--resume", help="Continue the run in --out from its last checkpoint (same settings).")
    overwrite: bool = _flag(False, "--overwrite", help="Replace the run in a non-empty --out instead of refusing.")

    def rate(self, name: str = "learning_rate") -> dict:
        """``{name: --lr}`` when the flag is given (else ``{}``: the method's config default applies)."""
        return {} if self.lr is None else {name: self.lr}

    def evaluation(self):
        from jaxpipe.digits.evaluation import EvalSettings

        if not self.run_eval:
            return None
        return EvalSettings(
            samples=self.eval_samples, diversity_prompts=self.diversity_prompts, diversity_seeds=self.diversity_seeds,
            seed=self.eval_seed,
        )


@dataclasses.dataclass
class PolicyFlags:
    """The policy-gradient commands (FlowGRPO and the methods built on it): SDE rollouts, PPO, KL."""

    num_steps: int = _flag(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation.")
    sde_window: str = _flag("0,4", "--sde-window", help="START,STOP: denoise steps sampled with the SDE and trained (ODE elsewhere); 'all' = every step.")
    noise_level: float = _flag(0.7, "--noise-level", help="SDE noise level (eta).")
    beta: float = _flag(0.04, "--beta", help="Generator KL weight to the frozen reference DiT.")
    kl: str = _flag("exact", "--kl", help="Generator KL convention: exact (Gaussian KL of the SDE step) or flowgrpo (the official code's: exact x |dt|).")
    clip_eps: float = _flag(1e-3, "--clip-eps", help="Generator PPO ratio clip.")
    minibatches: int = _flag(1, "--minibatches", help="Updates per epoch over each rollout: its P·K rows split into this many shuffled minibatches.")
    inner_epochs: int = _flag(1, "--inner-epochs", help="Passes over each rollout's minibatches (updates per rollout = minibatches × inner epochs).")
    timestep_fraction: float = _flag(1.0, "--timestep-fraction", help="Fraction (0, 1] of the captured denoising steps each minibatch trains on, drawn per sample.")

    def generator(self, run: RunFlags) -> dict:
        """The generator's RL settings, as config keywords."""
        return dict(
            group_size=run.group_size, num_steps=self.num_steps, noise_level=self.noise_level,
            sde_window=_window(self.sde_window), clip_eps=self.clip_eps, beta=self.beta, **run.rate(), kl=self.kl,
            minibatches=self.minibatches, inner_epochs=self.inner_epochs, timestep_fraction=self.timestep_fraction,
        )


@dataclasses.dataclass
class RefinerFlags:
    """Commands that train refiner LMs next to the generator."""

    skip: int = _flag(1, "--skip", help="Samples per group that keep the original prompt (0 <= skip < K).")
    prompt_only: bool = _flag(False, "--prompt-only", help="Train only the refiner(s); the generator stays frozen.")
    lm_lr: float = _flag(1e-3, "--lm-lr", help="Refiner learning rate.")
    lm_beta: float = _flag(0.01, "--lm-beta", help="Refiner k3-KL weight to its frozen reference.")

    def refiner(self) -> dict:
        return dict(skip=self.skip, joint=not self.prompt_only, lm_learning_rate=self.lm_lr, lm_beta=self.lm_beta)


def _with(*groups: type):
    """Add the flags of dataclasses ``groups`` to a command; it receives one instance per group (by
    the group's lowercase name, e.g. ``runflags``) and its own parameters."""

    def wrap(command):
        names = {g.__name__.lower() for g in groups}
        hints = typing.get_type_hints(command)
        own = [
            p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command).parameters.values() if p.name not in names
        ]
        shared = []
        for group in groups:
            types = typing.get_type_hints(group)
            shared += [
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["option"], annotation=types[f.name])
                for f in dataclasses.fields(group)
            ]

        def run(**kwargs):
            packed = {g.__name__.lower(): g(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(g)}) for g in groups}
            return command(**packed, **kwargs)

        run.__name__, run.__doc__ = command.__name__, command.__doc__
        run.__signature__ = inspect.Signature([*shared, *own])
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
        return run

    return wrap


def _window(text: str) -> tuple[int, int] | None:
    if text.strip().lower() in ("all", "none", ""):
        return None
    parts = text.split(",")
    try:
        start, stop = (int(p) for p in parts)
    except ValueError:
        _fail(f"--sde-window must be START,STOP (e.g. 0,4) or 'all' (got {text!r})")
    return start, stop


FAILED_EXIT = 3
"""``jaxpipe train``'s exit status when the run finished but its verdict is FAILED (mode collapse)."""


def _resume_command() -> str:
    args = ["jaxpipe", *sys.argv[1:]]
    args = [a for a in args if a != "--overwrite"]
    return " ".join(shlex.quote(a) for a in args + ([] if "--resume" in args else ["--resume"]))


def _train(flags: RunFlags, model: str, make_config, build_run) -> None:
    """Validate the settings (``make_config()``; ValueError = bad settings), load the cards, build the
    run (``build_run(card, scorer, config, evaluation)``) and execute it, echoing progress. SIGINT /
    SIGTERM stop it after the current step: checkpoint, report and curves so far, exit 130 / 143."""
    import jax

    from jaxpipe.stopping import Stopper, exit_code
    from jaxpipe.training.runs import execute

    if flags.steps <= 0:
        _fail(f"--steps must be a positive integer (got {flags.steps})")
    if flags.save_every <= 0:
        _fail(f"--save-every must be a positive integer (got {flags.save_every})")
    if flags.resume and flags.overwrite:
        _fail("--resume continues the run in --out and --overwrite replaces it: pass one of them")
    try:
        config = make_config()
        schedule = getattr(config[1], "schedule", None)  # the PPO minibatch schedule, where the method has one
        if schedule is not None:
            schedule.check_rows(flags.prompts_per_step * flags.group_size)
        evaluation = flags.evaluation()
    except ValueError as err:
        _fail(str(err))
    out = Path(flags.out)
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file, not a directory")
    if not flags.resume and not flags.overwrite and out.is_dir() and any(out.iterdir()):
        _fail(f"{out} is not empty: pass --resume to continue the run in it, or --overwrite to replace it")
    with Stopper() as stop:
        card, scorer = _load(model, flags.scorer)
        try:
            run = build_run(card, scorer, config, evaluation)
        except ValueError as err:
            _fail(str(err))
        typer.echo(f"{run.name}: {flags.steps} steps -> {out} (JAX on {jax.default_backend()})")
        try:
            report = execute(
                run, steps=flags.steps, out=out, seed=flags.seed, log=typer.echo, save_every=flags.save_every,
                resume=flags.resume, overwrite=flags.overwrite, should_stop=stop,
            )
        except ValueError as err:
            _fail(str(err))
    if report["status"] == "stopped":
        typer.echo(
            f"stopped after step {report['completed_steps']} of {report['steps']}: checkpoint, metrics, curves and "
            f"report.json in {out}\nresume with: {_resume_command()}"
        )
        raise typer.Exit(code=exit_code(stop.signum) if stop.signum else 130)
    if report.get("summary", {}).get("diversity_collapse"):
        raise typer.Exit(code=FAILED_EXIT)


def _train_generator(flags: RunFlags, model: str, mention: float, make_config, builder) -> None:
    """``_train`` for a text-to-image method: prompts over ``--terms`` naming each with probability
    ``mention``, the method's config ``make_config()``, its run ``builder`` (e.g. ``runs.nft_run``)."""
    from jaxpipe.digits import runs

    def config():
        return runs.PromptSpec(terms=runs.parse_terms(flags.terms), mention=mention), make_config()

    _train(flags, model, config, lambda card, scorer, cfg, evaluation: builder(
        card, scorer, cfg[1], cfg[0], prompts_per_step=flags.prompts_per_step, seed=flags.seed, evaluation=evaluation))


@train_app.command("flow-grpo")
@_with(RunFlags, PolicyFlags)
def train_flow_grpo(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    mention: float = typer.Option(1.0, "--mention", help="Probability that a prompt names each rewarded attribute (1 = full compositional prompts)."),
    model: str = typer.Option("flux-t2i", "--model", help="Text-to-image card to train: a bundled id or a card directory."),
) -> None:
    """FlowGRPO on a text-to-image card, rewarded by the digit-scorer (full compositional prompts by default)."""
    from jaxpipe.digits import runs
    from jaxpipe.training.flow_grpo import FlowGRPOConfig

    _train_generator(runflags, model, mention, lambda: FlowGRPOConfig(**policyflags.generator(runflags)), runs.flow_grpo_run)


@train_app.command("nft")
@_with(RunFlags)
def train_nft(
    runflags: RunFlags,
    num_steps: int = typer.Option(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation."),
    beta: float = typer.Option(1.0, "--beta", help="NFT step beta in (0, 1]: the implicit policies v± = v_old ± beta·(v_θ − v_old)."),
    adv_clip: float = typer.Option(2.0, "--adv-clip", help="Advantage clip; r = 0.5 + 0.5·A/adv_clip is the optimality weight."),
    ema_start: float = typer.Option(0.0, "--ema-start", help="The old policy's EMA decay at the first update (0: on-policy)."),
    ema_end: float = typer.Option(0.5, "--ema-end", help="The old policy's EMA decay after the ramp."),
    ema_ramp: int = typer.Option(100, "--ema-ramp", help="Updates over which the decay ramps linearly from --ema-start to --ema-end."),
    sampler: str = typer.Option("ode", "--sampler", help="The rollout's sampler: ode (no log-probs needed) or sde."),
    guidance: float = typer.Option(1.0, "--guidance", help="CFG scale of the rollouts."),
    sigma_sampling: str = typer.Option("uniform", "--sigma-sampling", help="How the update re-noises clean samples: uniform or logit_normal."),
    mention: float = typer.Option(1.0, "--mention", help="Probability that a prompt names each rewarded attribute (1 = full compositional prompts)."),
    model: str = typer.Option("flux-t2i", "--model", help="Text-to-image card to train: a bundled id or a card directory."),
) -> None:
    """DiffusionNFT on a text-to-image card: likelihood-free RL on the forward process, digit-scorer reward."""
    from jaxpipe.digits import runs
    from jaxpipe.training.nft import DiffusionNFTConfig

    def config():
        return DiffusionNFTConfig(
            beta=beta, group_size=runflags.group_size, **runflags.rate(), adv_clip=adv_clip, ema_start=ema_start,
            ema_end=ema_end, ema_ramp_steps=ema_ramp, sampler=sampler, num_steps=num_steps, guidance=guidance,
            sigma_sampling=sigma_sampling,
        )

    _train_generator(runflags, model, mention, config, runs.nft_run)


@train_app.command("dmd2")
@_with(RunFlags)
def train_dmd2(
    runflags: RunFlags,
    student_steps: int = typer.Option(2, "--student-steps", help="The student's sampling steps (1 or 2; at most the teacher's)."),
    critic_updates: int = typer.Option(5, "--critic-updates", help="Fake-score critic updates per student update."),
    critic_lr: float = typer.Option(2e-4, "--critic-lr", help="The critic's learning rate (--lr is the student's)."),
    guidance: typing.Optional[float] = typer.Option(None, "--guidance", help="The teacher's (real score's) CFG scale (default: the teacher card's)."),
    mention: float = typer.Option(0.5, "--mention", help="Probability that a training prompt names each attribute."),
    model: str = typer.Option("flux-t2i", "--model", help="Text-to-image teacher card: a bundled id or a card directory."),
) -> None:
    """DMD2: distil a text-to-image card into a 1-2 step student (its card is served like any other)."""
    from jaxpipe.digits import runs
    from jaxpipe.training.dmd2 import DMD2Config

    _train_generator(runflags, model, mention, lambda: DMD2Config(
        student_steps=student_steps, guidance=guidance, critic_updates=critic_updates, samples_per_prompt=runflags.group_size,
        **runflags.rate("student_lr"), critic_lr=critic_lr,
    ), runs.dmd2_run)


@train_app.command("self-forcing")
@_with(RunFlags)
def train_self_forcing(
    runflags: RunFlags,
    teacher: str = typer.Option("wan-t2v", "--teacher", help="Bidirectional text-to-video teacher (the real score): a bundled id or a card directory."),
    critic_steps: typing.Optional[int] = typer.Option(None, "--critic-steps", help="Fake-score critic updates per student update (default: SelfForcingConfig's)."),
    critic_lr: typing.Optional[float] = typer.Option(None, "--critic-lr", help="The critic's learning rate; --lr is the student's (defaults: SelfForcingConfig's)."),
    warmup_steps: typing.Optional[int] = typer.Option(None, "--warmup-steps", help="First steps that train only the critic (default: SelfForcingConfig's)."),
    num_steps: typing.Optional[int] = typer.Option(None, "--num-steps", help="Denoising steps per chunk, in training and in the card it returns (default: the card's)."),
    model: str = typer.Option("wan-causal", "--model", help="Causal (chunk_rollout) card to train: a bundled id or a card directory."),
) -> None:
    """SelfForcing: a causal video card trained on its own chunked rollouts against a bidirectional teacher."""
    from jaxpipe.digits import runs
    from jaxpipe.training.self_forcing import SelfForcingConfig

    flags = runflags

    def config():
        given = {"critic_steps": critic_steps, "critic_learning_rate": critic_lr, "warmup_steps": warmup_steps}
        return None, SelfForcingConfig(num_steps=num_steps, samples_per_prompt=flags.group_size, **flags.rate(),
                                       **{k: v for k, v in given.items() if v is not None})

    def build(card, scorer, cfg, evaluation):
        (real,) = _load(teacher)
        return runs.self_forcing_run(card, real, scorer, cfg[1], prompts_per_step=flags.prompts_per_step, seed=flags.seed,
                                     evaluation=evaluation)

    _train(flags, model, config, build)


@train_app.command("unified")
@_with(RunFlags, PolicyFlags, RefinerFlags)
def train_unified(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    refinerflags: RefinerFlags,
    mention: float = typer.Option(0.5, "--mention", help="Probability that a prompt names each rewarded attribute."),
    prefer: str = typer.Option("", "--prefer", help="Preferred attributes the reward asks for when a prompt leaves them out, e.g. stroke=thick,brightness=bright."),
    model: str = typer.Option("unified", "--model", help="Unified card to train: a bundled id or a card directory."),
) -> None:
    """UnifiedRL: the refiner LM and the generator trained from one reward (--prompt-only: the LM alone)."""
    from jaxpipe.digits import runs
    from jaxpipe.training.unified_rl import UnifiedRLConfig

    flags = runflags

    def config():
        spec = runs.PromptSpec(terms=runs.parse_terms(flags.terms), mention=mention, prefer=runs.parse_preferences(prefer))
        return spec, UnifiedRLConfig(**policyflags.generator(flags), **refinerflags.refiner())

    _train(flags, model, config, lambda card, scorer, cfg, evaluation: runs.unified_run(
        card, scorer, cfg[1], cfg[0], prompts_per_step=flags.prompts_per_step, seed=flags.seed, evaluation=evaluation))


@train_app.command("mot")
@_with(RunFlags, PolicyFlags)
def train_mot(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    skip: int = typer.Option(1, "--skip", help="Samples per group rendered without thinking (0 <= skip < K)."),
    token_weight: float = typer.Option(1.0, "--token-weight", help="Weight of the thinking (token policy-gradient) part of the one summed loss."),
    lm_beta: float = typer.Option(0.01, "--lm-beta", help="k3-KL weight of the thoughts to the frozen reference."),
    mention: float = typer.Option(0.5, "--mention", help="Probability that a prompt names each rewarded attribute."),
    prefer: str = typer.Option("", "--prefer", help="Preferred attributes the reward asks for when a prompt leaves them out, e.g. stroke=thick."),
    model: str = typer.Option("bagel-mot", "--model", help="Mixture-of-Transformers card to train: a bundled id or a card directory."),
) -> None:
    """RL on shared weights: one MoT transformer thinks and generates; one summed update, one optimiser."""
    from jaxpipe.digits import runs
    from jaxpipe.training.mot_rl import MoTRLConfig

    flags = runflags

    def config():
        spec = runs.PromptSpec(terms=runs.parse_terms(flags.terms), mention=mention, prefer=runs.parse_preferences(prefer))
        return spec, MoTRLConfig(**policyflags.generator(flags), skip=skip, token_weight=token_weight, lm_beta=lm_beta)

    _train(flags, model, config, lambda card, scorer, cfg, evaluation: runs.mot_run(
        card, scorer, cfg[1], cfg[0], prompts_per_step=flags.prompts_per_step, seed=flags.seed, evaluation=evaluation))


@train_app.command("joint")
@_with(RunFlags, PolicyFlags, RefinerFlags)
def train_joint(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    refinerflags: RefinerFlags,
    refiners: int = typer.Option(3, "--refiners", "-N", help="Refiner experts (each owns one attribute slot: stroke, position, brightness, cycling)."),
    credit: str = typer.Option("per_expert", "--credit", help="shared (one advantage for every refiner) or per_expert (each refiner's own reward term)."),
    expert_map: str = typer.Option("auto", "--expert-map", help="How the N refiner updates map over the experts: vmap, map (lax.map) or auto (map on one CPU device, vmap on GPU/TPU)."),
    mention: float = typer.Option(0.0, "--mention", help="Probability that a prompt names each rewarded attribute (0: the refiners choose them all)."),
    prefer: str = typer.Option("stroke=thick,position=right,brightness=dim", "--prefer", help="The attribute values the reward prefers when a prompt leaves them out."),
    model: str = typer.Option("unified", "--model", help="Unified card whose LM initialises every refiner (bundled id or directory)."),
) -> None:
    """JointMultiExpertRL: N refiner experts (one vmapped update) and the generator from one reward."""
    from jaxpipe.digits import cards as digit_cards
    from jaxpipe.digits import runs
    from jaxpipe.training.joint_rl import JointRLConfig

    flags = runflags

    def config():
        spec = runs.PromptSpec(terms=runs.parse_terms(flags.terms), mention=mention, prefer=runs.parse_preferences(prefer))
        return spec, JointRLConfig(**policyflags.generator(flags), **refinerflags.refiner(), credit=credit, expert_map=expert_map)

    def build(base, scorer, cfg, evaluation):
        card = digit_cards.multi_expert(base, refiners)
        return runs.joint_run(card, scorer, cfg[1], cfg[0], prompts_per_step=flags.prompts_per_step, seed=flags.seed,
                              evaluation=evaluation)

    _train(flags, model, config, build)


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
