"""The ``digit-classifier`` recipe: train the independent digit classifier from scratch.

* Data: the generators' ``"train"`` split (the digit-scorer never saw it), rendered ``copies``
  times with uniformly drawn stroke/position/brightness (``digits.augment``, seed ``RENDER_SEED + seed``).
* Perturbations (``perturb``, inside the jitted step): a random affine map (rotation, zoom,
  aspect, shear, sub-pixel shift), an ink gamma, a Gaussian blur and pixel noise.

The bundled weights (``jaxpipe/digits/assets/digit-classifier``) are reproduced (same seed, same
machine ⇒ same bits) by::

    python -m jaxpipe.digits.pretrain digit-classifier --out jaxpipe/digits/assets/digit-classifier [--steps N] [--seed S]
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxpipe.cards
from jaxpipe import validate
from jaxpipe.card import Card
from jaxpipe.digits import data as digits
from jaxpipe.digits.digit_classifier import COMPONENT, ClassifierNet, Config, build, predict
from jaxpipe.digits.digit_classifier.network import NUM_CLASSES
from jaxpipe.digits.pretrain.common import PerturbedSettings, run_recipe, write_metrics
from jaxpipe.digits.words import BRIGHTNESS, DIGIT_WORDS, POSITIONS, STROKES

__all__ = [
    "RENDER_SEED",
    "TrainConfig",
    "TrainState",
    "evaluate",
    "generated_images",
    "heldout_renders",
    "main",
    "make_step",
    "perturb",
    "pretrain",
    "train",
    "training_data",
]

RENDER_SEED = 7919
"""Offset of the training renders' ``augment`` seed: ``RENDER_SEED + seed`` (the scorer renders with ``seed``)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig(PerturbedSettings):
    """Network, optimiser, data and perturbation settings of a classifier run; ``seed`` fixes the
    initialisation, the renders (``augment`` seed ``RENDER_SEED + seed``), the batch order and the perturbations.

    Perturbation ranges (``perturb``): ``rotate`` degrees, ``zoom`` (isotropic scale ``1 ± zoom``),
    ``aspect`` (x-scale ``1 ± aspect`` relative to y), ``shear``, ``shift`` (px), ``gamma`` (ink
    ``** g`` with ``log g ~ U(±log gamma)``), ``blur`` (Gaussian sigma ``U(0, blur)`` px), ``noise``
    (pixel noise std ``U(0, noise)``, ink units). ``copies``: renders of each train digit.

    Attributes:
        network: the classifier's sizes.
        label_smoothing: the cross-entropy's label smoothing, in ``[0, 1)``.
        aspect: x-scale range relative to y, in ``[0, 0.5)``.
        shift: translation range, px, >= 0.
        gamma: ink-gamma range, >= 1 (1: none).

    The other fields (``steps``, ``learning_rate``, ``rotate``, ...) are ``PerturbedSettings``', with this
    recipe's defaults.
    """

    PERTURBATION = ("rotate", "zoom", "aspect", "shear", "shift", "gamma", "blur", "noise")

    network: Config = Config()
    steps: int = 1200
    learning_rate: float = 4e-3
    warmup_steps: int = 75
    weight_decay: float = 5e-4
    rotate: float = 12.0
    zoom: float = 0.1
    shear: float = 0.15
    blur: float = 0.8
    noise: float = 0.06
    label_smoothing: float = 0.05
    aspect: float = 0.1
    shift: float = 1.5
    gamma: float = 1.5

    def __post_init__(self):
        super().__post_init__()
        validate.within(self, "label_smoothing", low=0.0, high=1.0, open_high=True)
        validate.within(self, "aspect", low=0.0, high=0.5, open_high=True)
        validate.non_negative(self, "shift")
        validate.within(self, "gamma", low=1.0, high=math.inf)


class TrainState(NamedTuple):
    """Network parameters, its other variables, the optimiser state and the step counter.

    Attributes:
        params: the network's ``nnx.Param`` state.
        rest: its other variables.
        opt_state: the optimiser's state.
        step: the number of updates taken, an int32 scalar.
    """

    params: nnx.State
    rest: nnx.State
    opt_state: Any
    step: jax.Array


def _affine(ink: jax.Array, key: jax.Array, rotate, zoom, aspect, shear, shift) -> jax.Array:
    """Random affine resampling of ink ``(B, H, W)`` about the frame centre (bilinear, background 0 outside)."""
    b, h, w = ink.shape
    k = jax.random.split(key, 5)
    angle = jnp.deg2rad(jax.random.uniform(k[0], (b,), minval=-rotate, maxval=rotate))
    scale = jax.random.uniform(k[1], (b,), minval=1.0 - zoom, maxval=1.0 + zoom)
    stretch = jax.random.uniform(k[2], (b,), minval=1.0 - aspect, maxval=1.0 + aspect)
    sh = jax.random.uniform(k[3], (b,), minval=-shear, maxval=shear)
    offset = jax.random.uniform(k[4], (b, 2), minval=-shift, maxval=shift)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    # target (y, x) = A · source + offset with A = rotation · shear · diag(scale, scale · stretch);
    # each output pixel samples the source at A⁻¹ (target - offset)
    a = jnp.stack([jnp.stack([cos, cos * sh - sin], -1), jnp.stack([sin, sin * sh + cos], -1)], -2)
    a = a * jnp.stack([scale, scale * stretch], -1)[:, None, :]
    inverse = jnp.linalg.inv(a)
    ys, xs = jnp.meshgrid(jnp.arange(h) + 0.5 - h / 2, jnp.arange(w) + 0.5 - w / 2, indexing="ij")
    target = jnp.stack([ys, xs])[None] - offset[:, :, None, None]
    src = jnp.einsum("bij,bjhw->bihw", inverse, target)
    rows, cols = src[:, 0] + h / 2 - 0.5, src[:, 1] + w / 2 - 0.5

    def sample(image, r, c):
        return jax.scipy.ndimage.map_coordinates(image, [r, c], order=1, mode="constant", cval=0.0)

    return jax.vmap(sample)(ink, rows, cols)


def _gaussian_blur(ink: jax.Array, sigma: jax.Array) -> jax.Array:
    """Separable 5-tap Gaussian blur of ink ``(B, H, W)`` with a per-image ``sigma`` ``(B,)`` (0: identity)."""
    taps = jnp.arange(-2, 3, dtype=ink.dtype)
    kernel = jnp.exp(-0.5 * (taps[None] / jnp.maximum(sigma[:, None], 1e-3)) ** 2)
    kernel = kernel / kernel.sum(-1, keepdims=True)  # (B, 5)
    h, w = ink.shape[1:]
    padded = jnp.pad(ink, ((0, 0), (2, 2), (2, 2)))
    rows = sum(kernel[:, i, None, None] * padded[:, i : i + h] for i in range(5))
    return sum(kernel[:, j, None, None] * rows[:, :, j : j + w] for j in range(5))


def perturb(
    images: jax.Array,
    key: jax.Array,
    *,
    rotate: float = 0.0,
    zoom: float = 0.0,
    aspect: float = 0.0,
    shear: float = 0.0,
    shift: float = 0.0,
    gamma: float = 1.0,
    blur: float = 0.0,
    noise: float = 0.0,
) -> jax.Array:
    """Digit-preserving perturbation of images ``(B, H, W, 1)`` in [0, 1] (ranges: see ``TrainConfig``).

    Affine map, then ink gamma, then blur, then noise; the result is clipped to [0, 1]. Pure and
    jittable; a piece whose amount is 0 (gamma 1) is left out statically.

    Args:
        images: ``(B, H, W, 1)`` float in ``[0, 1]``, background 0.
        key: a PRNG key; each image draws its own amounts from it.
        rotate: rotation range, degrees ``U(±rotate)``.
        zoom: isotropic scale ``U(1 ± zoom)``.
        aspect: x-scale relative to y, ``U(1 ± aspect)``.
        shear: shear factor ``U(±shear)``.
        shift: translation in px, ``U(±shift)`` along each axis.
        gamma: ink exponent ``g`` with ``log g ~ U(±log gamma)`` (1: none).
        blur: Gaussian blur sigma ``U(0, blur)`` px.
        noise: Gaussian pixel noise of std ``U(0, noise)``, ink units.

    Returns:
        The perturbed images, ``(B, H, W, 1)`` in ``[0, 1]``, the dtype of ``images``.
    """
    b = images.shape[0]
    k_affine, k_gamma, k_blur, k_std, k_noise = jax.random.split(key, 5)
    ink = images[..., 0]
    if rotate or zoom or aspect or shear or shift:
        ink = _affine(ink, k_affine, rotate, zoom, aspect, shear, shift)
    if gamma != 1.0:
        g = jnp.exp(jax.random.uniform(k_gamma, (b, 1, 1), minval=-np.log(gamma), maxval=np.log(gamma)))
        ink = jnp.maximum(ink, 0.0) ** g
    if blur:
        ink = _gaussian_blur(ink, jax.random.uniform(k_blur, (b,), maxval=blur))
    if noise:
        std = jax.random.uniform(k_std, (b, 1, 1), maxval=noise)
        ink = ink + std * jax.random.normal(k_noise, ink.shape, ink.dtype)
    return jnp.clip(ink, 0.0, 1.0)[..., None]


def _loss(graphdef, params, rest, images, labels, label_smoothing: float):
    logits_ = nnx.merge(graphdef, params, rest)(images)
    target = optax.smooth_labels(jax.nn.one_hot(labels, NUM_CLASSES), label_smoothing)
    loss = optax.softmax_cross_entropy(logits_, target).mean()
    return loss, jnp.mean(jnp.argmax(logits_, -1) == labels)


def make_step(graphdef, tx: optax.GradientTransformation, config: TrainConfig):
    """The jitted update ``step(state, images (B, 16, 16, 1) in [0, 1], labels (B,), key) -> (state, metrics)``.

    Perturbs the batch (``perturb``), takes one clipped-AdamW step on the smoothed cross-entropy;
    metrics ``{"loss", "accuracy", "grad_norm"}`` (accuracy on the perturbed batch).

    Args:
        graphdef: the ``nnx.GraphDef`` of the ``ClassifierNet`` whose parameters the state holds.
        tx: the optimiser (``config.optimizer().make()``).
        config: the run's settings (its perturbation ranges and label smoothing).

    Returns:
        The jitted ``step`` function; ``key`` is a PRNG key drawing the batch's perturbations.
    """
    perturbation = config.perturbation()

    def step(state: TrainState, images, labels, key):
        images = perturb(images, key, **perturbation)
        grad_fn = jax.value_and_grad(_loss, argnums=1, has_aux=True)
        (loss, accuracy), grads = grad_fn(graphdef, state.params, state.rest, images, labels, config.label_smoothing)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.tree.norm(grads)}
        return TrainState(params, state.rest, opt_state, state.step + 1), metrics

    return jax.jit(step)


def training_data(*, seed: int = 0, copies: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """The training renders: the **train** split, ``copies`` renders each with random attributes.

    Args:
        seed: the run's seed; the renders use ``digits.augment`` seed ``RENDER_SEED + seed``.
        copies: renders of each train digit.

    Returns:
        Images ``(1438 * copies, 16, 16, 1)`` float32 in [0, 1] and digits ``(1438 * copies,)`` int32.
    """
    data = digits.augment(*digits.load_images("train"), seed=RENDER_SEED + seed, copies=copies)
    return ((data.image + 1.0) / 2.0).astype(np.float32), data.digit


def _batches(
    images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Shuffled full batches forever; epoch ``e``'s order is drawn from ``(seed, e)``."""
    for epoch in itertools.count():
        order = np.random.default_rng((seed, epoch)).permutation(len(labels))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            yield images[index], labels[index]


def train(config: TrainConfig = TrainConfig(), *, log_every: int = 100, echo: bool = False) -> tuple[Card, list[dict]]:
    """Train a classifier card from scratch: deterministic in ``config.seed`` (init, renders, batch order, perturbations).

    Args:
        config: the run's settings.
        log_every: steps between metric rows (0: none).
        echo: print each metric row as a JSON line.

    Returns:
        The ``digit-classifier`` card and the metric rows ``{"step", "loss", "accuracy", "grad_norm"}``, one every
        ``log_every`` steps and one at the last step.
    """
    seed = config.seed
    k_init, k_steps = jax.random.split(jax.random.key(seed))
    model = ClassifierNet(config.network, rngs=nnx.Rngs(params=k_init))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = config.optimizer().make()
    state = TrainState(params, rest, tx.init(params), jnp.zeros((), jnp.int32))
    step = make_step(graphdef, tx, config)
    images, labels = training_data(seed=seed, copies=config.copies)
    history = []
    for i, (x, y) in zip(range(config.steps), _batches(images, labels, config.batch_size, seed)):
        state, metrics = step(state, x, y, jax.random.fold_in(k_steps, i))
        if log_every and ((i + 1) % log_every == 0 or i + 1 == config.steps):
            row = {"step": i + 1, **{k: round(float(v), 4) for k, v in metrics.items()}}
            history.append(row)
            if echo:
                print(json.dumps(row), flush=True)
    spec = nnx.eval_shape(lambda: build(config.network)).spec
    return Card({COMPONENT: nnx.merge(graphdef, state.params, state.rest)}, spec), history


# ------------------------------------------------------------------------------------------------ evaluation
def heldout_renders(*, seed: int = 1, copies: int = 2) -> digits.ImageDataset:
    """Fresh renders of the **heldout** split (unseen in training), random attributes; images in [-1, 1].

    Args:
        seed: the ``digits.augment`` seed.
        copies: renders of each heldout digit.

    Returns:
        The ``ImageDataset`` of ``359 * copies`` renders: images ``(N, 16, 16, 1)`` float32 in ``[-1, 1]`` and
        their int32 labels.
    """
    return digits.augment(*digits.load_images("heldout"), seed=seed, copies=copies)


def generated_images(
    *, repeats: int = 2, seed: int = 0, card: Card | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Images of the bundled ``flux-t2i`` generator for every full prompt (120 label combinations × ``repeats``).

    Args:
        repeats: images per prompt.
        seed: the first generation seed.
        card: the generator (default: the bundled ``flux-t2i``).

    Returns:
        Images ``(120 * repeats, 16, 16, 1)`` float32 in [0, 1] and the prompted labels
        ``{"digit"|"stroke"|"position"|"brightness": (120 * repeats,) int32}``; row ``r * 120 + i``
        uses generation seed ``seed + 1000 * r + i`` and guidance 1.0.
    """
    import jaxpipe as jp

    card = jp.cards.load("flux-t2i") if card is None else card
    combos = np.array(list(itertools.product(range(10), range(2), range(3), range(2))), np.int32)
    prompts = [f"{DIGIT_WORDS[d]} {STROKES[s]} {POSITIONS[p]} {BRIGHTNESS[b]}" for d, s, p, b in combos]
    images = [
        np.asarray(
            jp.generate(card, prompts, seed=[seed + 1000 * r + i for i in range(len(prompts))], guidance=1.0)["image"]
        )
        for r in range(repeats)
    ]
    labels = np.tile(combos, (repeats, 1))
    names = ("digit", "stroke", "position", "brightness")
    return np.concatenate(images).astype(np.float32), {name: labels[:, i] for i, name in enumerate(names)}


def evaluate(card: Card) -> dict[str, Any]:
    """The classifier's accuracy on heldout renders (clean and perturbed) and on generated images.

    Generated: accuracy against the prompted digit, agreement with the digit-scorer, and the
    scorer's own accuracy against the prompt, for comparison.

    Args:
        card: a ``digit-classifier`` card.

    Returns:
        ``{"heldout_renders", "heldout_renders_perturbed", "generated_vs_prompt", "generated_agree_with_scorer",
        "scorer_generated_vs_prompt"}``: accuracies in ``[0, 1]``, rounded to 4 decimals (``heldout_renders``
        of ``heldout_renders()``; generated: ``generated_images()`` of the bundled ``flux-t2i``).
    """
    import jaxpipe as jp
    from jaxpipe.digits import digit_scorer

    held = heldout_renders()
    clean = (held.image + 1.0) / 2.0
    perturbed = np.asarray(perturb(jnp.asarray(clean), jax.random.key(1), **TrainConfig().perturbation()))
    images, prompted = generated_images()
    ours = predict(card, images)
    scorer = np.asarray(digit_scorer.predict(jp.cards.load("digit-scorer"), jnp.asarray(images) * 2.0 - 1.0)["digit"])
    return {
        "heldout_renders": round(float(np.mean(predict(card, clean) == held.digit)), 4),
        "heldout_renders_perturbed": round(float(np.mean(predict(card, perturbed) == held.digit)), 4),
        "generated_vs_prompt": round(float(np.mean(ours == prompted["digit"])), 4),
        "generated_agree_with_scorer": round(float(np.mean(ours == scorer)), 4),
        "scorer_generated_vs_prompt": round(float(np.mean(scorer == prompted["digit"])), 4),
    }


def pretrain(out_dir: str | os.PathLike, config: TrainConfig = TrainConfig(), *, progress: bool = True) -> Card:
    """Train a classifier (``train``, its log lines printed with ``progress``), save it with ``save_card``
    plus ``metrics.json`` in ``out_dir``; returns the card.

    Args:
        out_dir: the directory to write the card and its ``metrics.json`` (``evaluate``'s accuracies) to.
        config: the run's settings.
        progress: print the training log lines.

    Returns:
        The trained card.
    """
    start = time.perf_counter()
    card, history = train(config, echo=progress)
    train_seconds = time.perf_counter() - start
    accuracy = evaluate(card)
    out_dir = Path(out_dir)
    jaxpipe.cards.save_card(card, out_dir)
    write_metrics(
        out_dir,
        "classifier",
        config,
        card,
        train_seconds=train_seconds,
        total_seconds=time.perf_counter() - start,
        trained_on=f"train split (1438 digits) x {config.copies} renderings (augment seed {RENDER_SEED + config.seed})",
        accuracy=accuracy,
        accuracy_notes={
            "heldout_renders": "the heldout split (never seen in training), augment(seed=1, copies=2): 718 images",
            "heldout_renders_perturbed": "the same images through the training perturbation (key 1)",
            "generated_vs_prompt": "flux-t2i, all 120 full prompts x 2 seeds (guidance 1.0): predicted vs prompted digit",
            "generated_agree_with_scorer": "the same 240 images: this classifier's digit == digit-scorer's digit",
            "scorer_generated_vs_prompt": "the digit-scorer's accuracy on those images, for comparison",
        },
        final_metrics=history[-1],
    )
    return card


def main(argv: list[str] | None = None) -> None:
    """The recipe's command line: ``--out DIR``, one flag per ``TrainConfig`` field, ``--quiet``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).
    """
    run_recipe(TrainConfig, __doc__.split("\n")[0], pretrain, argv, report="metrics.json")


if __name__ == "__main__":
    main()
