"""The ``digit-classifier`` card: an independent digit classifier to judge generators by.

The digit-scorer rewards the RL methods; judging them by the same weights cannot see reward
hacking. This card is independent of it in every way that matters: another architecture,
another split, other renders, other perturbations, another seed.

* Architecture (``ClassifierNet``): the ink is normalised to peak 1 (brightness cannot matter);
  a 4×4 stride-2 stem (16 -> 8 px); per width ``depth`` ConvNeXt-style residual blocks (depthwise
  3×3, LayerNorm, pointwise expand / GELU / project) and, between widths, 2×2 average pooling
  plus a pointwise projection; then **global** mean and max pooling, LayerNorm and one linear
  layer. No coordinate channels and no flattened feature map, so where the digit sits cannot
  inform the class (the scorer appends coordinates, flattens its map into an MLP trunk and has
  no normalisation). 27,970 parameters, digit head only.
* Data: the generators' ``"train"`` split (the scorer never saw it), rendered ``copies`` times
  with uniformly drawn stroke/position/brightness (``digits.augment``, seed ``RENDER_SEED + seed``).
* Perturbations (``perturb``, inside the jitted step): a random affine map (rotation, zoom,
  aspect, shear, sub-pixel shift), an ink gamma, a Gaussian blur and pixel noise.

Pixel convention: every public function takes images ``(N, 16, 16, 1)`` float in **[0, 1]**,
background 0 — the generators' output (``jp.generate(...)["image"]``). Renders from
``digits.load_images`` / ``augment`` are in ``[-1, 1]``: pass ``(x + 1) / 2``.

The bundled weights (``jaxpipe/digits/assets/digit-classifier``) are reproduced (same seed, same
machine ⇒ same bits) by::

    python -m jaxpipe.digits.classifier --out jaxpipe/digits/assets/digit-classifier [--steps N] [--seed S]

Loading it: ``register()`` (adds the family unless it is registered), then
``jaxpipe.cards.load_card(ASSET)`` — or ``load()``, which does both.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxpipe.cards
from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.cards.checkpoint import config_to_dict
from jaxpipe.cards.family import Family
from jaxpipe.digits import data as digits
from jaxpipe.digits.words import BRIGHTNESS, DIGIT_WORDS, POSITIONS, STROKES
from jaxpipe.program import Bound, ComponentNode, Program
from jaxpipe.request import Request

__all__ = [
    "ASSET",
    "COMPONENT",
    "FAMILY",
    "LOOP_ID",
    "MODEL_ID",
    "FAMILY_NAME",
    "RENDER_SEED",
    "ClassifierNet",
    "Config",
    "TrainConfig",
    "TrainState",
    "build",
    "check_images",
    "evaluate",
    "generated_images",
    "heldout_renders",
    "load",
    "logits",
    "make_step",
    "perturb",
    "predict",
    "pretrain",
    "probabilities",
    "program",
    "register",
    "train",
    "training_data",
]

MODEL_ID = "digit-classifier"
FAMILY_NAME = "digit_classifier"
LOOP_ID = "classify"
COMPONENT = "classifier"
NUM_CLASSES = len(DIGIT_WORDS)
ASSET = Path(__file__).resolve().parent / "assets" / MODEL_ID
"""The bundled card's folder (``config.json``, ``weights.safetensors``, ``metrics.json``)."""

RENDER_SEED = 7919
"""Offset of the training renders' ``augment`` seed: ``RENDER_SEED + seed`` (the scorer renders with ``seed``)."""

MIN_PEAK = 0.1
"""Peak ink below which an image is not brightened further (a blank image's noise is not blown up)."""

_RANGE_SLACK = 1e-5  # float rounding allowed outside [0, 1]
_CHUNK = 512  # images per forward pass in predict / probabilities (one compiled shape)


# ------------------------------------------------------------------------------------------------ network
@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that shapes a ``digit-classifier`` card.

    ``widths``: channels per resolution, after the stride-2 stem (8 and 4 px for two widths);
    ``depth``: residual blocks per width; ``expansion``: the pointwise layers' hidden width per
    channel in each block.
    """

    image_size: int = 16
    widths: tuple[int, ...] = (24, 48)
    depth: int = 2
    expansion: int = 2

    def __post_init__(self):
        if not self.widths or min(self.widths) <= 0 or self.expansion <= 0 or self.depth <= 0:
            raise ValueError(f"widths, depth and expansion must be positive (got {self.widths}, {self.depth}, {self.expansion})")
        if self.image_size % 2 ** len(self.widths):
            raise ValueError(f"image_size {self.image_size} must be divisible by 2**{len(self.widths)}")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """Per-image input shape ``(S, S, 1)``."""
        return (self.image_size, self.image_size, 1)


class _Depthwise(nnx.Module):
    """Depthwise 3×3 convolution (one filter per channel, zero padding) of ``(B, H, W, C)``.

    Written as nine shifted products: XLA's CPU backend runs a grouped ``conv_general_dilated``
    some 50× slower than this at these sizes (measured: 43 ms vs 0.9 ms for 128 × 16 × 16 × 16).
    """

    def __init__(self, width: int, rngs: nnx.Rngs):
        self.kernel = nnx.Param(jax.random.normal(rngs.params(), (3, 3, width)) / 3.0)  # fan-in 9
        self.bias = nnx.Param(jnp.zeros((width,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        h, w = x.shape[1:3]
        padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        k = self.kernel[...]
        return sum(k[i, j] * padded[:, i : i + h, j : j + w] for i in range(3) for j in range(3)) + self.bias[...]


class _Block(nnx.Module):
    """Residual ``x + W2 gelu(W1 LN(dw3x3(x)))`` at one width (ConvNeXt's layout, tiny)."""

    def __init__(self, width: int, expansion: int, rngs: nnx.Rngs):
        self.depthwise = _Depthwise(width, rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        # pointwise (1×1) layers as Linear over the channel axis: the same map, ~2× faster on CPU than a 1×1 Conv
        self.expand = nnx.Linear(width, width * expansion, rngs=rngs)
        self.project = nnx.Linear(width * expansion, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.project(jax.nn.gelu(self.expand(self.norm(self.depthwise(x)))))


class ClassifierNet(nnx.Module):
    """Images ``(B, S, S, 1)`` in [0, 1] -> digit logits ``(B, 10)`` (float32)."""

    def __init__(self, cfg: Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        w = cfg.widths
        self.stem = nnx.Conv(1, w[0], (4, 4), strides=2, padding="SAME", rngs=rngs)
        self.blocks = nnx.List([nnx.List([_Block(c, cfg.expansion, rngs) for _ in range(cfg.depth)]) for c in w])
        self.downs = nnx.List([nnx.Linear(w[i], w[i + 1], rngs=rngs) for i in range(len(w) - 1)])
        self.head_norm = nnx.LayerNorm(2 * w[-1], rngs=rngs)
        self.head = nnx.Linear(2 * w[-1], NUM_CLASSES, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = jnp.asarray(images, jnp.float32)
        # the class must not depend on brightness: scale every digit to peak ink 1
        peak = jnp.max(x, axis=(1, 2, 3), keepdims=True)
        x = x / jnp.maximum(peak, MIN_PEAK) * 2.0 - 1.0
        h = self.stem(x)
        for i, stage in enumerate(self.blocks):
            if i:
                b, s, _, c = h.shape
                h = self.downs[i - 1](h.reshape(b, s // 2, 2, s // 2, 2, c).mean(axis=(2, 4)))
            for block in stage:
                h = block(h)
        pooled = jnp.concatenate([h.mean(axis=(1, 2)), h.max(axis=(1, 2))], axis=-1)
        return self.head(self.head_norm(pooled)).astype(jnp.float32)


# ------------------------------------------------------------------------------------------------ the card
def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``digit-classifier`` card with a freshly initialised network (deterministic in ``seed``)."""
    spec = CardSpec(
        model_id=model_id,
        family=FAMILY_NAME,
        loops=(LoopSpec(LOOP_ID, "score", (COMPONENT,)),),
        recipe=(LOOP_ID,),
        parity=("C0", "C1", "C4"),
        capabilities=("classify",),
        config=config,
    )
    return Card({COMPONENT: ClassifierNet(config, rngs=nnx.Rngs(seed))}, spec)


def check_images(images, image_shape: tuple[int, int, int] = (digits.SIZE, digits.SIZE, 1)) -> jax.Array:
    """``images`` as a float array ``(N, S, S, 1)``, or a ValueError naming the problem.

    Shape and dtype are always checked; the range ``[0, 1]`` (and finiteness) when the values are
    concrete (not under ``jax.jit``).
    """
    if not isinstance(images, jax.core.Tracer):
        images = np.asarray(images)
    if images.ndim != 4 or tuple(images.shape[1:]) != tuple(image_shape) or images.shape[0] == 0:
        raise ValueError(
            f"images must have shape (N, {', '.join(map(str, image_shape))}) with N >= 1, in [0, 1]; got {tuple(images.shape)}"
        )
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise ValueError(f"images must be floating point in [0, 1]; got dtype {images.dtype}")
    if not isinstance(images, jax.core.Tracer):
        if not np.isfinite(images).all():
            raise ValueError("images contain NaN or infinite values")
        low, high = float(images.min()), float(images.max())
        if low < -_RANGE_SLACK or high > 1.0 + _RANGE_SLACK:
            raise ValueError(
                f"images must be in [0, 1] (background 0; got values in [{low:.3g}, {high:.3g}]); "
                "map [-1, 1] images with (x + 1) / 2"
            )
    return jnp.asarray(images, jnp.float32)


def logits(card: Card, images: jax.Array) -> jax.Array:
    """Digit logits ``(N, 10)`` for images ``(N, 16, 16, 1)`` in [0, 1]; pure and jittable."""
    return card[COMPONENT](check_images(images, card.spec.config.image_shape))


_logits = jax.jit(logits)


def _chunked(card: Card, images) -> np.ndarray:
    images = np.asarray(check_images(images, card.spec.config.image_shape))
    n = len(images)
    size = min(_CHUNK, n)
    out = []
    for start in range(0, n, size):
        part = images[start : start + size]
        pad = size - len(part)  # the last chunk is padded so every call has one shape (one compile)
        part = np.concatenate([part, np.zeros((pad, *part.shape[1:]), part.dtype)]) if pad else part
        out.append(np.asarray(_logits(card, part))[: size - pad])
    return np.concatenate(out)


def probabilities(card: Card, images) -> np.ndarray:
    """Class probabilities ``(N, 10)`` (rows sum to 1) for images ``(N, 16, 16, 1)`` in [0, 1].

    Runs jitted in chunks of 512 images. Raises ValueError on a wrong shape or dtype, or values
    outside ``[0, 1]``.
    """
    return np.asarray(jax.nn.softmax(_chunked(card, images), axis=-1))


def predict(card: Card, images) -> np.ndarray:
    """The most likely digit ``(N,)`` int32 (0..9) for images ``(N, 16, 16, 1)`` in [0, 1] (as ``probabilities``)."""
    return np.argmax(_chunked(card, images), axis=-1).astype(np.int32)


def _classify(card: Card, reads: Mapping[str, Any]) -> dict[str, Any]:
    return {"probabilities": jax.nn.softmax(card[COMPONENT](reads["image"]), axis=-1)}


def _bind(card: Card, request: Request) -> Bound:
    expected = card.spec.config.image_shape
    if request.image is None:
        raise ValueError(f"{card.model_id!r} classifies an image: the request needs image={expected} in [0, 1]")
    image = check_images(np.asarray(request.image)[None], expected)
    return Bound(slots={"image": image}, settings=())


@functools.cache
def program() -> Program:
    """Reads ``image`` ``(H, W, 1)`` in [0, 1] and returns the artifact ``"probabilities"`` ``(10,)``."""
    return Program(
        name="classify",
        inputs=("image",),
        nodes=(ComponentNode("classify", _classify, reads=("image",), writes=("probabilities",), component=COMPONENT),),
        outputs=(("probabilities", "probabilities"),),
        bind=_bind,
    )


FAMILY = Family(name=FAMILY_NAME, config=Config, build=build, programs={"classify": program}, model_id=MODEL_ID)


def register() -> Family:
    """Register ``FAMILY`` with ``jaxpipe.cards`` unless a family of that name is registered; returns the registered one."""
    if FAMILY_NAME not in jaxpipe.cards.registry.FAMILIES:
        jaxpipe.cards.register_family(FAMILY)
    return jaxpipe.cards.family(FAMILY_NAME)


def load(path: str | os.PathLike = ASSET) -> Card:
    """The classifier card saved at ``path`` (default: the bundled one), registering the family first."""
    register()
    return jaxpipe.cards.load_card(path)


# ------------------------------------------------------------------------------------------------ training
@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Network, optimiser, data and perturbation settings of a classifier run.

    Perturbation ranges (``perturb``): ``rotate`` degrees, ``zoom`` (isotropic scale ``1 ± zoom``),
    ``aspect`` (x-scale ``1 ± aspect`` relative to y), ``shear``, ``shift`` (px), ``gamma`` (ink
    ``** g`` with ``log g ~ U(±log gamma)``), ``blur`` (Gaussian sigma ``U(0, blur)`` px), ``noise``
    (pixel noise std ``U(0, noise)``, ink units). ``copies``: renders of each train digit.
    """

    network: Config = Config()
    steps: int = 1200
    batch_size: int = 128
    learning_rate: float = 4e-3
    warmup_steps: int = 75
    weight_decay: float = 5e-4
    grad_clip: float = 1.0
    label_smoothing: float = 0.05
    copies: int = 8
    rotate: float = 12.0
    zoom: float = 0.1
    aspect: float = 0.1
    shear: float = 0.15
    shift: float = 1.5
    gamma: float = 1.5
    blur: float = 0.8
    noise: float = 0.06

    def __post_init__(self):
        for name in ("steps", "batch_size", "copies"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive int (got {value!r})")
        if self.learning_rate <= 0 or self.grad_clip <= 0 or self.warmup_steps < 0 or self.weight_decay < 0:
            raise ValueError("need learning_rate > 0, grad_clip > 0, warmup_steps >= 0 and weight_decay >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1) (got {self.label_smoothing})")
        if not (0 <= self.rotate <= 45 and 0 <= self.zoom < 0.5 and 0 <= self.aspect < 0.5 and 0 <= self.shear < 1):
            raise ValueError("need rotate in [0, 45], zoom and aspect in [0, 0.5), shear in [0, 1)")
        if self.shift < 0 or self.gamma < 1.0 or self.blur < 0 or self.noise < 0:
            raise ValueError("need shift >= 0, gamma >= 1, blur >= 0 and noise >= 0")

    def perturbation(self) -> dict[str, float]:
        """The keyword arguments of ``perturb``."""
        names = ("rotate", "zoom", "aspect", "shear", "shift", "gamma", "blur", "noise")
        return {name: getattr(self, name) for name in names}


class TrainState(NamedTuple):
    """Network parameters, its other variables, the optimiser state and the step counter."""

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


def _optimizer(config: TrainConfig) -> optax.GradientTransformation:
    """Clipped AdamW, linear warm-up then cosine decay to 5% of the peak rate over ``config.steps``."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, max(config.warmup_steps, 1), max(config.steps, config.warmup_steps + 1),
        end_value=0.05 * config.learning_rate,
    )
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adamw(schedule, weight_decay=config.weight_decay))


def _loss(graphdef, params, rest, images, labels, label_smoothing: float):
    logits_ = nnx.merge(graphdef, params, rest)(images)
    target = optax.smooth_labels(jax.nn.one_hot(labels, NUM_CLASSES), label_smoothing)
    loss = optax.softmax_cross_entropy(logits_, target).mean()
    return loss, jnp.mean(jnp.argmax(logits_, -1) == labels)


def make_step(graphdef, tx: optax.GradientTransformation, config: TrainConfig):
    """The jitted update ``step(state, images (B, 16, 16, 1) in [0, 1], labels (B,), key) -> (state, metrics)``.

    Perturbs the batch (``perturb``), takes one clipped-AdamW step on the smoothed cross-entropy;
    metrics ``{"loss", "accuracy", "grad_norm"}`` (accuracy on the perturbed batch).
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

    Returns images ``(1438 * copies, 16, 16, 1)`` float32 in [0, 1] and digits ``(1438 * copies,)`` int32.
    """
    data = digits.augment(*digits.load_images("train"), seed=RENDER_SEED + seed, copies=copies)
    return ((data.image + 1.0) / 2.0).astype(np.float32), data.digit


def _batches(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Shuffled full batches forever; epoch ``e``'s order is drawn from ``(seed, e)``."""
    for epoch in itertools.count():
        order = np.random.default_rng((seed, epoch)).permutation(len(labels))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            index = order[start : start + batch_size]
            yield images[index], labels[index]


def train(
    config: TrainConfig = TrainConfig(), *, seed: int = 0, log_every: int = 100, echo: bool = False
) -> tuple[Card, list[dict]]:
    """Train a classifier card from scratch: deterministic in ``seed`` (init, renders, batch order, perturbations).

    Returns the card and a row of metrics every ``log_every`` steps and at the last (printed if ``echo``).
    """
    k_init, k_steps = jax.random.split(jax.random.key(seed))
    model = ClassifierNet(config.network, rngs=nnx.Rngs(params=k_init))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = _optimizer(config)
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
    """Fresh renders of the **heldout** split (unseen in training), random attributes; images in [-1, 1]."""
    return digits.augment(*digits.load_images("heldout"), seed=seed, copies=copies)


def generated_images(*, repeats: int = 2, seed: int = 0, card: Card | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Images of the bundled ``flux-t2i`` generator for every full prompt (120 label combinations × ``repeats``).

    Returns images ``(120 * repeats, 16, 16, 1)`` in [0, 1] and the prompted labels
    ``{"digit"|"stroke"|"position"|"brightness": (120 * repeats,) int32}``; row ``r * 120 + i``
    uses generation seed ``seed + 1000 * r + i`` and guidance 1.0.
    """
    import jaxpipe as jp

    card = jp.cards.load("flux-t2i") if card is None else card
    combos = np.array(list(itertools.product(range(10), range(2), range(3), range(2))), np.int32)
    prompts = [f"{DIGIT_WORDS[d]} {STROKES[s]} {POSITIONS[p]} {BRIGHTNESS[b]}" for d, s, p, b in combos]
    images = [
        np.asarray(jp.generate(card, prompts, seed=[seed + 1000 * r + i for i in range(len(prompts))], guidance=1.0)["image"])
        for r in range(repeats)
    ]
    labels = np.tile(combos, (repeats, 1))
    names = ("digit", "stroke", "position", "brightness")
    return np.concatenate(images).astype(np.float32), {name: labels[:, i] for i, name in enumerate(names)}


def evaluate(card: Card) -> dict[str, Any]:
    """The classifier's accuracy on heldout renders (clean and perturbed) and on generated images.

    Generated: accuracy against the prompted digit, agreement with the digit-scorer, and the
    scorer's own accuracy against the prompt, for comparison.
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


def pretrain(out_dir: str | os.PathLike, *, seed: int = 0, steps: int | None = None, quiet: bool = False) -> Card:
    """Train a classifier (``train``), save it with ``save_card`` plus ``metrics.json`` in ``out_dir``; returns the card."""
    config = TrainConfig() if steps is None else dataclasses.replace(TrainConfig(), steps=steps)
    register()
    start = time.perf_counter()
    card, history = train(config, seed=seed, echo=not quiet)
    train_seconds = time.perf_counter() - start
    accuracy = evaluate(card)
    out_dir = Path(out_dir)
    jaxpipe.cards.save_card(card, out_dir)
    report = {
        "command": f"python -m jaxpipe.digits.classifier --out {out_dir} --steps {config.steps} --seed {seed}",
        "seed": seed,
        "steps": config.steps,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
        "devices": f"{jax.default_backend()} x{jax.device_count()}",
        "params": card.num_params(),
        "trained_on": f"train split (1438 digits) x {config.copies} renderings (augment seed {RENDER_SEED + seed})",
        "accuracy": accuracy,
        "accuracy_notes": {
            "heldout_renders": "the heldout split (never seen in training), augment(seed=1, copies=2): 718 images",
            "heldout_renders_perturbed": "the same images through the training perturbation (key 1)",
            "generated_vs_prompt": "flux-t2i, all 120 full prompts x 2 seeds (guidance 1.0): predicted vs prompted digit",
            "generated_agree_with_scorer": "the same 240 images: this classifier's digit == digit-scorer's digit",
            "scorer_generated_vs_prompt": "the digit-scorer's accuracy on those images, for comparison",
        },
        "final_metrics": history[-1],
        "config": config_to_dict(config),
    }
    (out_dir / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    return card


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jaxpipe.digits.classifier", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for config.json, weights.safetensors, metrics.json")
    parser.add_argument("--steps", type=int, default=TrainConfig().steps, help=f"training steps (default {TrainConfig().steps})")
    parser.add_argument("--seed", type=int, default=0, help="seed of init, renders, batch order and perturbations")
    parser.add_argument("--quiet", action="store_true", help="no per-100-step log lines")
    args = parser.parse_args(argv)
    if args.steps <= 0 or args.seed < 0:
        parser.error("--steps must be > 0 and --seed >= 0")
    pretrain(args.out, seed=args.seed, steps=args.steps, quiet=args.quiet)
    print((Path(args.out) / "metrics.json").read_text())


if __name__ == "__main__":
    main()
