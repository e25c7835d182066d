"""Shared plumbing of the benchmark scripts: the machine's description and RESULTS.md sections."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform

import jax

RESULTS = pathlib.Path(__file__).resolve().parent / "RESULTS.md"
HEADER = (
    "# Benchmark results\n\nEach `## name` section is written by `benchmarks/<name>.py` between its markers; "
    "a script replaces only its own section.\n"
)


def num_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_info(**extra) -> dict:
    """Platform, CPU model, cores, Python and JAX versions, backend and the UTC date (plus ``extra``)."""
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": num_cores(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jax backend": jax.default_backend(),
        **extra,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def write_section(path: pathlib.Path, section: str, body: str) -> None:
    """Replace (or append) ``section``'s marked block of ``path``, leaving the rest alone.

    Hand-written analysis between ``<!-- BEGIN {section} notes -->`` and ``<!-- END {section} notes -->``
    inside the old block is kept, after the refreshed numbers.
    """
    begin, end = f"<!-- BEGIN {section} -->", f"<!-- END {section} -->"
    notes_begin, notes_end = f"<!-- BEGIN {section} notes -->", f"<!-- END {section} notes -->"
    text = path.read_text() if path.exists() else HEADER
    old = text.split(begin, 1)[1].split(end, 1)[0] if begin in text and end in text else ""
    if notes_begin in old and notes_end in old:
        body = body.rstrip() + "\n\n" + notes_begin + old.split(notes_begin, 1)[1].split(notes_end, 1)[0] + notes_end
    block = f"{begin}\n{body.rstrip()}\n{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        after = rest.split(end, 1)[1].lstrip("\n")
        text = head + block + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
