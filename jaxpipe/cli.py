"""The ``jaxpipe`` command line.

    jaxpipe generate "seven thick moving right" -o seven.gif [--seed S] [--steps N] [--model ID]
    jaxpipe evaluate [--samples N] [--guidance G]
    jaxpipe train flow-grpo --steps N --out DIR [...]     # RL on flux-t2i (generator only)
    jaxpipe train unified --steps N --out DIR [...]       # RL on the unified card (refiner LM + generator)
    jaxpipe train joint --steps N --out DIR [...]         # N-way: N refiner experts (one vmap) + generator
    jaxpipe cards
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="jaxpipe: multi-model generative pipelines in JAX.")


train_app = typer.Typer(
    no_args_is_help=True,
    help="RL post-training on the digits world: writes DIR/metrics.jsonl, DIR/*.png, DIR/report.json and the "
    "trained card (jp.cards.load(DIR)).",
)
app.add_typer(train_app, name="train")


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


# ---------------------------------------------------------------------------------------------- train
# Options every `train` subcommand shares. A new method (e.g. `joint`) adds one subcommand: its own
# flags, its config and an `rl_runs.Run` builder, then `_execute` (metrics, curves, report, card).
_STEPS = typer.Option(..., "--steps", help="RL steps (one rollout + one update each).")
_OUT = typer.Option(..., "--out", "-o", help="Output directory: metrics.jsonl, *.png, report.json and the trained card.")
_PROMPTS = typer.Option(4, "--prompts-per-step", "-P", help="Prompts per step (P).")
_GROUP = typer.Option(4, "--group-size", "-K", help="Samples per prompt (K >= 2): the group of the group-relative advantage.")
_NUM_STEPS = typer.Option(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation.")
_WINDOW = typer.Option("0,4", "--sde-window", help="START,STOP: denoise steps sampled with the SDE and trained (ODE elsewhere); 'all' = every step.")
_NOISE = typer.Option(0.7, "--noise-level", help="SDE noise level (eta).")
_LR = typer.Option(1e-4, "--lr", help="Generator (DiT) learning rate.")
_BETA = typer.Option(0.04, "--beta", help="Generator KL weight to the frozen reference DiT.")
_CLIP = typer.Option(1e-3, "--clip-eps", help="Generator PPO ratio clip.")
_TERMS = typer.Option(",".join(("digit", "stroke", "position", "brightness")), "--terms", help="Reward terms, comma-separated: digit,stroke,position,brightness (digit required).")
_SEED = typer.Option(0, "--seed", help="Seed of the prompts and of the rollouts.")
_EVAL = typer.Option(True, "--eval/--no-eval", help="Judge the card before and after (GenEval-style accuracy, diversity).")
_EVAL_SAMPLES = typer.Option(200, "--eval-samples", help="Prompts judged before and after.")
_DIV_PROMPTS = typer.Option(10, "--diversity-prompts", help="Prompts of the diversity measure.")
_DIV_SEEDS = typer.Option(6, "--diversity-seeds", help="Seeds per prompt of the diversity measure (>= 2).")
_EVAL_SEED = typer.Option(0, "--eval-seed", help="Seed of the evaluation prompts and noise (the same before and after).")
_SCORER = typer.Option("digit-scorer", "--scorer", help="Reward model card: a bundled id or a card directory.")


def _window(text: str) -> tuple[int, int] | None:
    if text.strip().lower() in ("all", "none", ""):
        return None
    parts = text.split(",")
    try:
        start, stop = (int(p) for p in parts)
    except ValueError:
        _fail(f"--sde-window must be START,STOP (e.g. 0,4) or 'all' (got {text!r})")
    return start, stop


def _evaluation(run_eval: bool, samples: int, prompts: int, seeds: int, seed: int):
    from jaxpipe.training.rl_runs import EvalSettings

    return EvalSettings(samples=samples, diversity_prompts=prompts, diversity_seeds=seeds, seed=seed) if run_eval else None


def _load(model: str, scorer: str):
    from jaxpipe import cards

    try:
        return cards.load(model), cards.load(scorer)
    except (KeyError, FileNotFoundError, ValueError) as err:
        _fail(str(err).strip('"'))


def _execute(build, steps: int, out: Path, seed: int) -> None:
    """Build the run (``build()``; ValueError = bad settings) and execute it, echoing progress."""
    import jax

    from jaxpipe.training import rl_runs

    try:
        run = build()
    except ValueError as err:
        _fail(str(err))
    typer.echo(f"{run.name}: {steps} steps -> {out} (JAX on {jax.default_backend()})")
    rl_runs.execute(run, steps=steps, out=out, seed=seed, log=typer.echo)


@train_app.command("flow-grpo")
def train_flow_grpo(
    steps: int = _STEPS,
    out: Path = _OUT,
    prompts_per_step: int = _PROMPTS,
    group_size: int = _GROUP,
    num_steps: int = _NUM_STEPS,
    sde_window: str = _WINDOW,
    noise_level: float = _NOISE,
    lr: float = _LR,
    beta: float = _BETA,
    clip_eps: float = _CLIP,
    terms: str = _TERMS,
    mention: float = typer.Option(1.0, "--mention", help="Probability that a prompt names each rewarded attribute (1 = full compositional prompts)."),
    seed: int = _SEED,
    run_eval: bool = _EVAL,
    eval_samples: int = _EVAL_SAMPLES,
    diversity_prompts: int = _DIV_PROMPTS,
    diversity_seeds: int = _DIV_SEEDS,
    eval_seed: int = _EVAL_SEED,
    model: str = typer.Option("flux-t2i", "--model", help="Text-to-image card to train: a bundled id or a card directory."),
    scorer: str = _SCORER,
) -> None:
    """FlowGRPO on a text-to-image card, rewarded by the digit-scorer (full compositional prompts by default)."""
    from jaxpipe.training import rl_runs
    from jaxpipe.training.flow_grpo import FlowGRPOConfig

    if steps <= 0:
        _fail(f"--steps must be a positive integer (got {steps})")
    try:
        spec = rl_runs.PromptSpec(terms=rl_runs.parse_terms(terms), mention=mention)
        config = FlowGRPOConfig(
            group_size=group_size, num_steps=num_steps, noise_level=noise_level, sde_window=_window(sde_window),
            clip_eps=clip_eps, beta=beta, learning_rate=lr,
        )
        evaluation = _evaluation(run_eval, eval_samples, diversity_prompts, diversity_seeds, eval_seed)
    except ValueError as err:
        _fail(str(err))
    card, scorer_card = _load(model, scorer)
    _execute(
        lambda: rl_runs.flow_grpo_run(
            card, scorer_card, config, spec, prompts_per_step=prompts_per_step, seed=seed, evaluation=evaluation
        ),
        steps, out, seed,
    )


@train_app.command("unified")
def train_unified(
    steps: int = _STEPS,
    out: Path = _OUT,
    prompts_per_step: int = _PROMPTS,
    group_size: int = _GROUP,
    skip: int = typer.Option(1, "--skip", help="Samples per group that keep the original prompt (0 <= skip < K)."),
    prompt_only: bool = typer.Option(False, "--prompt-only", help="Train only the refiner LM; the generator stays frozen."),
    num_steps: int = _NUM_STEPS,
    sde_window: str = _WINDOW,
    noise_level: float = _NOISE,
    lr: float = _LR,
    beta: float = _BETA,
    clip_eps: float = _CLIP,
    lm_lr: float = typer.Option(1e-3, "--lm-lr", help="Refiner LM learning rate."),
    lm_beta: float = typer.Option(0.01, "--lm-beta", help="Refiner LM k3-KL weight to the frozen reference LM."),
    terms: str = _TERMS,
    mention: float = typer.Option(0.5, "--mention", help="Probability that a prompt names each rewarded attribute."),
    prefer: str = typer.Option("", "--prefer", help="Preferred attributes the reward asks for when a prompt leaves them out, e.g. stroke=thick,brightness=bright."),
    seed: int = _SEED,
    run_eval: bool = _EVAL,
    eval_samples: int = _EVAL_SAMPLES,
    diversity_prompts: int = _DIV_PROMPTS,
    diversity_seeds: int = _DIV_SEEDS,
    eval_seed: int = _EVAL_SEED,
    model: str = typer.Option("unified", "--model", help="Unified card to train: a bundled id or a card directory."),
    scorer: str = _SCORER,
) -> None:
    """UnifiedRL: the refiner LM and the generator trained from one reward (--prompt-only: the LM alone)."""
    from jaxpipe.training import rl_runs
    from jaxpipe.training.unified_rl import UnifiedRLConfig

    if steps <= 0:
        _fail(f"--steps must be a positive integer (got {steps})")
    try:
        spec = rl_runs.PromptSpec(terms=rl_runs.parse_terms(terms), mention=mention, prefer=rl_runs.parse_preferences(prefer))
        config = UnifiedRLConfig(
            group_size=group_size, skip=skip, joint=not prompt_only, num_steps=num_steps, noise_level=noise_level,
            sde_window=_window(sde_window), clip_eps=clip_eps, beta=beta, learning_rate=lr, lm_learning_rate=lm_lr,
            lm_beta=lm_beta,
        )
        evaluation = _evaluation(run_eval, eval_samples, diversity_prompts, diversity_seeds, eval_seed)
    except ValueError as err:
        _fail(str(err))
    card, scorer_card = _load(model, scorer)
    _execute(
        lambda: rl_runs.unified_run(
            card, scorer_card, config, spec, prompts_per_step=prompts_per_step, seed=seed, evaluation=evaluation
        ),
        steps, out, seed,
    )


@train_app.command("joint")
def train_joint(
    steps: int = _STEPS,
    out: Path = _OUT,
    refiners: int = typer.Option(3, "--refiners", "-N", help="Refiner experts (each owns one attribute slot: stroke, position, brightness, cycling)."),
    credit: str = typer.Option("per_expert", "--credit", help="shared (one advantage for every refiner) or per_expert (each refiner's own reward term)."),
    prompts_per_step: int = _PROMPTS,
    group_size: int = _GROUP,
    skip: int = typer.Option(1, "--skip", help="Samples per group that keep the original prompt (0 <= skip < K)."),
    prompt_only: bool = typer.Option(False, "--prompt-only", help="Train only the refiners; the generator stays frozen."),
    num_steps: int = _NUM_STEPS,
    sde_window: str = _WINDOW,
    noise_level: float = _NOISE,
    lr: float = _LR,
    beta: float = _BETA,
    clip_eps: float = _CLIP,
    lm_lr: float = typer.Option(1e-3, "--lm-lr", help="Refiner learning rate."),
    lm_beta: float = typer.Option(0.01, "--lm-beta", help="Refiner k3-KL weight to its frozen reference."),
    terms: str = _TERMS,
    mention: float = typer.Option(0.0, "--mention", help="Probability that a prompt names each rewarded attribute (0: the refiners choose them all)."),
    prefer: str = typer.Option("stroke=thick,position=right,brightness=dim", "--prefer", help="The attribute values the reward prefers when a prompt leaves them out."),
    seed: int = _SEED,
    run_eval: bool = _EVAL,
    eval_samples: int = _EVAL_SAMPLES,
    diversity_prompts: int = _DIV_PROMPTS,
    diversity_seeds: int = _DIV_SEEDS,
    eval_seed: int = _EVAL_SEED,
    model: str = typer.Option("unified", "--model", help="Unified card whose LM initialises every refiner (bundled id or directory)."),
    scorer: str = _SCORER,
) -> None:
    """JointMultiExpertRL: N refiner experts (one vmapped update) and the generator from one reward."""
    from jaxpipe.cards import multi_expert
    from jaxpipe.training import rl_runs
    from jaxpipe.training.joint_rl import JointRLConfig

    if steps <= 0:
        _fail(f"--steps must be a positive integer (got {steps})")
    try:
        spec = rl_runs.PromptSpec(terms=rl_runs.parse_terms(terms), mention=mention, prefer=rl_runs.parse_preferences(prefer))
        config = JointRLConfig(
            group_size=group_size, skip=skip, joint_generator=not prompt_only, credit=credit, num_steps=num_steps,
            noise_level=noise_level, sde_window=_window(sde_window), clip_eps=clip_eps, beta=beta, learning_rate=lr,
            lm_learning_rate=lm_lr, lm_beta=lm_beta,
        )
        evaluation = _evaluation(run_eval, eval_samples, diversity_prompts, diversity_seeds, eval_seed)
    except ValueError as err:
        _fail(str(err))
    base, scorer_card = _load(model, scorer)
    try:
        card = multi_expert.from_unified(base, refiners)
    except ValueError as err:
        _fail(str(err))
    _execute(
        lambda: rl_runs.joint_run(card, scorer_card, config, spec, prompts_per_step=prompts_per_step, seed=seed, evaluation=evaluation),
        steps, out, seed,
    )


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
