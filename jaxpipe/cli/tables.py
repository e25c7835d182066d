"""A report (nested dicts of numbers) as terminal tables: what ``jaxpipe evaluate`` prints (``--json`` for machines).

Each top-level section becomes one table of its numbers by dotted name. A section whose values are all
dicts of one shape (the splits of a GenEval table) gets a column per value; a section with an ``independent``
twin (the digits world's judges beside the reward model) gets that as a second column.
"""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table

__all__ = ["numbers", "tables"]


def numbers(tree: Mapping, prefix: str = "") -> dict[str, float | int]:
    """The numbers of ``tree`` by dotted name, in order (bools, strings and lists left out).

    Args:
      tree: nested dicts.
      prefix: the names' prefix.

    Returns:
      ``{"a.b": number}``.
    """
    out: dict[str, float | int] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(numbers(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def tables(report: Mapping) -> list[Table]:
    """One table per section of ``report``.

    Args:
      report: ``{section: nested dicts of numbers}``.

    Returns:
      The ``rich`` tables, in the report's order.
    """
    out = []
    for section, body in report.items():
        if not isinstance(body, Mapping):
            continue
        parts = list(body.values())
        if len(parts) >= 2 and all(isinstance(p, Mapping) for p in parts):
            columns = {name: numbers(part) for name, part in body.items()}
        else:
            columns = {"value": numbers({k: v for k, v in body.items() if k != "independent"})}
            if isinstance(body.get("independent"), Mapping):
                columns["independent judges"] = numbers(body["independent"])
        table = Table(title=section, title_justify="left")
        table.add_column("measure")
        for name in columns:
            table.add_column(name, justify="right")
        names = list(dict.fromkeys(n for values in columns.values() for n in values))
        for name in names:
            table.add_row(name, *(_cell(values.get(name)) for values in columns.values()))
        out.append(table)
    return out
