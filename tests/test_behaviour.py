"""Every trainer and bundled card still computes what it did before the trainers were rebuilt: bit for bit.

The first 8 steps of every RL / distillation method (3 of every pretraining script) from fixed seeds,
and digests of the bundled cards' outputs, against the values recorded on the code before the
change (``tests/data/behaviour.json``, written by ``python tests/behaviour_cases.py --record``).
"""

import pytest

import behaviour_cases

RECORDED = behaviour_cases.recorded()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(behaviour_cases.CASES))
def test_the_recorded_numbers_are_reproduced_bit_for_bit(name):
    assert name in RECORDED, f"no recorded values for {name!r}: run python tests/behaviour_cases.py --record {name}"
    got = behaviour_cases.exact(behaviour_cases.CASES[name]())
    want = RECORDED[name]
    if isinstance(want, list):  # per-step metric rows: every recorded metric, step by step
        assert len(got) == len(want)
        for step, (g, w) in enumerate(zip(got, want)):
            assert behaviour_cases.recorded_part(g, w) == w, f"{name} step {step}"
    else:
        assert behaviour_cases.recorded_part(got, want) == want, name
