"""What a generator's finetune reads: captioned pixels encoded once by the card's frozen autoencoder, then
endless shuffled fixed-size batches of them (epoch ``e`` permuted by ``(seed, e)``, so a resumed run sees the
same batches). Every world's pretraining recipe feeds ``Finetune`` through these two functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpipe.card import Card
from jaxpipe.cards import generator

__all__ = ["encode_captioned", "array_batches"]


def encode_captioned(
    card: Card, pixels: np.ndarray, captions: Sequence[str], chunk: int = 256
) -> dict[str, np.ndarray]:
    """``{"latents": (N, T, h, w, C), "ids": (N, L)}``: images or videos and their captions, encoded once.

    Args:
        card: a text-to-image/video card with ``"vae"`` and ``"text_encoder"`` components.
        pixels: ``(N, H, W, C)`` images (latents get ``T = 1``) or ``(N, T, H, W, C)`` videos in the
            autoencoder's pixel range.
        captions: ``N`` captions in the card's tokenizer's words.
        chunk: images or videos encoded per jitted call.

    Returns:
        The latents (NumPy, the autoencoder's dtype) and the captions' token ids ``(N, L)``, ``L`` the text
        encoder's ``max_len``.

    Raises:
        ValueError: if ``pixels`` and ``captions`` differ in length.
    """
    if len(pixels) != len(captions):
        raise ValueError(f"{len(pixels)} images or videos but {len(captions)} captions")
    encode = jax.jit(lambda vae, x: generator.TEXT_FLOW.latents({"vae": vae}, x))
    name = "video" if pixels.ndim == 5 else "image"
    latents = np.concatenate(
        [
            np.asarray(encode(card["vae"], {name: jnp.asarray(pixels[i : i + chunk])}))
            for i in range(0, len(pixels), chunk)
        ]
    )
    ids = card.spec.tokenizer.encode(list(captions), card["text_encoder"].cfg.max_len)
    return {"latents": latents, "ids": ids}


def array_batches(arrays: dict[str, np.ndarray], batch_size: int, *, seed: int) -> Iterator[dict[str, jax.Array]]:
    """Endless shuffled fixed-size batches (as jax arrays) of equally long arrays; epoch ``e`` uses ``(seed, e)``.

    Each epoch is a fresh permutation; its last ``n % batch_size`` rows are left out.

    Args:
        arrays: ``{name: (n, ...)}`` arrays of one length ``n``.
        batch_size: rows per batch, in ``1..n``.
        seed: the shuffling seed.

    Returns:
        An endless iterator of ``{name: (batch_size, ...) jax.Array}``.

    Raises:
        ValueError: if ``batch_size`` is not in ``1..n`` (on the first ``next``: it is a generator).
    """
    n = len(next(iter(arrays.values())))
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in 1..{n} (got {batch_size})")
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for i in range(0, n - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            yield {k: jnp.asarray(v[idx]) for k, v in arrays.items()}
        epoch += 1
