"""A pytest plugin: a test whose pytest-xdist worker died (killed by a signal, not failed) runs once more.

jaxlib 0.10.2 aborts now and then while it serialises or deserialises a compiled executable for the persistent
compilation cache (measured: about once per slow-tier run, a different test each time, each passing when run
again). That is not a fault of the change under test. A failed assertion or an exception always is, and neither
is ever retried; a test that crashes twice fails. Loaded by ``conftest`` (``pytest_plugins``).
"""

from __future__ import annotations

_CRASHED: set[str] = set()


def pytest_handlecrashitem(crashitem, report, sched):
    """pytest-xdist's hook for a test whose worker died: reschedule it, the first time, on a fresh worker."""
    if crashitem not in _CRASHED:
        _CRASHED.add(crashitem)
        sched.mark_test_pending(crashitem)
        report.outcome = "rerun"


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":
        return "rerun", "R", ("CRASHED, RUNS AGAIN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter):
    for report in terminalreporter.stats.get("rerun", []):
        terminalreporter.write_line(f"the worker running {report.nodeid} crashed; the test ran again", yellow=True)
