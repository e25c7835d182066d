"""What the ``jaxpipe`` commands share: failing with a clear message, loading cards, checking outputs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer

__all__ = ["fail", "load", "parse_options", "writable", "writable_folder", "check_kinds"]


def fail(message: str) -> None:
    """Print ``error: <message>`` on one red line to stderr and end the command with exit code 2.

    Args:
      message: what went wrong and, where it helps, what to do about it.

    Raises:
      typer.Exit: always, with ``code=2``.
    """
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def load(*names: str, options: dict | None = None):
    """The cards ``names``, or one error line and exit: a card that cannot be used (unknown, unreadable, or
    damaged: ``CardIntegrityError``, whose message names the file and what to do) fails with that line.

    Args:
      names: bundled ids, card directories or diffusers folders.
      options: keyword arguments for the first one's loader (a diffusers folder's ``height``, ``width``,
        ``max_sequence_length``, ``dtype`` ...).

    Returns:
      The loaded cards, in the order of ``names``.
    """
    from jaxpipe import cards

    try:
        return tuple(cards.load(name, **((options or {}) if i == 0 else {})) for i, name in enumerate(names))
    except cards.CardIntegrityError as err:
        fail(str(err))
    except (KeyError, OSError, ValueError, TypeError) as err:  # OSError: a weights file that cannot be read
        fail(str(err).strip('"'))


def parse_options(items: list[str]) -> dict:
    """Read ``--model-option KEY=VALUE`` items into a dict; values that parse as ints or floats become numbers.

    ``["height=16", "dtype=bfloat16"]`` -> ``{"height": 16, "dtype": "bfloat16"}``.

    Args:
      items: ``KEY=VALUE`` strings; keys and values are stripped of surrounding spaces.

    Returns:
      The options by key (a repeated key keeps its last value).

    Raises:
      typer.Exit: via ``fail``, for an item with no ``=`` or an empty key.
    """
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
    """Fail before any compute if an output exists (unless ``overwrite``) or its folder cannot be written.

    Missing parent folders are created.

    Args:
      paths: the output files the command will write.
      overwrite: whether an existing output file may be replaced.

    Raises:
      typer.Exit: via ``fail``, if a path exists and ``overwrite`` is false, is a directory, or its parent
        folder cannot be created or written.
    """
    for path in paths:
        if path.exists() and not overwrite:
            fail(f"{path} exists: pass --overwrite to replace it")
        if path.is_dir():
            fail(f"{path} is a directory")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            fail(f"cannot create {path.parent}: {err.strerror}")
        try:  # a real file: os.access answers yes for root even where nothing can be created (/proc)
            with tempfile.TemporaryFile(dir=path.parent):
                pass
        except OSError as err:
            fail(f"cannot write to {path.parent}: {err.strerror or err}")


def writable_folder(folder: Path, flag: str) -> bool:
    """Create ``folder`` if missing and fail (one line naming ``flag``) unless a file can be written in it.

    A real file is created and removed: ``os.access`` answers from the mode bits and can be wrong on
    network file systems and under ACLs.

    Args:
      folder: the output folder.
      flag: the command-line flag that named it (e.g. ``--out``), for the error line.

    Returns:
      Whether the folder was created here (``discard_if_empty`` removes it again when the command fails).

    Raises:
      typer.Exit: via ``fail``, if ``folder`` cannot be created or a file cannot be written in it.
    """
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(f"cannot create {flag} {folder}: {err.strerror or err}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        fail(f"cannot write to {flag} {folder}: {err.strerror or err}")
    return created


def discard_if_empty(folder: Path, created: bool) -> None:
    """Remove ``folder`` if this command ``created`` it and nothing was written in it (a failed start leaves no trace).

    Args:
      folder: the output folder.
      created: what ``writable_folder`` returned.
    """
    if created and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def check_kinds(loaded, roles) -> None:
    """Fail unless each card can do what its flag asks.

    Args:
      loaded: the loaded cards, e.g. what ``load`` returned.
      roles: one ``(flag, capability)`` pair per card, in the same order: the flag that named the card and
        the capability (one of ``card.spec.capabilities``) this stage needs from it.

    Raises:
      typer.Exit: via ``fail``, naming the first card whose spec lacks its capability.
    """
    for card, (flag, capability) in zip(loaded, roles):
        if capability not in card.spec.capabilities:
            kinds = ", ".join(card.spec.capabilities) or "nothing this command runs"
            fail(f"{flag} {card.model_id!r} does {kinds}; this stage needs a card that does {capability}")
