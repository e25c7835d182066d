"""What the digits pretraining recipes share: their settings, command lines and optimiser, batches of encoded data.

Every recipe's settings are a frozen dataclass deriving from ``Settings`` (seed, length, batch, optimiser),
``RenderedSettings`` (+ ``copies``: renderings of each digit), ``FlowSettings`` (+ ``cond_dropout``: a
flow-matching finetune), ``PerturbedSettings`` (+ the warp / blur / noise of a classifier's in-step
perturbation), with ``VideoBatch`` (+ ``video_batch_size``) for a recipe that trains image and video cards.
A recipe declares its own fields and the shared fields whose default differs (its bundled card's settings);
each field and its check is written once, here or in the recipe. ``settings_parser`` makes one flag per field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import ClassVar

import jax
import numpy as np

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import config_to_dict
from jaxpipe.digits import data as digits
from jaxpipe.training.data import array_batches, encode_captioned
from jaxpipe.training.methods.finetune import FinetuneConfig
from jaxpipe.training.optim import Optimizer

__all__ = [
    "Settings",
    "RenderedSettings",
    "FlowSettings",
    "VideoBatch",
    "PerturbedSettings",
    "settings_parser",
    "parse_settings",
    "run_recipe",
    "digit_videos",
    "output_dir",
    "write_report",
    "write_metrics",
    "encode_dataset",
    "array_batches",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every recipe's settings hold: ``seed``; ``steps`` updates of ``batch_size`` examples; the optimiser,
    clipped (``grad_clip``) AdamW (``weight_decay``) whose rate warms up linearly over ``warmup_steps`` to
    ``learning_rate``, then decays by a cosine to ``end_fraction`` of it at ``steps`` (``optimizer()``).

    Attributes:
        seed: fixes the run (initialisation, data, batch order, noise).
        steps: optimiser updates.
        batch_size: examples per update.
        learning_rate: the peak learning rate.
        warmup_steps: steps of the linear warm-up.
        weight_decay: AdamW's weight decay.
        grad_clip: the global gradient-norm clip.
        end_fraction: the final learning rate, as a fraction of the peak.

    Raises:
        ValueError: if a count is not positive (``seed``, ``warmup_steps``: negative), a rate or clip is not
            positive, or ``end_fraction`` is not in ``[0, 1]``.
    """

    seed: int = 0
    steps: int = 4000
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    end_fraction: float = 0.1

    def __post_init__(self):
        validate.counts(self, "seed", "warmup_steps", minimum=0)
        validate.counts(self, "steps", "batch_size")
        validate.positive(self, "learning_rate", "grad_clip")
        validate.non_negative(self, "weight_decay")
        validate.fractions(self, "end_fraction")

    def optimizer(self, **changes) -> Optimizer:
        """The recipe's optimiser (see the class); ``changes`` replace its fields (e.g. another run's
        ``learning_rate`` and ``total_steps``).

        Args:
            **changes: ``Optimizer`` fields to override.

        Returns:
            The ``Optimizer`` (clipped AdamW, ``"warmup_cosine"`` schedule over ``steps``).
        """
        fields = dict(
            learning_rate=self.learning_rate,
            grad_clip=self.grad_clip,
            weight_decay=self.weight_decay,
            schedule="warmup_cosine",
            warmup_steps=self.warmup_steps,
            total_steps=self.steps,
            end_fraction=self.end_fraction,
        )
        return Optimizer(**{**fields, **changes})


@dataclasses.dataclass(frozen=True)
class RenderedSettings(Settings):
    """Settings of a recipe whose data are ``copies`` renderings of each digit of a split.

    Attributes:
        copies: renderings of each digit (>= 1).
    """

    copies: int = 8

    def __post_init__(self):
        super().__post_init__()
        validate.counts(self, "copies")


@dataclasses.dataclass(frozen=True)
class FlowSettings(RenderedSettings):
    """Settings of a flow-matching finetune of a card's DiT: each example's caption is dropped with
    probability ``cond_dropout`` (so the card supports guidance); ``FinetuneConfig``'s weight decay.

    Attributes:
        weight_decay: AdamW's weight decay (``FinetuneConfig``'s default).
        cond_dropout: the probability that an example's caption is dropped, in ``[0, 1]``.
    """

    weight_decay: float = 1e-4
    cond_dropout: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        validate.fractions(self, "cond_dropout")

    def finetune(self, **changes) -> FinetuneConfig:
        """The ``Finetune`` config of the recipe: its optimiser and ``cond_dropout``, plus config ``changes``.

        Args:
            **changes: ``FinetuneConfig`` fields to override (e.g. ``trainable``, ``optimizer``).

        Returns:
            The ``FinetuneConfig``.
        """
        return FinetuneConfig(**{"optimizer": self.optimizer(), "cond_dropout": self.cond_dropout, **changes})


@dataclasses.dataclass(frozen=True)
class VideoBatch(Settings):
    """A mixin of a recipe that trains image cards and video cards: a video card's batches hold
    ``video_batch_size`` clips (an image card's ``batch_size`` images). It goes last among a settings
    class's bases: a dataclass base brings every field it inherits with its own default, so a base listed
    after it would reset what the bases before it override (``FlowSettings``' weight decay).

    Attributes:
        video_batch_size: clips per batch of a video card (>= 1).
    """

    video_batch_size: int = 16

    def __post_init__(self):
        super().__post_init__()
        validate.counts(self, "video_batch_size")

    def batch(self, video: bool) -> int:
        """The batch size of a video card (``video``) or an image card.

        Args:
            video: whether the card trained is a video card.

        Returns:
            ``video_batch_size`` if ``video``, else ``batch_size``.
        """
        return self.video_batch_size if video else self.batch_size


@dataclasses.dataclass(frozen=True)
class PerturbedSettings(RenderedSettings):
    """Settings of a classifier trained on renderings perturbed inside the step (by the recipe's ``perturb``,
    whose keyword arguments ``PERTURBATION`` names): ``rotate`` degrees in [0, 45], ``zoom`` in [0, 0.5),
    ``shear`` in [0, 1), a ``blur`` and pixel ``noise`` >= 0 (each 0: none). 128 images a batch; the
    rate decays to 5% of its peak.

    Attributes:
        PERTURBATION: the names of the fields passed to ``perturb`` (a class constant, not a field).
        rotate: rotation range, degrees, in ``[0, 45]``.
        zoom: zoom range, in ``[0, 0.5)``.
        shear: shear range, in ``[0, 1)``.
        blur: the blur's amount (its meaning is the recipe's), >= 0.
        noise: the pixel noise's largest std, >= 0.
    """

    PERTURBATION: ClassVar[tuple[str, ...]] = ("rotate", "zoom", "shear", "blur", "noise")

    batch_size: int = 128
    end_fraction: float = 0.05
    rotate: float = 0.0
    zoom: float = 0.0
    shear: float = 0.0
    blur: float = 0.0
    noise: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        validate.within(self, "rotate", low=0.0, high=45.0)
        validate.within(self, "zoom", low=0.0, high=0.5, open_high=True)
        validate.within(self, "shear", low=0.0, high=1.0, open_high=True)
        validate.non_negative(self, "blur", "noise")

    def perturbation(self) -> dict[str, float]:
        """The keyword arguments of the recipe's ``perturb``."""
        return {name: getattr(self, name) for name in self.PERTURBATION}


def _flags(settings_cls) -> list[dataclasses.Field]:
    """The fields of ``settings_cls`` that are command-line flags: all but nested configs (a network's sizes)."""
    defaults = settings_cls()
    return [f for f in dataclasses.fields(settings_cls) if not dataclasses.is_dataclass(getattr(defaults, f.name))]


def settings_parser(settings_cls, description: str) -> argparse.ArgumentParser:
    """A pretraining command line: ``--out`` and one ``--flag`` per field of the frozen settings dataclass
    ``settings_cls`` (its defaults; booleans as ``--flag`` / ``--no-flag``; nested configs are not flags).

    Args:
        settings_cls: a frozen settings dataclass whose fields all have defaults.
        description: the command's ``--help`` description.

    Returns:
        The parser (a flag ``--some-field`` per field ``some_field``, typed like its default).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="directory to write the card to")
    defaults = settings_cls()
    for field in _flags(settings_cls):
        default = getattr(defaults, field.name)
        kind = {"action": argparse.BooleanOptionalAction} if isinstance(default, bool) else {"type": type(default)}
        parser.add_argument(f"--{field.name.replace('_', '-')}", default=default, help="default: %(default)s", **kind)
    return parser


def parse_settings(parser: argparse.ArgumentParser, settings_cls, argv=None):
    """``(args, settings)``: the parsed command line and the ``settings_cls`` its flags describe.

    Args:
        parser: a parser from ``settings_parser(settings_cls, ...)`` (it may have more arguments).
        settings_cls: the settings dataclass.
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The parsed ``argparse.Namespace`` and the ``settings_cls`` built from its flags.

    Raises:
        SystemExit: on a bad command line, or settings that fail their checks (a usage error, status 2).
    """
    args = parser.parse_args(argv)
    try:
        return args, settings_cls(**{f.name: getattr(args, f.name) for f in _flags(settings_cls)})
    except ValueError as error:
        parser.error(str(error))


def run_recipe(
    settings_cls,
    description: str,
    train,
    argv=None,
    *,
    options: dict[str, dict] | None = None,
    report: str | None = None,
) -> None:
    """A recipe's command line: ``--out DIR``, one flag per field of ``settings_cls``, ``--quiet`` and the
    recipe's other ``options`` (``{flag: add_argument keywords}``). Runs ``train(out, settings, progress=not
    quiet, **options)`` (the options by name), then prints the run's ``report`` file in ``out`` (or where the
    card went).

    Args:
        settings_cls: the recipe's settings dataclass.
        description: the command's ``--help`` description.
        train: the recipe, ``train(out, settings, *, progress, **options)``.
        argv: the arguments (default: ``sys.argv[1:]``).
        options: the recipe's other flags, ``{flag: argparse add_argument keywords}``, passed to ``train`` by
            their ``dest`` names.
        report: the name of the file in ``out`` to print when done (``None``: print ``wrote OUT``).

    Raises:
        SystemExit: on a bad command line or invalid settings (status 2).
    """
    parser = settings_parser(settings_cls, description)
    parser.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    names = [parser.add_argument(flag, **keywords).dest for flag, keywords in (options or {}).items()]
    args, settings = parse_settings(parser, settings_cls, argv)
    train(args.out, settings, progress=not args.quiet, **{name: getattr(args, name) for name in names})
    print((Path(args.out) / report).read_text() if report else f"wrote {args.out}")


def digit_videos(split: str, *, seed: int, copies: int) -> digits.VideoDataset:
    """``copies`` captioned moving-digit videos of each digit of ``split``; copy ``i`` is drawn with ``seed + i``.

    Args:
        split: ``"train"``, ``"heldout"`` or ``"all"`` (``digits.load_images``).
        seed: the ``digits.make_videos`` seed of the first copy.
        copies: videos of each digit.

    Returns:
        The ``VideoDataset`` of ``N * copies`` videos (``N`` digits in ``split``), copy by copy.
    """
    images, labels = digits.load_images(split)
    return digits.concat([digits.make_videos(images, labels, seed=seed + i) for i in range(copies)])


def output_dir(out: str | Path | None, *stale: str) -> Path | None:
    """``out`` as a ``Path`` (created, its ``stale`` files of an earlier run removed), or ``None``.

    Args:
        out: the output directory, or ``None`` (no output).
        *stale: names of files in ``out`` an earlier run may have left, to delete.

    Returns:
        ``Path(out)``, created with its parents, or ``None`` when ``out`` is ``None``.
    """
    if out is None:
        return None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in stale:
        (out / name).unlink(missing_ok=True)
    return out


def write_report(out: Path, report: dict) -> None:
    """``out/pretrain.json``: a run's ``report`` plus the jax version and backend it ran on.

    Args:
        out: an existing directory.
        report: the run's JSON-serialisable report.
    """
    report = {**report, "jax": jax.__version__, "backend": jax.default_backend()}
    (out / "pretrain.json").write_text(json.dumps(report, indent=2) + "\n")


def write_metrics(
    out: Path, recipe: str, settings: Settings, card: Card, *, train_seconds: float, total_seconds: float, **fields
) -> None:
    """``out/metrics.json`` of a classifier recipe's run (module ``recipe``): the command that reproduces it,
    its seed, steps, timings and devices, the card's parameter count, then ``fields`` and the settings.

    Args:
        out: an existing directory (the card's).
        recipe: the recipe's module name in ``jaxpipe.digits.pretrain`` (``"scorer"``, ``"classifier"``).
        settings: the run's settings.
        card: the trained card.
        train_seconds: the training's wall time.
        total_seconds: the run's wall time, evaluation included.
        **fields: more JSON-serialisable entries of the report (accuracies, notes).
    """
    report = {
        "command": f"python -m jaxpipe.digits.pretrain.{recipe} --out {out} --steps {settings.steps} --seed {settings.seed}",
        "seed": settings.seed,
        "steps": settings.steps,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(total_seconds, 1),
        "devices": f"{jax.default_backend()} x{jax.device_count()}",
        "params": card.num_params(),
        **fields,
        "config": config_to_dict(settings),
    }
    (out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")


def encode_dataset(card: Card, data, chunk: int = 256) -> dict[str, np.ndarray]:
    """``{"latents": (N, T, h, w, C), "ids": (N, L)}``: a digits dataset encoded once (``encode_captioned``).

    Args:
        card: a text-to-image/video card with ``"vae"`` and ``"text_encoder"`` components.
        data: an ``ImageDataset`` (latents get ``T = 1``) or a ``VideoDataset`` in ``[-1, 1]``, captioned.
        chunk: images or videos encoded per jitted call.

    Returns:
        The latents (NumPy, the autoencoder's dtype) and the captions' token ids ``(N, L)``, ``L`` the text
        encoder's ``max_len``.
    """
    return encode_captioned(card, data.video if hasattr(data, "video") else data.image, data.caption, chunk)
