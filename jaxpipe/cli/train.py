"""``jaxpipe train <method>``: RL post-training and distillation, on a world (digits by default) or on your own card,
prompts and reward.

    jaxpipe train flow-grpo --steps N --out DIR                           # the digits world's flux-t2i, digit-scorer reward
    jaxpipe train nft --world shapes --steps 150 --out DIR                # shapes-t2i, GenEval reward, preset geneval
    jaxpipe train flow-grpo --steps N --out DIR --model FLUX_DIR \\
        --prompts prompts.txt --reward my_rewards:brightness [--reward-weight 1.0]    # your card, prompts and reward

Every command writes ``DIR/metrics.jsonl`` (one JSON object per step), ``DIR/*.png`` (curves),
``DIR/report.json`` and the trained card (``jp.cards.load(DIR)``). Without ``--prompts`` / ``--reward`` the run is
the one ``--world`` registered for the method (``jaxpipe.training.runs.recipes``): its card, prompts, reward,
evaluation and default preset — the digits world's prompt grammar, the ``digit-scorer``'s reward over ``--terms``
and independent judges beside it; the shapes world's GenEval reward and GenEval's table on the test prompts
and held-out colour-shape pairs. With ``--reward`` (a JAX function or a ``@jaxpipe.rewards.host`` one; repeat
it to combine several, ``--reward-weight`` each) and ``--prompts`` (a ``.txt`` file, one prompt per line, or
``.jsonl`` with per-prompt metadata; a ``--heldout`` fraction held out), the card is judged before and after on
the held-out prompts by that reward (``jaxpipe.training.runs.heldout``).
``flow-grpo``, ``nft``, ``dmd2`` and ``unified`` take ``--lora-rank N`` (``--lora-alpha``, ``--lora-targets``):
LoRA adapters on the denoiser train instead of all its weights (``jaxpipe.nn.lora``); the saved card has
them merged into the base weights, so it loads and serves like any other.

Flags shared by commands are declared once, as fields of a dataclass whose metadata is the typer
option; ``_with(*groups)`` adds a group's flags to a command's signature and hands the command one
object per group. A new method is one subcommand (its own flags and config) and, per world, one recipe.
"""

from __future__ import annotations

import dataclasses
import inspect
import shlex
import sys
import typing
from pathlib import Path

import typer

from jaxpipe.cli.common import discard_if_empty, fail, load, parse_options, writable_folder

__all__ = ["train_app", "RunFlags", "PolicyFlags", "RefinerFlags", "LoRAFlags", "FAILED_EXIT"]

train_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
    help="RL post-training and distillation (the digits world by default; --world shapes; --model/--prompts/--reward for your own): "
    "writes DIR/metrics.jsonl, DIR/*.png, DIR/report.json and the trained card (jp.cards.load(DIR)).",
)

FAILED_EXIT = 3
"""``jaxpipe train``'s exit status when the run finished but its verdict is FAILED (mode collapse)."""


def _flag(default, *names: str, help: str):
    metadata = {"option": typer.Option(default, *names, help=help)}
    if isinstance(default, list):  # a repeatable flag
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class RunFlags:
    """Every training command: run length, output, batch shape, learning rate, prompts, reward, evaluation."""

    steps: int = _flag(..., "--steps", help="Training steps (one rollout + one update each).")
    out: Path = _flag(
        ...,
        "--out",
        "-o",
        help="Output directory (created if missing): metrics.jsonl, *.png, report.json and the trained card.",
    )
    prompts_per_step: int = _flag(4, "--prompts-per-step", "-P", help="Prompts per step (P).")
    group_size: int = _flag(
        4, "--group-size", "-K", help="Samples per prompt (K; RL: the group of the group-relative advantage, K >= 2)."
    )
    lr: float | None = _flag(
        None, "--lr", help="Learning rate of the trained generator / student (default: the method's)."
    )
    model_option: list[str] = _flag(
        [],
        "--model-option",
        help="KEY=VALUE for the loader of a diffusers --model folder (e.g. height=512, width=512, max_sequence_length=128, dtype=bfloat16); repeatable.",
    )
    prompts: Path | None = _flag(
        None,
        "--prompts",
        help='Your prompts: a .txt file (one per line) or .jsonl ({"prompt": ..., numeric metadata}); default: the digits world\'s prompt grammar.',
    )
    heldout: float = _flag(
        0.1, "--heldout", help="Fraction of --prompts held out to judge the card before and after (split by --seed)."
    )
    reward: list[str] = _flag(
        [],
        "--reward",
        help="Your reward: module:function or path/to/file.py:function, reward(artifacts, prompts) -> (B,), a JAX function or a @jaxpipe.rewards.host one; or a reward model folder: pickscore:DIR, clipscore:DIR, aesthetic:DIR; repeat to combine. Default: the digit-scorer over --terms.",
    )
    reward_weight: list[float] = _flag(
        [], "--reward-weight", help="The weight of each --reward, in order (default 1 each)."
    )
    world: str = _flag(
        "digits",
        "--world",
        help="The world whose run to train: its default card, prompts, reward, evaluation and preset (digits, shapes; jaxpipe.training.runs.recipes).",
    )
    terms: str | None = _flag(
        None,
        "--terms",
        help="Digits world: the digit-scorer's reward terms, comma-separated: digit,stroke,position,brightness (digit required; default all four).",
    )
    mention: float | None = _flag(
        None,
        "--mention",
        help="Digits world: probability that a prompt names each rewarded attribute (default: the method's; 1 = full compositional prompts).",
    )
    prefer: str | None = _flag(
        None,
        "--prefer",
        help="Digits world: the attribute values the reward asks for when a prompt leaves them out, e.g. stroke=thick,brightness=bright.",
    )
    world_reward: str | None = _flag(
        None,
        "--world-reward",
        help="Shapes world: the reward, geneval (FlowGRPO's rule-based GenEval reward, the default) or judge.",
    )
    seed: int = _flag(0, "--seed", help="Seed of the prompts and of the rollouts.")
    run_eval: bool = _flag(
        True,
        "--eval/--no-eval",
        help="Judge the card before and after (digits: GenEval-style accuracy by the scorer and by independent judges, diversity; --reward: the held-out reward, diversity).",
    )
    eval_samples: int | None = _flag(
        None,
        "--eval-samples",
        help="How much is judged before and after: prompts (digits and --prompts: default 200), prompts per category (shapes: default 24).",
    )
    diversity_prompts: int = _flag(10, "--diversity-prompts", help="Prompts of the diversity measure.")
    diversity_seeds: int = _flag(6, "--diversity-seeds", help="Seeds per prompt of the diversity measure (>= 2).")
    eval_seed: int = _flag(
        0, "--eval-seed", help="Seed of the evaluation prompts and noise (the same before and after)."
    )
    scorer: str | None = _flag(
        None,
        "--scorer",
        help="Digits world: the reward model card, a bundled id or a card directory (default digit-scorer).",
    )
    save_every: int = _flag(
        50, "--save-every", help="Checkpoint the training state every N steps (and always on a stop)."
    )
    resume: bool = _flag(
        False,
        "--resume",
        help="Continue the run in --out from its newest readable checkpoint (same settings; a finished run is left as it is).",
    )
    overwrite: bool = _flag(False, "--overwrite", help="Replace the run in a non-empty --out instead of refusing.")
    snr_rollouts: int | None = _flag(
        None,
        "--snr-rollouts",
        help="Measure the gradient signal-to-noise of the configured batch over N rollouts at the start (warns, with the batch that would do, when it is low); 0: off. Default: 4 for flow-grpo and nft, else 0.",
    )
    eval_every: int | None = _flag(
        None,
        "--eval-every",
        help="Judge the card every N steps as well as before and after: DIR/evaluations.jsonl, DIR/evaluation.png (needs --eval).",
    )
    typed: dict[str, str] = dataclasses.field(default_factory=dict)
    """The command's flags as the user types them (set by ``_with``; ``_typed_flags``)."""

    @property
    def custom(self) -> bool:
        """Whether the run trains on the user's prompts and reward instead of a world's."""
        return bool(self.reward) or self.prompts is not None

    def optimizer(self, default):
        """``default`` (an ``Optimizer``) at ``--lr`` when the flag is given."""
        return default if self.lr is None else dataclasses.replace(default, learning_rate=self.lr)

    def group(self, **changes):
        """The run's ``Group``: ``--group-size`` samples per prompt.

        Args:
          **changes: other ``Group`` fields, e.g. ``adv_clip``.

        Returns:
          ``Group(self.group_size, **changes)``.

        Raises:
          ValueError: if a field is out of range (``Group``'s check, e.g. ``--group-size`` < 1).
        """
        from jaxpipe.training import Group

        return Group(self.group_size, **changes)

    def user_reward(self):
        """The ``--reward`` s, combined with their ``--reward-weight`` s (``None`` without ``--reward``)."""
        from jaxpipe import rewards

        if not self.reward:
            if self.reward_weight:
                raise ValueError("--reward-weight needs --reward")
            return None
        if self.reward_weight and len(self.reward_weight) != len(self.reward):
            raise ValueError(
                f"give one --reward-weight per --reward ({len(self.reward)}), or none (got {len(self.reward_weight)})"
            )
        names = [rewards.spec_name(spec) for spec in self.reward]  # a reward model by its kind, not its directory
        if len(set(names)) != len(names):
            raise ValueError(f"two --reward s share a name ({self.reward} are named {names}); rename one")
        loaded = {name: rewards.load(spec) for name, spec in zip(names, self.reward)}
        weights = dict(zip(loaded, self.reward_weight)) if self.reward_weight else {}
        if len(loaded) == 1 and weights in ({}, {next(iter(loaded)): 1.0}):
            return next(iter(loaded.values()))
        return rewards.combine(loaded, weights)

    def user_prompts(self):
        """``(train, heldout)`` ``PromptSet`` s of ``--prompts`` (``heldout`` is ``None`` for a single prompt)."""
        from jaxpipe import prompts

        if self.prompts is None:
            raise ValueError("--reward needs --prompts FILE: the prompts your reward scores (one per line, or .jsonl)")
        everything = prompts.read(self.prompts)
        if len(everything) < 2 or not self.run_eval:
            return everything, None
        return everything.split(self.heldout, seed=self.seed)

    def settings(self, **options):
        """The ``RunSettings`` of a world's run: these flags, and the world options the user set (not ``None``).

        Args:
          **options: the command's own world options (e.g. ``teacher``), ``None`` where not given.

        Returns:
          The settings (``recipes.RunSettings``).

        Raises:
          ValueError: if a number is out of range (``RunSettings``' checks).
        """
        from jaxpipe.training.runs.recipes import RunSettings

        given = {
            "terms": self.terms,
            "mention": self.mention,
            "prefer": self.prefer,
            "scorer": self.scorer,
            "reward": self.world_reward,
            **options,
        }
        return RunSettings(
            prompts_per_step=self.prompts_per_step,
            seed=self.seed,
            evaluate=self.run_eval,
            eval_samples=self.eval_samples,
            diversity_prompts=self.diversity_prompts,
            diversity_seeds=self.diversity_seeds,
            eval_seed=self.eval_seed,
            options={name: value for name, value in given.items() if value is not None},
        )

    def held_out(self):
        """The held-out evaluation of a run on the user's prompts (``None`` with ``--no-eval``)."""
        from jaxpipe.training.runs.heldout import HeldOut

        if not self.run_eval:
            return None
        return HeldOut(
            samples=200 if self.eval_samples is None else self.eval_samples,
            diversity_prompts=self.diversity_prompts,
            diversity_seeds=self.diversity_seeds,
            seed=self.eval_seed,
        )


@dataclasses.dataclass
class PolicyFlags:
    """The policy-gradient commands (FlowGRPO and the methods built on it): SDE rollouts, PPO, KL."""

    num_steps: int = _flag(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation.")
    sde_window: str = _flag(
        "0,4",
        "--sde-window",
        help="START,STOP: denoise steps sampled with the SDE and trained (ODE elsewhere); 'all' = every step.",
    )
    noise_level: float = _flag(0.7, "--noise-level", help="SDE noise level (eta).")
    beta: float = _flag(0.04, "--beta", help="Generator KL weight to the frozen reference DiT.")
    kl: str = _flag(
        "exact",
        "--kl",
        help="Generator KL convention: exact (Gaussian KL of the SDE step) or flowgrpo (the official code's: exact x |dt|).",
    )
    clip_eps: float = _flag(1e-3, "--clip-eps", help="Generator PPO ratio clip.")
    minibatches: int = _flag(
        1,
        "--minibatches",
        help="Updates per epoch over each rollout: its P·K rows split into this many shuffled minibatches.",
    )
    inner_epochs: int = _flag(
        1,
        "--inner-epochs",
        help="Passes over each rollout's minibatches (updates per rollout = minibatches × inner epochs).",
    )
    timestep_fraction: float = _flag(
        1.0,
        "--timestep-fraction",
        help="Fraction (0, 1] of the captured denoising steps each minibatch trains on, drawn per sample.",
    )

    def generator(self, run: RunFlags, lora=None):
        """The generator's ``FlowGRPOConfig`` (``lora``: its ``LoRAConfig``, ``LoRAFlags.config``)."""
        from jaxpipe.training import FlowGRPOConfig, Sampling
        from jaxpipe.training.ppo import Schedule

        config = FlowGRPOConfig(
            group=run.group(),
            sampling=Sampling(
                num_steps=self.num_steps,
                sampler="sde",
                noise_level=self.noise_level,
                sde_window=_window(self.sde_window),
            ),
            clip_eps=self.clip_eps,
            beta=self.beta,
            kl=self.kl,
            ppo=Schedule(self.minibatches, self.inner_epochs, self.timestep_fraction),
            optimizer=run.optimizer(FlowGRPOConfig().optimizer),
            lora=lora,
        )
        config.ppo.check_rows(run.prompts_per_step * run.group_size)  # before any card loads
        return config


@dataclasses.dataclass
class RefinerFlags:
    """Commands that train refiner LMs next to the generator."""

    skip: int = _flag(1, "--skip", help="Samples per group that keep the original prompt (0 <= skip < K).")
    prompt_only: bool = _flag(False, "--prompt-only", help="Train only the refiner(s); the generator stays frozen.")
    lm_lr: float = _flag(1e-3, "--lm-lr", help="Refiner learning rate.")
    lm_beta: float = _flag(0.01, "--lm-beta", help="Refiner k3-KL weight to its frozen reference.")

    def joint(self, policy: PolicyFlags, run: RunFlags, lora=None, **changes):
        """The ``JointRLConfig`` of the refiner and generator flags (``lora``: the generator's ``LoRAConfig``)."""
        from jaxpipe.training import JointRLConfig, Optimizer, RefinerConfig

        return JointRLConfig(
            generator=policy.generator(run, lora),
            refiner=RefinerConfig(skip=self.skip, beta=self.lm_beta),
            refiner_optimizer=Optimizer(self.lm_lr),
            joint=not self.prompt_only,
            **changes,
        )


@dataclasses.dataclass
class LoRAFlags:
    """The denoiser-training commands: train LoRA adapters on the denoiser instead of all its weights."""

    lora_rank: int = _flag(
        0,
        "--lora-rank",
        help="Train rank-N LoRA adapters on the denoiser, its base weights frozen; the trained card has them merged (0: off, train every weight).",
    )
    lora_alpha: float | None = _flag(
        None, "--lora-alpha", help="LoRA alpha: the adapters are scaled by alpha/rank (default: the rank, scale 1)."
    )
    lora_targets: str | None = _flag(
        None,
        "--lora-targets",
        help="Comma-separated layer names the adapters wrap, matched against the end of each layer's name like peft's target_modules, e.g. to_q,to_k,to_v,to_out.0 (default: the network's own: FLUX's attention and feed-forward projections, the DiT's attention and MLP).",
    )

    def config(self):
        """The ``LoRAConfig`` of the flags (``None`` without ``--lora-rank``).

        Returns:
          The adapters' settings, or ``None``.

        Raises:
          ValueError: on a negative rank, ``--lora-alpha`` / ``--lora-targets`` without a rank, or bad values.
        """
        from jaxpipe.nn.lora import LoRAConfig

        if self.lora_rank < 0:
            raise ValueError(f"--lora-rank must be >= 0 (0: no adapters; got {self.lora_rank})")
        if self.lora_rank == 0:
            if self.lora_alpha is not None or self.lora_targets is not None:
                raise ValueError(
                    "--lora-alpha and --lora-targets set up LoRA adapters: they need --lora-rank N (N >= 1)"
                )
            return None
        targets = None
        if self.lora_targets is not None:
            targets = tuple(t.strip() for t in self.lora_targets.split(",") if t.strip())
            if not targets:
                raise ValueError(f"--lora-targets must name layers, comma-separated (got {self.lora_targets!r})")
        return LoRAConfig(self.lora_rank, alpha=self.lora_alpha, target_modules=targets)


def _options(group: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(group) if "option" in f.metadata]


def _with(*groups: type):
    """Add the flags of dataclasses ``groups`` to a command; it receives one instance per group (by
    the group's lowercase name, e.g. ``runflags``) and its own parameters."""

    def wrap(command):
        names = {g.__name__.lower() for g in groups}
        hints = typing.get_type_hints(command)
        own = [
            p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command).parameters.values()
            if p.name not in names
        ]
        shared = []
        for group in groups:
            types = typing.get_type_hints(group)
            shared += [
                inspect.Parameter(
                    f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["option"], annotation=types[f.name]
                )
                for f in _options(group)
            ]
        decls = {p.name: p.default.param_decls for p in [*shared, *own]}

        def run(**kwargs):
            typed = _typed_flags(kwargs, decls)
            packed = {g.__name__.lower(): g(**{f.name: kwargs.pop(f.name) for f in _options(g)}) for g in groups}
            if "runflags" in packed:
                packed["runflags"].typed = typed
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
        fail(f"--sde-window must be START,STOP (e.g. 0,4) or 'all' (got {text!r})")
    return start, stop


def _resume_command() -> str:
    args = ["jaxpipe", *sys.argv[1:]]
    args = [a for a in args if a != "--overwrite"]
    return " ".join(shlex.quote(a) for a in args + ([] if "--resume" in args else ["--resume"]))


_NOT_SETTINGS = ("out", "steps", "save_every", "resume", "overwrite", "snr_rollouts", "eval_every")
"""The flags a resumed run may change: where it is, how long it runs, how often it saves, how it starts, what
it measures on the way."""

SNR_BY_DEFAULT = ("flow-grpo", "nft")
"""The commands that measure the gradient signal-to-noise unless told not to (``--snr-rollouts 0``)."""


def _typed(value) -> str:
    if value is None:
        return "(default)"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "(none)"
    return str(value)


def _typed_flags(values: dict, decls: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """A command's flag ``values`` as a user types them, by their option names ``decls``
    (``{"--sde-window": "0,1", "--eval/--no-eval": "--no-eval"}``), but ``_NOT_SETTINGS``: recorded
    with the run, so a resume with other settings names each flag that differs."""
    typed = {}
    for key, names in decls.items():
        if key in _NOT_SETTINGS or key not in values:
            continue
        name, value = max(names, key=len), values[key]
        if "/" in name:  # --eval/--no-eval: the one given
            on, off = name.split("/", 1)
            typed[name] = on if value else off
        elif isinstance(value, bool):
            typed[name] = "given" if value else "not given"
        else:
            typed[name] = _typed(value)
    return typed


OPTION_FLAGS = {
    "terms": "--terms",
    "mention": "--mention",
    "prefer": "--prefer",
    "scorer": "--scorer",
    "reward": "--world-reward",
    "teacher": "--teacher",
    "refiners": "--refiners",
}
"""World option -> the flag that sets it."""


def _flag_of(option: str) -> str:
    return OPTION_FLAGS.get(option, option)


def _train(
    flags: RunFlags,
    command: str,
    model: str | None,
    make_config,
    method=None,
    *,
    preset: str | None = None,
    options: dict | None = None,
    needs_reward: bool = True,
) -> None:
    """Validate the settings, load the card, build the run and execute it, echoing progress.

    Without ``--prompts`` / ``--reward`` the run is the one world ``--world`` registered for ``command``
    (``jaxpipe.training.runs.recipes``): its card (unless ``--model``), its preset (unless ``--preset``;
    ``--preset none``: the method flags), prompts, reward and evaluation. With them, the user's
    (``method(card, reward, config)``, judged on the held-out prompts). ``make_config(preset)`` builds the
    method's config (``preset``: a preset name or ``None``; ValueError = bad settings). SIGINT / SIGTERM stop it
    after the current step: checkpoint, report and curves so far, exit 130 / 143. ``--out`` is created up
    front: one that cannot be written fails before any work. The typed flags are recorded with the run:
    ``--resume`` with other settings names each that differs; ``--resume`` on a run that already finished
    says so and changes nothing."""
    import time

    import jax

    from jaxpipe.stopping import Stopper, exit_code
    from jaxpipe.training.runs import execute, finished, recipes

    started = time.perf_counter()

    if flags.steps <= 0:
        fail(f"--steps must be a positive integer (got {flags.steps})")
    if flags.save_every <= 0:
        fail(f"--save-every must be a positive integer (got {flags.save_every})")
    snr_rollouts = flags.snr_rollouts if flags.snr_rollouts is not None else (4 if command in SNR_BY_DEFAULT else 0)
    if snr_rollouts < 0 or snr_rollouts == 1:
        fail(f"--snr-rollouts must be 0 (off) or >= 2 (got {snr_rollouts})")
    if flags.eval_every is not None and (flags.eval_every <= 0 or not flags.run_eval):
        fail(f"--eval-every must be a positive number of steps, with --eval (got {flags.eval_every})")
    if flags.resume and flags.overwrite:
        fail("--resume continues the run in --out and --overwrite replaces it: pass one of them")
    if flags.custom and method is None:
        fail(f"train {command} runs on a world's cards only (no --prompts / --reward)")
    chosen = None
    try:
        recipe = recipes.recipe(flags.world, command)
    except ValueError as err:
        if not flags.custom or model is None:
            fail(f"--world {flags.world}: {err}")
        recipe = None
    try:
        settings = flags.settings(**(options or {}))
        if not flags.custom:
            recipe.check(settings, flag=_flag_of)  # bad world options fail before any card loads
        chosen = preset if preset is not None or flags.custom else recipe.preset
        config = make_config(None if chosen == "none" else chosen)
        reward = flags.user_reward()
        if flags.custom and reward is None and needs_reward:
            raise ValueError("--prompts needs --reward module:function (the reward the run maximises)")
        user = flags.user_prompts() if flags.custom else None
    except (ValueError, FileNotFoundError) as err:
        if preset is None and chosen not in (None, "none") and "--preset" in str(err):
            fail(f"{err}; the {flags.world} world trains {command} with --preset {chosen} unless told otherwise")
        fail(str(err))
    model = model if model is not None else recipe.model
    out = Path(flags.out)
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a directory")
    if not flags.resume and not flags.overwrite and out.is_dir() and any(out.iterdir()):
        fail(f"{out} is not empty: pass --resume to continue the run in it, or --overwrite to replace it")
    created = writable_folder(out, "--out")  # before any card loads: an output that cannot be written fails now
    with Stopper() as stop:
        try:
            (card,) = load(model, options=parse_options(flags.model_option))
            if flags.custom:
                from jaxpipe.training.runs.heldout import custom_run

                train, heldout = user
                run = custom_run(
                    command,
                    method(card, reward, config),
                    card,
                    train,
                    prompts_per_step=flags.prompts_per_step,
                    seed=flags.seed,
                    config=config,
                    reward=reward,
                    heldout=heldout,
                    evaluation=flags.held_out(),
                )
            else:
                run = recipe.build(card, config, settings)
        except (ValueError, FileNotFoundError) as err:
            discard_if_empty(out, created)
            fail(str(err))
        except typer.Exit:  # a card that would not load (``load`` has said why)
            discard_if_empty(out, created)
            raise
        if flags.resume:
            try:
                done = finished(out, run, steps=flags.steps, seed=flags.seed, flags=flags.typed)
            except ValueError as err:  # another run's settings: named, flag by flag
                fail(str(err))
            if done is not None:
                typer.echo(
                    f"{run.name}: the run in {out} already finished ({flags.steps} steps), nothing to resume; "
                    f"its report: {out / 'report.json'}"
                )
                return
        where = "your prompts" if flags.custom else f"the {flags.world} world"
        how = f", preset {chosen}" if chosen not in (None, "none") else ""
        typer.echo(f"{run.name}: {flags.steps} steps on {where}{how} -> {out} (JAX on {jax.default_backend()})")
        try:
            report = execute(
                run,
                steps=flags.steps,
                out=out,
                seed=flags.seed,
                log=typer.echo,
                save_every=flags.save_every,
                resume=flags.resume,
                overwrite=flags.overwrite,
                should_stop=stop,
                flags=flags.typed,
                gradient_snr=snr_rollouts,
                eval_every=flags.eval_every,
                started=started,
            )
        except ValueError as err:
            fail(str(err))
    if report["status"] == "stopped":
        typer.echo(
            f"stopped after step {report['completed_steps']} of {report['steps']}: checkpoint, metrics, curves and "
            f"report.json in {out}\nresume with: {_resume_command()}"
        )
        raise typer.Exit(code=exit_code(stop.signum) if stop.signum else 130)
    if report.get("summary", {}).get("diversity_collapse"):
        raise typer.Exit(code=FAILED_EXIT)


def _preset(method: str, name: str, runflags: RunFlags, *groups: object, **own: tuple) -> object:
    """The config of preset ``name`` of ``method`` (``jaxpipe.training.presets``), refusing method flags set beside it.

    A preset fixes the method's settings (K, steps, learning rate, LoRA ...); the run flags (steps, out,
    prompts per step, seed, evaluation, model, prompts and reward) still apply. ``groups`` are flag
    groups that must be at their defaults; ``own`` maps a command's own flag to ``(value, default)``.

    Raises:
      ValueError: for an unknown preset, or a method flag set away from its default beside ``--preset``.
    """
    from jaxpipe.training import presets

    preset = presets.get(method, name)
    changed = [
        f.metadata["option"].param_decls[0]
        for group in groups
        for f in _options(type(group))
        if getattr(group, f.name) != f.default
    ]
    changed += [flag for flag, (value, default) in own.items() if value != default]
    if runflags.lr is not None:
        changed.append("--lr")
    if runflags.group_size != RunFlags.group_size:
        changed.append("--group-size")
    if changed:
        raise ValueError(
            f"--preset {name} sets the method's settings; drop {', '.join(changed)} "
            "(or pass --preset none and set them all)"
        )
    return preset.config


_MODEL_HELP = "The card to train: a bundled id, a card directory or a diffusers folder (default: the world's, {})."
_PRESET_HELP = "An official recipe instead of the method flags ({}); none: the method flags. Default: the world's ({})."


@train_app.command("flow-grpo")
@_with(RunFlags, PolicyFlags, LoRAFlags)
def train_flow_grpo(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    loraflags: LoRAFlags,
    model: str | None = typer.Option(None, "--model", help=_MODEL_HELP.format("digits: flux-t2i, shapes: shapes-t2i")),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=_PRESET_HELP.format(
            "geneval: FlowGRPO's geneval_sd3, CFG in the policy, K 24, LoRA r 32, AdamW 3e-4, EMA evaluation; "
            "fast-nocfg: FlowGRPO-Fast at guidance 1",
            "shapes: fast-nocfg; digits: none",
        ),
    ),
) -> None:
    """FlowGRPO on a text-to-image card (digits: the digit-scorer reward; shapes: the GenEval reward)."""
    from jaxpipe.training import FlowGRPO

    def config(chosen):
        if chosen is not None:
            return _preset("flow-grpo", chosen, runflags, policyflags, loraflags)
        return policyflags.generator(runflags, loraflags.config())

    _train(runflags, "flow-grpo", model, config, FlowGRPO, preset=preset)


@train_app.command("nft")
@_with(RunFlags, LoRAFlags)
def train_nft(
    runflags: RunFlags,
    loraflags: LoRAFlags,
    num_steps: int = typer.Option(8, "--num-steps", help="Denoising steps of the rollout and of the evaluation."),
    beta: float = typer.Option(
        1.0, "--beta", help="NFT step beta in (0, 1]: the implicit policies v± = v_old ± beta·(v_θ − v_old)."
    ),
    adv_clip: float = typer.Option(
        2.0, "--adv-clip", help="Advantage clip; r = 0.5 + 0.5·A/adv_clip is the optimality weight."
    ),
    ema_start: float = typer.Option(
        0.0, "--ema-start", help="The old policy's EMA decay at the first update (0: on-policy)."
    ),
    ema_end: float = typer.Option(0.5, "--ema-end", help="The old policy's EMA decay after the ramp."),
    ema_ramp: int = typer.Option(
        100, "--ema-ramp", help="Updates over which the decay ramps linearly from --ema-start to --ema-end."
    ),
    sampler: str = typer.Option("ode", "--sampler", help="The rollout's sampler: ode (no log-probs needed) or sde."),
    guidance: float = typer.Option(1.0, "--guidance", help="CFG scale of the rollouts."),
    sigma_sampling: str = typer.Option(
        "uniform", "--sigma-sampling", help="How the update re-noises clean samples: uniform or logit_normal."
    ),
    model: str | None = typer.Option(None, "--model", help=_MODEL_HELP.format("digits: flux-t2i, shapes: shapes-t2i")),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help=_PRESET_HELP.format(
            "geneval: DiffusionNFT's sd3_geneval, CFG-free, K 24, 9 levels per sample, adaptive weighting, "
            "KL 1e-4, LoRA r 32, AdamW 3e-4, EMA evaluation",
            "geneval on both worlds",
        ),
    ),
) -> None:
    """DiffusionNFT on a text-to-image card: likelihood-free RL on the forward process."""
    from jaxpipe.training import EMA, DiffusionNFT, DiffusionNFTConfig, NoiseLevels, Sampling

    def config(chosen):
        if chosen is not None:
            own = {
                "--num-steps": (num_steps, 8),
                "--beta": (beta, 1.0),
                "--adv-clip": (adv_clip, 2.0),
                "--ema-start": (ema_start, 0.0),
                "--ema-end": (ema_end, 0.5),
                "--ema-ramp": (ema_ramp, 100),
                "--sampler": (sampler, "ode"),
                "--guidance": (guidance, 1.0),
                "--sigma-sampling": (sigma_sampling, "uniform"),
            }
            return _preset("nft", chosen, runflags, loraflags, **own)
        return DiffusionNFTConfig(
            group=runflags.group(adv_clip=adv_clip),
            sampling=Sampling(num_steps=num_steps, sampler=sampler, guidance=guidance),
            beta=beta,
            ema=EMA(ema_start, ema_end, ema_ramp),
            noise=NoiseLevels(sigma_sampling),
            optimizer=runflags.optimizer(DiffusionNFTConfig().optimizer),
            lora=loraflags.config(),
        )

    _train(runflags, "nft", model, config, DiffusionNFT, preset=preset)


def _no_preset(method: str, make):
    """A config maker for a method without presets."""

    def config(chosen):
        if chosen is not None:
            raise ValueError(f"{method} has no presets (got --preset {chosen})")
        return make()

    return config


@train_app.command("dmd2")
@_with(RunFlags, LoRAFlags)
def train_dmd2(
    runflags: RunFlags,
    loraflags: LoRAFlags,
    student_steps: int = typer.Option(
        2, "--student-steps", help="The student's sampling steps (1 or 2; at most the teacher's)."
    ),
    critic_steps: int = typer.Option(5, "--critic-steps", help="Fake-score critic updates per student update."),
    critic_lr: float = typer.Option(2e-4, "--critic-lr", help="The critic's learning rate (--lr is the student's)."),
    guidance: float | None = typer.Option(
        None, "--guidance", help="The teacher's (real score's) CFG scale (default: the teacher card's)."
    ),
    model: str | None = typer.Option(None, "--model", help=_MODEL_HELP.format("digits: flux-t2i")),
) -> None:
    """DMD2: distil a text-to-image card into a 1-2 step student (its card is served like any other)."""
    from jaxpipe.training import DMD2, DistributionMatching, DMD2Config

    def config():
        base = DMD2Config()
        dm = DistributionMatching(
            critic=dataclasses.replace(base.dm.critic, learning_rate=critic_lr),
            critic_steps=critic_steps,
            real_guidance=guidance,
        )
        return DMD2Config(
            student_steps=student_steps,
            group=runflags.group(),
            student=runflags.optimizer(base.student),
            dm=dm,
            lora=loraflags.config(),
        )

    _train(
        runflags,
        "dmd2",
        model,
        _no_preset("dmd2", config),
        lambda card, reward, cfg: DMD2(card, cfg),
        needs_reward=False,
    )


@train_app.command("self-forcing")
@_with(RunFlags)
def train_self_forcing(
    runflags: RunFlags,
    teacher: str | None = typer.Option(
        None,
        "--teacher",
        help="Bidirectional text-to-video teacher (the real score): a bundled id or a card directory (default wan-t2v).",
    ),
    critic_steps: int | None = typer.Option(
        None, "--critic-steps", help="Fake-score critic updates per student update (default: SelfForcingConfig's)."
    ),
    critic_lr: float | None = typer.Option(
        None, "--critic-lr", help="The critic's learning rate; --lr is the student's (defaults: SelfForcingConfig's)."
    ),
    critic_warmup: int | None = typer.Option(
        None, "--critic-warmup", help="First steps that train only the critic (default: SelfForcingConfig's)."
    ),
    num_steps: int | None = typer.Option(
        None,
        "--num-steps",
        help="Denoising steps per chunk, in training and in the card it returns (default: the card's).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Causal (chunk_rollout) card to train: a bundled id or a card directory (default wan-causal).",
    ),
) -> None:
    """SelfForcing: a causal video card trained on its own chunked rollouts against a bidirectional teacher."""
    from jaxpipe.training import Sampling, SelfForcing, SelfForcingConfig

    def config():
        base = SelfForcingConfig()
        dm = dataclasses.replace(
            base.dm,
            critic=base.dm.critic
            if critic_lr is None
            else dataclasses.replace(base.dm.critic, learning_rate=critic_lr),
            critic_steps=base.dm.critic_steps if critic_steps is None else critic_steps,
        )
        return SelfForcingConfig(
            student=runflags.optimizer(base.student),
            dm=dm,
            group=runflags.group(),
            critic_warmup=base.critic_warmup if critic_warmup is None else critic_warmup,
            sampling=Sampling(num_steps=num_steps, guidance=None),
        )

    def method(card, reward, cfg):
        (real,) = load(teacher or "wan-t2v")
        return SelfForcing(card, real, cfg)

    _train(
        runflags,
        "self-forcing",
        model,
        _no_preset("self-forcing", config),
        method,
        options={"teacher": teacher},
        needs_reward=False,
    )


@train_app.command("unified")
@_with(RunFlags, PolicyFlags, RefinerFlags, LoRAFlags)
def train_unified(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    refinerflags: RefinerFlags,
    loraflags: LoRAFlags,
    model: str | None = typer.Option(
        None, "--model", help="Card with a refiner LM to train: a bundled id or a card directory (default unified)."
    ),
) -> None:
    """UnifiedRL: the refiner LM and the generator trained from one reward (--prompt-only: the LM alone)."""
    from jaxpipe.training import UnifiedRL

    make = lambda: refinerflags.joint(policyflags, runflags, loraflags.config())  # noqa: E731
    _train(runflags, "unified", model, _no_preset("unified", make), UnifiedRL)


@train_app.command("mot")
@_with(RunFlags, PolicyFlags)
def train_mot(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    skip: int = typer.Option(1, "--skip", help="Samples per group rendered without thinking (0 <= skip < K)."),
    token_weight: float = typer.Option(
        1.0, "--token-weight", help="Weight of the thinking (token policy-gradient) part of the one summed loss."
    ),
    lm_beta: float = typer.Option(0.01, "--lm-beta", help="k3-KL weight of the thoughts to the frozen reference."),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Mixture-of-Transformers card to train: a bundled id or a card directory (default bagel-mot).",
    ),
) -> None:
    """RL on shared weights: one MoT transformer thinks and generates; one summed update, one optimiser."""
    from jaxpipe.training import MoTRLConfig, RefinerConfig, SharedMoTRL

    def config():
        return MoTRLConfig(
            generator=policyflags.generator(runflags),
            thinking=RefinerConfig(skip=skip, beta=lm_beta),
            token_weight=token_weight,
        )

    _train(runflags, "mot", model, _no_preset("mot", config), SharedMoTRL)


@train_app.command("joint")
@_with(RunFlags, PolicyFlags, RefinerFlags)
def train_joint(
    runflags: RunFlags,
    policyflags: PolicyFlags,
    refinerflags: RefinerFlags,
    refiners: int = typer.Option(
        3,
        "--refiners",
        "-N",
        help="Refiner experts (digits: each owns one attribute slot: stroke, position, brightness, cycling).",
    ),
    credit: str = typer.Option(
        "per_expert",
        "--credit",
        help="shared (one advantage for every refiner) or per_expert (each refiner's own reward term).",
    ),
    expert_map: str = typer.Option(
        "auto",
        "--expert-map",
        help="How the N refiner updates map over the experts: vmap, map (lax.map) or auto (map on one CPU device, vmap on GPU/TPU).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help="Card with a refiner LM whose LM initialises every refiner (bundled id or directory; default unified).",
    ),
) -> None:
    """JointMultiExpertRL: N refiner experts (one mapped update) and the generator from one reward."""
    from jaxpipe.cards import toy_multi_expert
    from jaxpipe.training import JointMultiExpertRL

    def method(base, reward, cfg):  # the user's card: every refiner may say every word (no slots)
        return JointMultiExpertRL(toy_multi_expert.from_unified(base, refiners, model_id=base.model_id), reward, cfg)

    make = lambda: refinerflags.joint(policyflags, runflags, credit=credit, expert_map=expert_map)  # noqa: E731
    _train(runflags, "joint", model, _no_preset("joint", make), method, options={"refiners": refiners})
