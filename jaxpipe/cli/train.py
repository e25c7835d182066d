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

Every command is built from its method's registration (``jaxpipe.training.methods.registry``) by one code path,
``command(info)``: the run flags (``train_flags.RunFlags``), the method's flag groups
(``jaxpipe.training.methods.flags``), ``--model`` and, for a method with presets, ``--preset``;
``train_run.run_training`` runs it. A new method is its module plus one registration (docs/training/new-method.md).
"""

from __future__ import annotations

import inspect

import typer

from jaxpipe.cli.common import load
from jaxpipe.cli.train_flags import LoRAFlags, PolicyFlags, RefinerFlags, RunFlags, with_flags
from jaxpipe.cli.train_run import FAILED_EXIT, preset_config, run_training
from jaxpipe.training.methods import registry
from jaxpipe.training.methods.registry import MethodInfo

__all__ = [
    "train_app",
    "build_train_app",
    "command",
    "RunFlags",
    "PolicyFlags",
    "RefinerFlags",
    "LoRAFlags",
    "FAILED_EXIT",
]


def command(info: MethodInfo):
    """The ``jaxpipe train <info.name>`` command of a registered method.

    Args:
      info: the method's registration.

    Returns:
      The command function (typer reads its signature): run flags, the method's groups, ``--model`` and,
      with ``info.preset_help``, ``--preset``.
    """

    def train(*groups, model: str | None = None, preset: str | None = None) -> None:
        runflags, groups = groups[0], groups[1:]

        def config(chosen):
            if chosen is None:
                return info.make_config(runflags, *groups)
            if info.preset_help is None:
                raise ValueError(f"{info.name} has no presets (got --preset {chosen})")
            return preset_config(info.name, chosen, runflags, *groups)

        def method(card, reward, cfg):
            return info.make_trainer(card, reward, cfg, *groups, load=load)

        options = {name: getattr(g, name) for g in groups for name in info.world_options if hasattr(g, name)}
        run_training(
            runflags,
            info.name,
            model,
            config,
            method,
            preset=preset,
            options=options or None,
            needs_reward=info.needs_reward,
        )

    def run(**kwargs) -> None:  # one positional group object per flag group, in order (``with_flags``)
        groups = [kwargs.pop(g.__name__.lower()) for g in (RunFlags, *info.flags)]
        train(*groups, **kwargs)

    own = [
        _param("model", typer.Option(None, "--model", help=info.model_help)),
        *([_param("preset", typer.Option(None, "--preset", help=info.preset_help))] if info.preset_help else []),
    ]
    run.__name__ = "train_" + info.name.replace("-", "_")
    run.__doc__ = info.summary
    run.__signature__ = inspect.Signature(
        [inspect.Parameter(g.__name__.lower(), inspect.Parameter.KEYWORD_ONLY) for g in (RunFlags, *info.flags)] + own
    )
    run.__annotations__ = {p.name: str | None for p in own}
    return with_flags(RunFlags, *info.flags)(run)


def _param(name: str, default) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=str | None)


def build_train_app() -> typer.Typer:
    """The ``jaxpipe train`` app: one command per registered method (``registry.methods()``), in order.

    Returns:
      The typer app.
    """
    app = typer.Typer(
        no_args_is_help=True,
        rich_markup_mode=None,
        context_settings={"max_content_width": 120},
        help="RL post-training and distillation (the digits world by default; --world shapes; --model/--prompts/--reward for your own): "
        "writes DIR/metrics.jsonl, DIR/*.png, DIR/report.json and the trained card (jp.cards.load(DIR)).",
    )
    for name, info in registry.methods().items():
        app.command(name)(command(info))
    return app


train_app = build_train_app()
