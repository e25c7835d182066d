"""Training the ``digit-scorer`` reward model on the **held-out** digits.

Objective: the sum over the four heads (digit, stroke, position, brightness) of the mean softmax
cross-entropy. Data: ``load_images("heldout")`` (359 digits the generators never see), rendered
``copies`` times with uniformly drawn stroke/position/brightness by ``digits.augment``. Inside the
jitted step every image is further perturbed in ways that keep its labels (``perturb``): a small
rotation/zoom/shear/elastic warp about the image centre, a partial 3×3 blur, an ink gain of a few
per cent and Gaussian pixel noise (then clipped to ``[-1, 1]`` like a decoded image). The warp is
what lets 359 digits generalise to unseen handwriting; blur and noise keep the scorer calibrated
on generated digits, which are a little soft and noisy.

Generalisation is measured on the generators' **train** split (never seen by the scorer), rendered
with random attributes. The bundled weights are reproduced (same seed, same machine ⇒ same bits) by::

    python -m jaxpipe.digits.pretrain.scorer --out jaxpipe/digits/assets/digit-scorer [--steps N] [--seed S]
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.cards.checkpoint import save_card
from jaxpipe.digits import data as digits
from jaxpipe.digits import digit_scorer
from jaxpipe.digits.digit_scorer.network import HEADS, DigitScorer, ScorerConfig
from jaxpipe.digits.pretrain.common import PerturbedSettings, run_recipe, write_metrics
from jaxpipe.training.loss_trainer import PART, LossTrainer
from jaxpipe.training.trainer import TrainState

__all__ = [
    "DEFAULT_STEPS",
    "LABELS",
    "TRAIN_SPLIT",
    "ScorerTrainConfig",
    "ScorerTrainer",
    "cross_entropy",
    "evaluate",
    "evaluation_data",
    "main",
    "perturb",
    "pretrain",
    "training_data",
    "warp",
]

DEFAULT_STEPS = 3000
"""Steps of the bundled run (about two minutes on two CPU cores)."""

TRAIN_SPLIT = "heldout"
"""The digits split the scorer learns from: disjoint from the generators' ``"train"`` split."""

LABELS = tuple(HEADS)
"""Batch keys the scorer learns: ``("digit", "stroke", "position", "brightness")``."""


@dataclasses.dataclass(frozen=True)
class ScorerTrainConfig(PerturbedSettings):
    """Network size, optimiser and augmentation settings of a scorer run; ``seed`` fixes the initialisation,
    the data rendering, the batch order and the in-step perturbations.

    ``rotate`` (degrees), ``zoom``, ``shear``, ``elastic`` (px): the ranges of ``warp``;
    ``gain``: the ink is scaled by ``U(1 - gain, 1 + gain)``; ``blur``: each image is mixed with
    its 3×3 binomial blur at a weight ``U(0, blur)``; ``noise``: Gaussian pixel noise with a std
    ``U(0, noise)`` per image (pixels in ``[-1, 1]``). ``copies``: renderings of each held-out digit.

    Attributes:
        scorer: the network's sizes.
        elastic: std of ``warp``'s elastic displacement, px, >= 0.
        gain: ink-gain range, in ``[0, 1)``.
        blur: the largest weight of the 3×3 blur, in ``[0, 1]``.

    The other fields (``steps``, ``learning_rate``, ``rotate``, ...) are ``PerturbedSettings``', with this
    recipe's defaults.
    """

    PERTURBATION = ("rotate", "zoom", "shear", "elastic", "gain", "blur", "noise")

    scorer: ScorerConfig = ScorerConfig()
    steps: int = DEFAULT_STEPS
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    copies: int = 32
    rotate: float = 10.0
    zoom: float = 0.08
    shear: float = 0.1
    blur: float = 0.6
    noise: float = 0.1
    elastic: float = 0.5
    gain: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        validate.fractions(self, "blur")
        validate.non_negative(self, "elastic")
        validate.within(self, "gain", low=0.0, high=1.0, open_high=True)


def warp(images: jax.Array, key: jax.Array, *, rotate: float, zoom: float, shear: float, elastic: float) -> jax.Array:
    """Small random geometric distortion of images ``(B, H, W, C)`` in ``[-1, 1]``, about the image centre.

    Per image: rotation ``U(±rotate)`` degrees, zoom ``U(1 ± zoom)``, horizontal shear ``U(±shear)``,
    and a smooth elastic displacement (a 4×4 grid of ``N(0, elastic²)`` px offsets, bicubically
    upsampled); bilinear resampling, background (``-1``) outside the frame. Digit identity, stroke,
    position and brightness are kept (the centre is fixed, so a left digit stays left).

    Args:
        images: ``(B, H, W, C)`` float in ``[-1, 1]``, background -1.
        key: a PRNG key; each image draws its own distortion from it.
        rotate: rotation range, degrees.
        zoom: zoom range (scale ``1 ± zoom``).
        shear: horizontal shear range.
        elastic: std of the elastic displacement, px.

    Returns:
        The warped images, ``(B, H, W, C)`` in ``[-1, 1]``.
    """
    b, h, w, c = images.shape
    k_rot, k_zoom, k_shear, k_el = jax.random.split(key, 4)
    angle = jnp.deg2rad(jax.random.uniform(k_rot, (b,), minval=-rotate, maxval=rotate))
    scale = jax.random.uniform(k_zoom, (b,), minval=1.0 - zoom, maxval=1.0 + zoom)
    sh = jax.random.uniform(k_shear, (b,), minval=-shear, maxval=shear)
    cos, sin = jnp.cos(angle) / scale, jnp.sin(angle) / scale
    # source = M · target (about the centre), M = rotation/zoom · shear; inputs (y, x) in px from the centre
    m = jnp.stack([jnp.stack([cos, cos * sh - sin], -1), jnp.stack([sin, sin * sh + cos], -1)], -2)  # (B, 2, 2)
    ys, xs = jnp.meshgrid(jnp.arange(h) + 0.5 - h / 2, jnp.arange(w) + 0.5 - w / 2, indexing="ij")
    grid = jnp.stack([ys, xs])  # (2, H, W)
    src = jnp.einsum("bij,jhw->bihw", m, grid)
    field = elastic * jax.random.normal(k_el, (b, 2, 4, 4))
    src = src + jax.image.resize(field, (b, 2, h, w), "cubic")
    rows = src[:, 0] + h / 2 - 0.5  # continuous coordinates -> array indices of pixel centres
    cols = src[:, 1] + w / 2 - 0.5

    def sample(image, r, q):  # image (H, W, C)
        one = lambda channel: jax.scipy.ndimage.map_coordinates(channel, [r, q], order=1, mode="constant", cval=-1.0)
        return jax.vmap(one, in_axes=-1, out_axes=-1)(image)

    return jax.vmap(sample)(images, rows, cols)


def perturb(
    images: jax.Array,
    key: jax.Array,
    *,
    rotate: float = 0.0,
    zoom: float = 0.0,
    shear: float = 0.0,
    elastic: float = 0.0,
    gain: float = 0.0,
    blur: float = 0.0,
    noise: float = 0.0,
) -> jax.Array:
    """Label-preserving perturbation of images ``(B, H, W, C)`` in ``[-1, 1]`` (see ``ScorerTrainConfig``).

    ``warp`` and a partial 3×3 blur change the shape of the ink; the ink is then rescaled to its
    original peak — brightness *is* the peak ink level, and resampling or blurring a 1-px stroke
    would otherwise pass a thin bright digit off as dim — before the gain jitter and the pixel
    noise. A piece whose amount is 0 is left out (statically). Pure and jittable; the result is
    clipped to ``[-1, 1]``.

    Args:
        images: ``(B, H, W, C)`` float in ``[-1, 1]``, background -1.
        key: a PRNG key; each image draws its own amounts from it.
        rotate: ``warp``'s rotation range, degrees.
        zoom: ``warp``'s zoom range.
        shear: ``warp``'s shear range.
        elastic: ``warp``'s elastic displacement std, px.
        gain: ink scale range, ``U(1 ± gain)``.
        blur: the largest weight of the 3×3 binomial blur mixed into each image.
        noise: the largest std of the Gaussian pixel noise (pixels in ``[-1, 1]``).

    Returns:
        The perturbed images, ``(B, H, W, C)`` in ``[-1, 1]``.
    """
    b = images.shape[0]
    k_warp, k_gain, k_blur, k_std, k_noise = jax.random.split(key, 5)
    ink = (images + 1.0) * 0.5
    peak = jnp.max(ink, axis=(1, 2, 3), keepdims=True)
    if rotate or zoom or shear or elastic:
        ink = (warp(images, k_warp, rotate=rotate, zoom=zoom, shear=shear, elastic=elastic) + 1.0) * 0.5
    if blur:
        kernel = jnp.array([0.25, 0.5, 0.25], images.dtype)
        padded = jnp.pad(ink, ((0, 0), (1, 1), (1, 1), (0, 0)))  # background (ink 0) beyond the edge
        h, w = ink.shape[1:3]
        rows = sum(kernel[i] * padded[:, i : i + h] for i in range(3))
        blurred = sum(kernel[j] * rows[:, :, j : j + w] for j in range(3))
        mix = jax.random.uniform(k_blur, (b, 1, 1, 1), maxval=blur)
        ink = (1.0 - mix) * ink + mix * blurred
    ink = ink * (peak / jnp.maximum(jnp.max(ink, axis=(1, 2, 3), keepdims=True), 1e-3))
    if gain:
        ink = ink * jax.random.uniform(k_gain, (b, 1, 1, 1), minval=1.0 - gain, maxval=1.0 + gain)
    out = ink * 2.0 - 1.0
    if noise:
        std = jax.random.uniform(k_std, (b, 1, 1, 1), maxval=noise)
        out = out + std * jax.random.normal(k_noise, images.shape, images.dtype)
    return jnp.clip(out, -1.0, 1.0)


def cross_entropy(logits: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]) -> tuple[jax.Array, dict]:
    """Sum over the heads of the mean softmax cross-entropy, plus per-head loss and accuracy.

    Args:
        logits: ``{head: (B, classes)}`` for each head of ``LABELS``.
        batch: ``{head: (B,) int}`` labels for each head of ``LABELS`` (other keys are ignored).

    Returns:
        The total loss (a scalar) and ``{"loss", "loss_<head>", "acc_<head>"}`` scalars.
    """
    metrics, total = {}, 0.0
    for name in LABELS:
        labels = batch[name]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits[name], labels).mean()
        metrics[f"loss_{name}"] = loss
        metrics[f"acc_{name}"] = jnp.mean(jnp.argmax(logits[name], -1) == labels)
        total = total + loss
    return total, {"loss": total, **metrics}


# ------------------------------------------------------------------------------------------------ trainer
class ScorerTrainer(LossTrainer):
    """Supervised training of a ``DigitScorer``: ``init(key) -> state``, jitted ``step(state, batch, key)``.

    A batch is ``{"image": (B, 16, 16, 1) in [-1, 1], "digit", "stroke", "position", "brightness": (B,) int}``
    (extra keys are ignored); ``key`` drives the in-step perturbation. ``step`` returns the new state
    and ``{"loss", "loss_<head>", "acc_<head>", "grad_norm", "skipped"}``; a step whose loss or
    gradient is non-finite leaves the weights and optimiser untouched and reports ``skipped = 1``.
    Clipped AdamW, linear warm-up and cosine decay to 5% of the peak rate over ``config.steps``.
    """

    def __init__(self, config: ScorerTrainConfig = ScorerTrainConfig()):
        self.config = config
        abstract = nnx.eval_shape(lambda: DigitScorer(config.scorer, rngs=nnx.Rngs(0)))
        super().__init__(abstract, self.batch_loss, config.optimizer())

    def init(self, key: jax.Array) -> TrainState:
        """A freshly initialised scorer (deterministic in ``key``) and a fresh optimiser.

        Args:
            key: the initialisation's PRNG key.

        Returns:
            The training state at step 0.
        """
        _, params, _ = nnx.split(DigitScorer(self.config.scorer, rngs=nnx.Rngs(params=key)), nnx.Param, ...)
        return TrainState({PART: params}, {PART: self.tx.init(params)}, None, {}, jnp.zeros((), jnp.int32))

    def card(self, state: TrainState) -> Card:
        """A ``digit-scorer`` card with the state's weights.

        Args:
            state: a training state of this trainer.

        Returns:
            The card.
        """
        spec = nnx.eval_shape(lambda: digit_scorer.build(digit_scorer.Config(self.config.scorer))).spec
        return Card({digit_scorer.COMPONENT: self.model(state)}, spec)

    def batch_loss(self, model: DigitScorer, batch: Mapping[str, jax.Array], key: jax.Array):
        """``(loss, metrics)`` of one batch after the in-step perturbation (pure; differentiable in the model).

        Args:
            model: the scorer.
            batch: ``{"image": (B, 16, 16, 1) in [-1, 1], "digit", "stroke", "position", "brightness": (B,) int}``.
            key: the perturbation's PRNG key.

        Returns:
            ``cross_entropy`` of the perturbed batch.
        """
        batch = {name: batch[name] for name in ("image", *LABELS)}
        images = perturb(jnp.asarray(batch["image"]), key, **self.config.perturbation())
        return cross_entropy(model(images), batch)


# ------------------------------------------------------------------------------------------------ data and evaluation
def training_data(*, seed: int = 0, copies: int = 32) -> digits.ImageDataset:
    """The scorer's training set: the **held-out** digits, each rendered ``copies`` times with random attributes.

    Args:
        seed: the ``digits.augment`` seed.
        copies: renderings of each held-out digit.

    Returns:
        The ``ImageDataset`` of ``359 * copies`` renders: images ``(N, 16, 16, 1)`` float32 in ``[-1, 1]`` and
        their int32 labels.
    """
    images, labels = digits.load_images(TRAIN_SPLIT)
    return digits.augment(images, labels, seed=seed, copies=copies)


def evaluation_data(*, seed: int = 1, copies: int = 2) -> digits.ImageDataset:
    """The generalisation set: the generators' **train** digits (unseen by the scorer), random attributes.

    Args:
        seed: the ``digits.augment`` seed.
        copies: renderings of each train digit.

    Returns:
        The ``ImageDataset`` of ``1438 * copies`` renders: images ``(N, 16, 16, 1)`` float32 in ``[-1, 1]`` and
        their int32 labels.
    """
    images, labels = digits.load_images("train")
    return digits.augment(images, labels, seed=seed, copies=copies)


def _batches(dataset: digits.ImageDataset, batch_size: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    for batch in digits.batches(dataset, batch_size, seed=seed):
        yield {name: batch[name] for name in ("image", *LABELS)}


_predict = jax.jit(digit_scorer.predict)


def evaluate(card: Card, dataset: digits.ImageDataset, *, batch_size: int = 512) -> dict[str, float]:
    """Accuracy per head of ``card`` on ``dataset`` (every sample, in order).

    Args:
        card: a ``digit-scorer`` card.
        dataset: labelled renders, images in ``[-1, 1]``.
        batch_size: images per scorer call.

    Returns:
        ``{head: accuracy in [0, 1]}`` for each head of ``LABELS``.
    """
    hits = {name: 0 for name in LABELS}
    for start in range(0, len(dataset), batch_size):
        part = dataset.take(slice(start, start + batch_size))
        pred = _predict(card, jnp.asarray(part.image))
        for name in LABELS:
            hits[name] += int(np.sum(np.asarray(pred[name]) == getattr(part, name)))
    return {name: hits[name] / len(dataset) for name in LABELS}


def _perturbed(dataset: digits.ImageDataset, config: ScorerTrainConfig, seed: int) -> digits.ImageDataset:
    images = perturb(jnp.asarray(dataset.image), jax.random.key(seed), **config.perturbation())
    return dataclasses.replace(dataset, image=np.asarray(images))


# ------------------------------------------------------------------------------------------------ the bundled run
def pretrain(
    out_dir: str | os.PathLike, config: ScorerTrainConfig = ScorerTrainConfig(), *, progress: bool = True
) -> Card:
    """Train a ``digit-scorer`` card from scratch and save it (``save_card``) plus ``metrics.json`` to ``out_dir``.

    ``config.seed`` fixes the initialisation, the data rendering, the batch order and the in-step
    perturbations. ``metrics.json`` holds the settings, the wall time and the per-head accuracy
    on the train split (unseen digits, random attributes), clean and perturbed.

    Args:
        out_dir: the directory to write the card and its ``metrics.json`` to.
        config: the run's settings.
        progress: show a progress bar.

    Returns:
        The trained card.
    """
    from jaxpipe.training.fit import fit

    t0 = time.perf_counter()
    seed = config.seed
    trainer = ScorerTrainer(config)
    key = jax.random.key(seed)
    k_init, k_steps = jax.random.split(key)
    dataset = training_data(seed=seed, copies=config.copies)
    batches = _batches(dataset, config.batch_size, seed)
    state = trainer.init(k_init)
    start = time.perf_counter()
    state, history = fit(
        trainer.step, state, batches, steps=config.steps, key=k_steps, desc="digit-scorer", progress=progress
    )
    train_seconds = time.perf_counter() - start
    skipped = int(sum(row["skipped"] for row in history))
    if skipped:
        print(f"digit-scorer: skipped {skipped} of {config.steps} steps with a non-finite loss or gradient")
    card = trainer.card(state)
    held = evaluate(card, training_data(seed=seed + 1, copies=1))
    unseen = evaluation_data()
    accuracy = {
        "train_split": evaluate(card, unseen),
        "train_split_perturbed": evaluate(card, _perturbed(unseen, config, seed=1)),
        "heldout_split": held,
    }
    out_dir = Path(out_dir)
    save_card(card, out_dir)
    write_metrics(
        out_dir,
        "scorer",
        config,
        card,
        train_seconds=train_seconds,
        total_seconds=time.perf_counter() - t0,
        skipped_steps=skipped,
        trained_on=f"heldout split ({len(dataset) // config.copies} digits) x {config.copies} renderings",
        accuracy={split: {k: round(v, 4) for k, v in acc.items()} for split, acc in accuracy.items()},
        accuracy_notes={
            "train_split": "the generators' train digits (never seen by the scorer), 2 renderings each, random attributes",
            "train_split_perturbed": "the same images with the training-time perturbation (warp, blur, gain, noise)",
            "heldout_split": "the scorer's own digits, a fresh rendering (fit, not generalisation)",
        },
    )
    return card


def main(argv: list[str] | None = None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``ScorerTrainConfig`` field, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(ScorerTrainConfig, __doc__.split("\n")[0], pretrain, argv, report="metrics.json")


if __name__ == "__main__":
    main()
