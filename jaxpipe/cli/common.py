"""What the ``jaxpipe`` commands share: failing with a clear message, loading cards, checking outputs."""

from __future__ import annotations

import os
from pathlib import Path

import typer

__all__ = ["fail", "load", "parse_options", "writable", "check_kinds"]


def fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def load(*names: str, options: dict | None = None):
    """The cards ``names`` (bundled ids, card directories or diffusers folders); ``options`` go to the first
    one's loader (a diffusers folder's ``height``, ``width``, ``max_sequence_length``, ``dtype`` ...)."""
    from jaxpipe import cards

    try:
        return tuple(cards.load(name, **((options or {}) if i == 0 else {})) for i, name in enumerate(names))
    except (KeyError, FileNotFoundError, ValueError, TypeError) as err:
        fail(str(err).strip('"'))


def parse_options(items: list[str]) -> dict:
    """``["height=16", "dtype=bfloat16"]`` -> ``{"height": 16, "dtype": "bfloat16"}`` (ints and floats read as numbers)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--model-option takes KEY=VALUE (got {item!r})")
        value = value.strip()
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out


def writable(paths: list[Path], overwrite: bool) -> None:
    """Fail before any compute if an output exists (unless ``overwrite``) or its folder cannot be written."""
    for path in paths:
        if path.exists() and not overwrite:
            fail(f"{path} exists: pass --overwrite to replace it")
        if path.is_dir():
            fail(f"{path} is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            fail(f"cannot create {path.parent}: {err.strerror}")
        if not os.access(path.parent, os.W_OK):
            fail(f"cannot write to {path.parent}")


def check_kinds(loaded, roles) -> None:
    """Fail unless each card can do what its flag asks (``roles``: ``(flag, capability)``, in order)."""
    for card, (flag, capability) in zip(loaded, roles):
        if capability not in card.spec.capabilities:
            kinds = ", ".join(card.spec.capabilities) or "nothing this command runs"
            fail(f"{flag} {card.model_id!r} does {kinds}; this stage needs a card that does {capability}")
