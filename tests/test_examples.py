"""The example scripts run as a user runs them (``python examples/X.py ...``), at their smallest settings.

``examples/quickstart.py`` runs in the default tier (``test_generate.py``); the two RL scripts train and
judge a card, so they run here in the slow tier: each finishes, writes its report and a card that loads.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import jaxpipe as jp

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True, timeout=2400
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@pytest.mark.slow  # a compiled FlowGRPO step and two judged evaluations in a fresh process (~1 min)
def test_flow_grpo_example_trains_judges_and_writes_a_card(tmp_path):
    out = tmp_path / "grpo"
    _run("flow_grpo_digits.py", "--steps", "2", "--num-steps", "2", "--eval-samples", "4", "--out", str(out))
    assert "summary" in json.loads((out / "report.json").read_text())
    assert jp.cards.load(out).spec.family == "toy_t2i"


@pytest.mark.slow  # a compiled UnifiedRL step and two judged evaluations in a fresh process (~1 min)
def test_unified_rl_example_trains_judges_and_writes_a_card(tmp_path):
    out = tmp_path / "unified"
    _run("unified_rl_digits.py", "--steps", "2", "--prompt-only", "--eval-samples", "4", "--out", str(out))
    assert "summary" in json.loads((out / "report.json").read_text())
    assert jp.cards.load(out).spec.family == "toy_unified"
