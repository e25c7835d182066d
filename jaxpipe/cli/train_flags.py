"""The flags of ``jaxpipe train``, declared once: each group is a dataclass whose fields' metadata names the option
and its help (``RunFlags`` every command's, here; the methods' groups — ``PolicyFlags``, ``RefinerFlags``,
``LoRAFlags`` and each method's own — in ``jaxpipe.training.methods.flags``); ``with_flags(*groups)`` adds the
groups' flags to a command's signature as typer options and hands the command one object per group;
``typed_flags`` records them as the user typed them (a resume with other settings names each that differs).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path

import typer

from jaxpipe.training.methods.flags import LoRAFlags, PolicyFlags, RefinerFlags, flag_fields
from jaxpipe.training.methods.flags import flag as _flag

__all__ = [
    "LoRAFlags",
    "PolicyFlags",
    "RefinerFlags",
    "RunFlags",
    "option",
    "options_of",
    "typed_flags",
    "with_flags",
]


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


def options_of(group: type) -> list[dataclasses.Field]:
    """The fields of flag group ``group`` that are command-line options.

    Args:
      group: a flag group dataclass (``RunFlags`` ...).

    Returns:
      Its fields declared with ``flag`` (``jaxpipe.training.methods.flags``).
    """
    return flag_fields(group)


def option(field: dataclasses.Field):
    """The typer option of a flag group's field.

    Args:
      field: a field declared with ``flag``.

    Returns:
      ``typer.Option(default, *names, help=...)``.
    """
    if field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        default = field.default
    return typer.Option(default, *field.metadata["names"], help=field.metadata["help"])


def with_flags(*groups: type):
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
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option(f), annotation=types[f.name])
                for f in options_of(group)
            ]
        decls = {p.name: p.default.param_decls for p in [*shared, *own]}

        def run(**kwargs):
            typed = typed_flags(kwargs, decls)
            packed = {g.__name__.lower(): g(**{f.name: kwargs.pop(f.name) for f in options_of(g)}) for g in groups}
            if "runflags" in packed:
                packed["runflags"].typed = typed
            return command(**packed, **kwargs)

        run.__name__, run.__doc__ = command.__name__, command.__doc__
        run.__signature__ = inspect.Signature([*shared, *own])
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
        return run

    return wrap


_NOT_SETTINGS = ("out", "steps", "save_every", "resume", "overwrite", "snr_rollouts", "eval_every")
"""The flags a resumed run may change: where it is, how long it runs, how often it saves, how it starts, what
it measures on the way."""


def _typed(value) -> str:
    if value is None:
        return "(default)"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "(none)"
    return str(value)


def typed_flags(values: dict, decls: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """A command's flag ``values`` as a user types them, by their option names ``decls``
    (``{"--sde-window": "0,1", "--eval/--no-eval": "--no-eval"}``), but ``_NOT_SETTINGS``: recorded
    with the run, so a resume with other settings names each flag that differs.

    Args:
      values: the command's parameters by name.
      decls: each parameter's option names (``typer.Option.param_decls``).

    Returns:
      ``{longest option name: the value as typed}``.
    """
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
