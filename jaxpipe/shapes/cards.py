"""The shapes world's cards: ``shapes-t2i`` (text-to-image), ``shapes-t2v`` (text-to-video) and ``shapes-unified``
(a refiner LM in front of ``shapes-t2i``'s generator), all core toy families speaking the shapes vocabulary on 32×32 RGB.

``config(model_id)`` is the CPU-test-sized config ``jp.cards.build(model_id)`` builds (16×16 unless told);
``bundled_config(model_id)`` the sizes of the pretrained card in ``assets/`` (what ``jaxpipe.shapes.pretrain``
trains): a 4× autoencoder to 8×8×8 latents and a DiT of width 128 and depth 4 over its 2×2 patches;
``shapes-unified`` has exactly ``shapes-t2i``'s generator fields plus the default ``RefinerLM`` (dim 64 × 2 blocks).
``register()`` puts the ids and their asset folders into the core's registry.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxpipe.cards import registry, toy_t2i, toy_t2v, toy_unified
from jaxpipe.cards.generator import vocab_size
from jaxpipe.loops import denoise
from jaxpipe.nn import AutoencoderConfig, DiTConfig, TextEncoderConfig
from jaxpipe.shapes.words import VOCABULARY

__all__ = ["ASSETS", "FAMILIES", "DESCRIPTIONS", "BUNDLED", "MAX_WORDS", "config", "bundled_config", "register"]

ASSETS = Path(__file__).resolve().parent / "assets"
"""The bundled pretrained cards, one folder per card id."""
FAMILIES = {"shapes-t2i": toy_t2i, "shapes-t2v": toy_t2v, "shapes-unified": toy_unified}
"""Card id -> the core toy family that builds it."""
DESCRIPTIONS = {
    "shapes-t2i": "text-to-image: a DiT draws coloured shapes (32×32 RGB) from a GenEval-style prompt (guidance 4)",
    "shapes-t2v": "text-to-video: shapes-t2i's networks over 8 frames of shapes moving as told",
    "shapes-unified": "a refiner LM continues the prompt (up to 3 words), then shapes-t2i's generator draws it",
}
"""Card id -> the one line ``jaxpipe cards`` prints for it."""
BUNDLED = ("shapes-t2i", "shapes-t2v", "shapes-unified")
"""The ids whose pretrained weights ship in ``ASSETS``."""
MAX_WORDS = 12
"""The longest prompt the cards read, in words (``"a big red circle moving left and a small blue square still"``).
``shapes-unified`` keeps 3 of them for its refiner: its prompts have at most 9 words, and the longest image
prompt of the grammar has 8 (``"a big red circle left of a small blue triangle"`` would be 10, but the grammar
names sizes on one-object prompts only)."""


def config(model_id: str, **changes):
    """The test-sized config of ``model_id`` (the family's CPU-test sizes, RGB, the shapes vocabulary), with ``changes``.

    Args:
        model_id: ``"shapes-t2i"``, ``"shapes-t2v"`` or ``"shapes-unified"``.
        **changes: config fields to set.

    Returns:
        The family's ``Config``.

    Raises:
        KeyError: if ``model_id`` is not a shapes card.
    """
    if model_id not in FAMILIES:
        raise KeyError(f"{model_id!r} is not a shapes card; the shapes cards are {sorted(FAMILIES)}")
    module = FAMILIES[model_id]
    text = TextEncoderConfig(vocab_size=vocab_size(VOCABULARY), max_len=MAX_WORDS)
    base = module.Config(vocabulary=VOCABULARY, text=text, vae=AutoencoderConfig(image_channels=3))
    return dataclasses.replace(base, **changes) if changes else base


def bundled_config(model_id: str, **changes):
    """The config of the pretrained card ``model_id``: 32×32 RGB, a 4× autoencoder (widths 16, 32, 64) to 8
    latent channels, a text encoder of width 64 and a DiT of width 128 × 4 blocks × 4 heads, served with 8
    steps and guidance 4 (measured best of 1-6: 42% overall against 36% at 3, 21% at 1). ``shapes-unified``:
    exactly these generator fields of ``shapes-t2i`` (its generator is that card's, by reference), plus the
    family's default refiner LM and refinement (3 words at temperature 1).

    Args:
        model_id: ``"shapes-t2i"``, ``"shapes-t2v"`` or ``"shapes-unified"``.
        **changes: config fields to set.

    Returns:
        The family's ``Config`` at the bundled sizes.

    Raises:
        KeyError: if ``model_id`` is not a shapes card.
    """
    if model_id == "shapes-unified":
        generator = bundled_config("shapes-t2i")
        base = config(model_id, **{f.name: getattr(generator, f.name) for f in dataclasses.fields(toy_t2i.Config)})
        return dataclasses.replace(base, **changes) if changes else base
    text = TextEncoderConfig(vocab_size=vocab_size(VOCABULARY), dim=64, depth=2, heads=4, max_len=MAX_WORDS)
    base = config(
        model_id,
        image_size=32,
        text=text,
        dit=DiTConfig(latent_channels=8, dim=128, depth=4, heads=4, text_dim=64),
        vae=AutoencoderConfig(image_channels=3, latent_channels=8, widths=(16, 32, 64)),
        sampling=denoise.DenoiseConfig(num_steps=8, guidance=4.0),
    )
    return dataclasses.replace(base, **changes) if changes else base


def register() -> None:
    """Register ``shapes-t2i``, ``shapes-t2v`` and ``shapes-unified`` (test-sized configs; the bundled checkpoints
    where they ship)."""
    for model_id, module in FAMILIES.items():
        path = ASSETS / model_id
        shipped = (path / "config.json").is_file()
        registry.register_card(
            model_id,
            module.FAMILY.name,
            config=lambda model_id=model_id: config(model_id),
            path=path if shipped else None,
            rebuild=f"python -m jaxpipe.shapes.pretrain {model_id} --out {path}" if shipped else None,
            description=DESCRIPTIONS[model_id],
        )
