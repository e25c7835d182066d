"""The ``digit-classifier`` card: an independent digit classifier to judge generators by.

The digit-scorer rewards the RL methods; judging them by the same weights cannot see reward
hacking. This card is independent of it in every way that matters: another architecture
(``network``), another split, other renders, other perturbations, another seed (its recipe:
``jaxpipe.digits.pretrain.classifier``).

Pixel convention: every public function takes images ``(N, 16, 16, 1)`` float in **[0, 1]**,
background 0 — the generators' output (``jp.generate(...)["image"]``). Renders from
``digits.load_images`` / ``augment`` are in ``[-1, 1]``: pass ``(x + 1) / 2``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxpipe.card import Card, CardSpec, LoopSpec
from jaxpipe.digits import images as images_
from jaxpipe.digits.digit_classifier.network import ClassifierNet, Config

__all__ = [
    "COMPONENT",
    "FAMILY_NAME",
    "LOOP_ID",
    "MODEL_ID",
    "build",
    "check_images",
    "logits",
    "predict",
    "probabilities",
]

MODEL_ID = "digit-classifier"
"""The bundled card's id."""
FAMILY_NAME = "digit_classifier"
"""The card family's name."""
LOOP_ID = "classify"
"""The card's one loop (a ``score`` loop over the classifier)."""
COMPONENT = "classifier"
"""The card's one component, a ``ClassifierNet``."""

_CHUNK = 512  # images per forward pass in predict / probabilities (one compiled shape)


def build(config: Config = Config(), *, seed: int = 0, model_id: str = MODEL_ID) -> Card:
    """A ``digit-classifier`` card with a freshly initialised network (deterministic in ``seed``).

    Args:
        config: the network's sizes.
        seed: the initialisation seed.
        model_id: the card's id.

    Returns:
        The card: one component, ``COMPONENT``, bound by one loop, ``LOOP_ID``.
    """
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


def check_images(images, image_shape: tuple[int, int, int] = images_.IMAGE_SHAPE) -> jax.Array:
    """``images`` as a float32 array ``(N, S, S, 1)``, or a ValueError naming the problem (``digits.images.check``).

    Under ``jax.jit`` only the shape and dtype are checked (the values are not concrete).

    Args:
        images: ``(N, *image_shape)`` floating point in ``[0, 1]`` (NumPy or JAX).
        image_shape: one image's shape, ``(S, S, 1)``.

    Returns:
        The images, a float32 ``jax.Array``.

    Raises:
        ValueError: on a wrong shape or dtype, non-finite values, or values outside ``[0, 1]``.
    """
    return jnp.asarray(images_.check(images, image_shape), jnp.float32)


def logits(card: Card, images: jax.Array) -> jax.Array:
    """Digit logits ``(N, 10)`` for images ``(N, 16, 16, 1)`` in [0, 1]; pure and jittable.

    Args:
        card: a ``digit-classifier`` card.
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The logits, float32 ``(N, 10)``.

    Raises:
        ValueError: on a wrong shape or dtype, non-finite values, or values outside ``[0, 1]``.
    """
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

    Runs jitted in chunks of 512 images.

    Args:
        card: a ``digit-classifier`` card.
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The probabilities, float32 NumPy ``(N, 10)``.

    Raises:
        ValueError: on a wrong shape or dtype, non-finite values, or values outside ``[0, 1]``.
    """
    return np.asarray(jax.nn.softmax(_chunked(card, images), axis=-1))


def predict(card: Card, images) -> np.ndarray:
    """The most likely digit ``(N,)`` int32 (0..9) for images ``(N, 16, 16, 1)`` in [0, 1] (as ``probabilities``).

    Args:
        card: a ``digit-classifier`` card.
        images: ``(N, 16, 16, 1)`` floating point in ``[0, 1]``, background 0 (NumPy or JAX).

    Returns:
        The digits, int32 NumPy ``(N,)``.

    Raises:
        ValueError: on a wrong shape or dtype, non-finite values, or values outside ``[0, 1]``.
    """
    return np.argmax(_chunked(card, images), axis=-1).astype(np.int32)
