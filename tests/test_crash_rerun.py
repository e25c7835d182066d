"""A crashed pytest-xdist worker's test runs once more (tests/crash_rerun.py); a failure, or a second crash, fails."""

import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

CASES = """
import os, pathlib

def test_crashes_once(tmp_path_factory):
    mark = pathlib.Path(os.environ["CRASH_MARK"])
    if not mark.exists():
        mark.write_text("crashed")
        os.abort()

def test_always_crashes():
    os.abort()

def test_fails():
    assert False, "a real failure"
"""


def test_a_crashed_test_runs_once_more_and_a_failure_or_a_second_crash_fails(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    cmd = [sys.executable, "-m", "pytest", "-n", "1", "-p", "crash_rerun", "-o", "addopts=", "-rA", "-q"]
    env = {"PYTHONPATH": str(TESTS), "CRASH_MARK": str(tmp_path / "mark"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*cmd, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "PASSED test_cases.py::test_crashes_once" in out, out
    assert "FAILED test_cases.py::test_always_crashes" in out and "FAILED test_cases.py::test_fails" in out, out
    assert "2 failed, 1 passed" in out and "2 rerun" in out, out
    assert "the worker running test_cases.py::test_crashes_once crashed; the test ran again" in out, out
