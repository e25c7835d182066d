"""How every ``jaxpipe train`` command runs: settings checked before any card loads, the world's recipe (or the
user's prompts and reward) built, ``execute``d with a stop handler, and a resume that names what differs.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from jaxpipe.cli.common import discard_if_empty, fail, load, parse_options, writable_folder
from jaxpipe.cli.train_flags import RunFlags, options_of
from jaxpipe.training.methods import registry

__all__ = ["FAILED_EXIT", "OPTION_FLAGS", "SNR_BY_DEFAULT", "preset_config", "run_training"]

FAILED_EXIT = 3
"""``jaxpipe train``'s exit status when the run finished but its verdict is FAILED (mode collapse)."""


def _resume_command() -> str:
    args = ["jaxpipe", *sys.argv[1:]]
    args = [a for a in args if a != "--overwrite"]
    return " ".join(shlex.quote(a) for a in args + ([] if "--resume" in args else ["--resume"]))


SNR_BY_DEFAULT = tuple(name for name, info in registry.methods().items() if info.gradient_snr)
"""The commands that measure the gradient signal-to-noise unless told not to (``--snr-rollouts 0``):
the registered methods with ``gradient_snr`` (``jaxpipe.training.methods.registry``)."""


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


def run_training(
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
    says so and changes nothing.

    Args:
      flags: the run flags.
      command: the ``jaxpipe train`` command (``"nft"``).
      model: ``--model`` (``None``: the world recipe's card).
      make_config: ``preset name or None -> the method's config``.
      method: ``(card, reward, config) -> trainer`` for the user's prompts and reward (``None``: worlds only).
      preset: ``--preset`` as typed (``None``: the world's; ``"none"``: the method flags).
      options: the command's own world options (``teacher``, ``refiners``), ``None`` where not given.
      needs_reward: whether the user's prompts need ``--reward`` (distillation: no).

    Raises:
      typer.Exit: code 2 with one line for bad settings, 130 / 143 on a stop, ``FAILED_EXIT`` on a collapse.
    """
    import time

    import jax

    from jaxpipe.stopping import Stopper, exit_code
    from jaxpipe.training.runs import execute, finished, recipes

    started = time.perf_counter()

    if flags.steps <= 0:
        fail(f"--steps must be a positive integer (got {flags.steps})")
    if flags.save_every <= 0:
        fail(f"--save-every must be a positive integer (got {flags.save_every})")
    snr_default = 4 if command in registry.methods() and registry.method(command).gradient_snr else 0
    snr_rollouts = flags.snr_rollouts if flags.snr_rollouts is not None else snr_default
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
        except (ValueError, KeyError, OSError) as err:  # KeyError: a world's card (--scorer, --teacher) unknown
            discard_if_empty(out, created)
            fail(str(err).strip('"'))
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


def preset_config(method: str, name: str, runflags: RunFlags, *groups: object, **own: tuple) -> object:
    """The config of preset ``name`` of ``method`` (``jaxpipe.training.presets``), refusing method flags set beside it.

    A preset fixes the method's settings (K, steps, learning rate, LoRA ...); the run flags (steps, out,
    prompts per step, seed, evaluation, model, prompts and reward) still apply. ``groups`` are flag
    groups that must be at their defaults; ``own`` maps a command's own flag to ``(value, default)``.

    Args:
      method: the ``jaxpipe train`` command.
      name: the preset's name.
      runflags: the run flags (``--lr`` and ``--group-size`` are the method's).
      *groups: flag groups that must be at their defaults.
      **own: the command's own method flags, ``--flag -> (value, default)``.

    Returns:
      The preset's config.

    Raises:
      ValueError: for an unknown preset, or a method flag set away from its default beside ``--preset``.
    """
    from jaxpipe.training import presets

    preset = presets.get(method, name)
    changed = [
        f.metadata["names"][0]
        for group in groups
        for f in options_of(type(group))
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
