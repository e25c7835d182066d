"""The digits world's cards: which toy family builds each id, at which sizes, and where its weights ship.

Every bundled card is a core toy family (``jaxpipe.cards.toy_*``) speaking the digits vocabulary,
plus the world's own reward model (``digit-scorer``) and its independent judge (``digit-classifier``). ``config(model_id)`` is the CPU-test-sized
config ``jp.cards.build(model_id)`` builds; ``bundled_config(model_id)`` the sizes of the pretrained
card in ``assets/`` (what the pretraining recipes train). ``register()`` (called by
``jaxpipe.digits.register``) puts both and the asset folders into the core's card registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from jaxpipe.card import Card
from jaxpipe.cards import (
    registry,
    toy_causal,
    toy_i2v,
    toy_mot,
    toy_mot_video,
    toy_multi_expert,
    toy_sigma_moe,
    toy_t2i,
    toy_t2v,
    toy_two_stage,
    toy_unified,
)
from jaxpipe.digits import digit_classifier, digit_scorer
from jaxpipe.digits.captions import ATTRIBUTE_WORDS, ATTRIBUTES
from jaxpipe.digits.words import VOCABULARY
from jaxpipe.loops import denoise
from jaxpipe.loops.chunk import ChunkConfig
from jaxpipe.nn import DiTConfig, LatentUpsamplerConfig, TextEncoderConfig
from jaxpipe.nn.mot import Routing

__all__ = [
    "ASSETS",
    "FAMILIES",
    "OWN",
    "SLOTS",
    "BUNDLED",
    "DESCRIPTIONS",
    "config",
    "bundled_config",
    "multi_expert",
    "register",
]

ASSETS = Path(__file__).resolve().parent / "assets"
"""The bundled pretrained cards, one folder per card id."""

SLOTS: tuple[tuple[str, tuple[str, ...]], ...] = tuple((name, ATTRIBUTE_WORDS[name]) for name in ATTRIBUTES)
"""The refiner slots of a ``multi-expert`` card: one attribute (and its words) per refiner."""

FAMILIES = {
    "flux-t2i": toy_t2i,
    "wan-i2v": toy_i2v,
    "wan-t2v": toy_t2v,
    "ltx2-two-stage": toy_two_stage,
    "wan22-moe": toy_sigma_moe,
    "wan-causal": toy_causal,
    "unified": toy_unified,
    "multi-expert": toy_multi_expert,
    "bagel-mot": toy_mot,
    "cosmos3": toy_mot_video,
}
"""Card id -> the toy family module that builds it (the two judges have the world's own families, ``OWN``)."""

OWN = {"digit-scorer": digit_scorer, "digit-classifier": digit_classifier}
"""Card id -> the digits world's own family package: the reward model and the independent classifier."""

DESCRIPTIONS = {
    "flux-t2i": "text-to-image: a DiT draws a 16×16 digit from its caption (guidance 2)",
    "flux-t2i-turbo": "text-to-image in 2 steps without guidance: flux-t2i's DiT distilled by DMD2",
    "wan-i2v": "image-to-video: animates a first frame with the prompt's motion (8 frames)",
    "wan-t2v": "text-to-video: one bidirectional DiT over all 8 frames",
    "ltx2-two-stage": "text-to-video in two stages: one DiT at half resolution, a latent upsampler, the same DiT refining",
    "wan22-moe": "text-to-video with two DiT experts, one for high noise and one for low, switched by σ",
    "wan-causal": "text-to-video chunk by chunk (4 × 2 frames) on a block-causal DiT; streams and continues videos",
    "unified": "a refiner LM completes the prompt, then flux-t2i's generator draws it",
    "multi-expert": "N refiner LMs, one per attribute, compose the prompt; flux-t2i's generator draws it",
    "bagel-mot": "one Mixture-of-Transformers thinks (completes the prompt), draws the image, and captions images",
    "cosmos3": "one shared-weights MoT reasons a motion for the prompt, then denoises the video",
    "digit-scorer": "the reward model (a judge): reads an image's digit, stroke, position and brightness",
    "digit-classifier": "the independent judge: a brightness- and position-blind CNN reading the digit alone",
}
"""Card id -> the one line ``jaxpipe cards`` prints for it."""

BUNDLED = tuple(sorted(set(FAMILIES) - {"multi-expert"} | set(OWN) | {"flux-t2i-turbo"}))
"""The ids whose pretrained weights ship in ``ASSETS`` (``multi-expert`` is built from ``unified``: ``multi_expert``;
``flux-t2i-turbo``, the DMD2 student of ``flux-t2i``, is loaded only)."""


def config(model_id: str, **changes):
    """The test-sized config of card ``model_id`` in the digits vocabulary, with field ``changes``.

    Args:
        model_id: a digits card id (a key of ``FAMILIES`` or ``OWN``).
        **changes: config fields to set.

    Returns:
        The family's ``Config``.

    Raises:
        KeyError: if ``model_id`` is not a digits card.
    """
    if model_id in OWN:
        return OWN[model_id].Config(**changes)
    module = _family(model_id)
    extra = {"slots": SLOTS} if module is toy_multi_expert else {}
    return module.Config(**{"vocabulary": VOCABULARY, **extra, **changes})


def _text() -> TextEncoderConfig:
    return dataclasses.replace(config("flux-t2i").text, dim=64)


def _generator(model_id: str, dit: dict | None = None, **changes):
    """The bundled generator sizes every digits video card shares with ``flux-t2i`` (text encoder dim 64,
    DiT dim 96 × 4 blocks × 4 heads), so the video cards can start from ``flux-t2i`` / ``wan-t2v`` weights."""
    return config(
        model_id, text=_text(), dit=DiTConfig(dim=96, depth=4, heads=4, text_dim=64, **(dit or {})), **changes
    )


def _unified_fields() -> dict:
    base = _generator("flux-t2i", sampling=denoise.DenoiseConfig(guidance=2.0))
    return {f.name: getattr(base, f.name) for f in dataclasses.fields(toy_t2i.Config)}


def _mot(model_id: str, routing: str | Routing | None = None, **changes):
    mot = dataclasses.replace(
        config(model_id).mot,
        dim=96,
        depth=4,
        heads=4,
        time_embed_dim=128,
        **({} if routing is None else {"routing": routing}),
    )
    return config(model_id, mot=mot, **changes)


_BUNDLED: dict[str, Callable[..., object]] = {
    # served with classifier-free guidance 2 (measured: 93% prompted-digit accuracy vs 69% at guidance 1)
    "flux-t2i": lambda: _generator("flux-t2i", sampling=denoise.DenoiseConfig(guidance=2.0)),
    # a tiny DiT moves the digit but loses its shape
    "wan-i2v": lambda: _generator("wan-i2v", dit={"frame_cond": True}),
    # starts from flux-t2i's weights, served with guidance 2 like flux-t2i
    "wan-t2v": lambda: _generator("wan-t2v", sampling=denoise.DenoiseConfig(guidance=2.0)),
    # base 8 steps with CFG 2 + STG 0.3 on block 1, refine 4 steps from σ₀ = 0.7 with CFG 2 (chosen on the
    # digit-scorer's accuracy, see benchmarks/two_stage.py)
    "ltx2-two-stage": lambda: _generator(
        "ltx2-two-stage",
        upsampler=LatentUpsamplerConfig(width=32, depth=2),
        base_sampling=denoise.DenoiseConfig(num_steps=8, guidance=2.0, stg=0.3, stg_blocks=(1,)),
        refine_sampling=denoise.DenoiseConfig(num_steps=4, guidance=2.0, start_sigma=0.7),
    ),
    # both experts start from wan-t2v's DiT; guidance 2; the hand-over at σ = 0.5
    "wan22-moe": lambda: _generator("wan22-moe", sampling=denoise.DenoiseConfig(guidance=2.0)),
    # wan-t2v's sizes, 4 chunks of 2 frames, every chunk kept in the cache, guidance 2
    "wan-causal": lambda: _generator(
        "wan-causal", sampling=ChunkConfig(num_steps=8, guidance=2.0, chunks=4, chunk_frames=2)
    ),
    # the bundled flux-t2i generator plus a small refiner LM
    "unified": lambda: config("unified", **_unified_fields()),
    "multi-expert": lambda num_refiners=3: config("multi-expert", **_unified_fields(), num_refiners=num_refiners),
    # flux-t2i's autoencoder and a MoT as wide and deep as its DiT, served with guidance 2 (trained with 10% empty text)
    "bagel-mot": lambda routing="modality": _mot("bagel-mot", routing, sampling=denoise.DenoiseConfig(guidance=2.0)),
    # wan-i2v's autoencoder and a shared MoT as wide and deep as its DiT
    "cosmos3": lambda: _mot("cosmos3"),
    "digit-scorer": lambda: digit_scorer.Config(),
    "digit-classifier": lambda: digit_classifier.Config(),
}


def bundled_config(model_id: str, *args, **changes):
    """The config of the pretrained card ``model_id`` (the sizes its recipe trains); ``args``: the
    preset's options (``multi-expert``: ``num_refiners``; ``bagel-mot``: ``routing``).

    Args:
        model_id: a card id with a bundled preset.
        *args: the preset's options.
        **changes: config fields to set.

    Returns:
        The family's ``Config`` at the bundled sizes.

    Raises:
        KeyError: if ``model_id`` has no bundled config.
    """
    preset = _BUNDLED.get(model_id)
    if preset is None:
        raise KeyError(f"no bundled config for {model_id!r}; known: {sorted(_BUNDLED)}")
    base = preset(*args)
    return dataclasses.replace(base, **changes) if changes else base


def _family(model_id: str):
    if model_id not in FAMILIES:
        raise KeyError(f"{model_id!r} is not a digits card; the digits cards are {sorted([*FAMILIES, *OWN])}")
    return FAMILIES[model_id]


def multi_expert(unified: Card, num_refiners: int = 3, **changes) -> Card:
    """The ``multi-expert`` card from a ``unified`` card: its LM in every refiner, refiner ``i`` owning
    attribute ``SLOTS[i % 3]`` (stroke, position, brightness), its generator shared.

    Args:
        unified: a ``unified`` card (with an ``llm``).
        num_refiners: the number of refiners.
        **changes: ``multi-expert`` config fields to set.

    Returns:
        The ``multi-expert`` card.

    Raises:
        ValueError: if ``unified`` has no ``llm``.
    """
    return toy_multi_expert.from_unified(unified, num_refiners, model_id="multi-expert", **{"slots": SLOTS, **changes})


def register() -> None:
    """Register the digits cards into the core's registries: the world's own families (``OWN``), every card
    id with its test-sized config, and the bundled ones' asset folders."""
    for package in OWN.values():
        if package.FAMILY.name not in registry.FAMILIES:
            registry.register(package.FAMILY)
    for model_id in (*FAMILIES, *OWN):
        family = (OWN[model_id] if model_id in OWN else _family(model_id)).FAMILY.name
        path = ASSETS / model_id if model_id in BUNDLED else None
        registry.register_card(
            model_id,
            family,
            config=_config_of(model_id),
            path=path,
            rebuild=_rebuild(model_id, path),
            description=DESCRIPTIONS.get(model_id, ""),
        )
    registry.register_card(
        "flux-t2i-turbo",
        toy_t2i.FAMILY.name,
        path=ASSETS / "flux-t2i-turbo",
        rebuild=_rebuild("flux-t2i-turbo", ASSETS / "flux-t2i-turbo"),
        description=DESCRIPTIONS["flux-t2i-turbo"],
    )
    registry.register_upgrade("multi_expert", _named_slots)


def _rebuild(model_id: str, path: Path | None) -> str | None:
    """The command that re-creates a bundled card's checkpoint folder: its pretraining recipe."""
    return None if path is None else f"python -m jaxpipe.digits.pretrain {model_id} --out {path}"


def _named_slots(saved: dict) -> dict:
    """A ``multi_expert`` checkpoint of jaxpipe 0.1 named each slot by its attribute; now a slot carries its words."""
    slots = saved.get("slots")
    if slots and all(isinstance(slot, str) for slot in slots):
        saved = {**saved, "slots": [[name, list(ATTRIBUTE_WORDS[name])] for name in slots]}
    return saved


def _config_of(model_id: str) -> Callable[[], object]:
    return lambda: config(model_id)
