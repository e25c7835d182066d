"""Each test file's time in the default and slow tiers, from pytest's JUnit XML: the table in docs/testing.md.

    python tests/scripts/file_times.py out/default.xml out/slow.xml

Times are summed over a file's tests (setup, call and teardown) across both pytest-xdist workers, so a tier's
wall time is about half its column's total on two cores.
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def file_times(path: str) -> collections.Counter:
    """Test file -> seconds summed over its tests in the JUnit XML file ``path``."""
    times: collections.Counter = collections.Counter()
    for case in ET.parse(path).iter("testcase"):
        times[case.get("classname", "?").split(".")[-1] + ".py"] += float(case.get("time", 0.0))
    return times


def table(default: collections.Counter, slow: collections.Counter) -> str:
    """A markdown table of both tiers' times per file, slowest (both tiers together) first."""
    files = sorted(set(default) | set(slow), key=lambda f: -(default[f] + slow[f]))
    rows = ["| file | default tier (s) | slow tier (s) |", "|---|---:|---:|"]
    rows += [f"| `{f}` | {default[f]:.1f} | {slow[f]:.1f} |" for f in files]
    rows.append(f"| **all** | **{sum(default.values()):.0f}** | **{sum(slow.values()):.0f}** |")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(table(file_times(sys.argv[1]), file_times(sys.argv[2])))
