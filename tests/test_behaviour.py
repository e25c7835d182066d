"""Every trainer and bundled card still computes what it did before the trainers were rebuilt.

The first 8 steps of every RL / distillation method (3 of every pretraining script) from fixed seeds,
and digests of the bundled cards' outputs, against the values recorded on the code before the change
(``tests/data/behaviour.json``, written by ``python tests/behaviour_cases.py --record``): bit for bit in
an environment that has a recording, within float noise of the first recording elsewhere (another
processor or jaxlib rounds differently; ``behaviour_cases.environment`` says what counts).
"""

import warnings

import behaviour_cases
import pytest

RECORDED = behaviour_cases.recorded()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(behaviour_cases.CASES))
def test_the_recorded_numbers_are_reproduced(name):
    assert RECORDED, "no behaviour data: run python tests/behaviour_cases.py --record"
    key, cases, exactly = behaviour_cases.reference(RECORDED)
    assert name in cases, f"no recorded values for {name!r}: run python tests/behaviour_cases.py --record {name}"
    got = behaviour_cases.exact(behaviour_cases.CASES[name]())
    want = cases[name]
    if exactly:
        if isinstance(want, list):  # per-step metric rows: every recorded metric, step by step
            assert len(got) == len(want)
            for step, (g, w) in enumerate(zip(got, want)):
                assert behaviour_cases.recorded_part(g, w) == w, f"{name} step {step}"
        else:
            assert behaviour_cases.recorded_part(got, want) == want, name
        return
    warnings.warn(
        f"{name}: this environment ({behaviour_cases.environment_key()}) has no recording, so the "
        f"numbers are held to {key}'s within float noise, not bit for bit",
        stacklevel=1,
    )
    off = behaviour_cases.differences(name, got, want)
    assert not off, f"{name} moved beyond float noise from environment {key}:\n" + "\n".join(off[:20])


def test_another_environment_is_held_within_float_noise_and_no_further():
    rows = [{"loss": 0.25, "kl": 7.4e-9, "step": 1.0}, {"loss": 0.5, "kl": 3e-6, "step": 2.0}]
    want = behaviour_cases.exact(rows)
    noisy = behaviour_cases.exact(
        [{"loss": 0.25 + 4e-6, "kl": 0.0, "step": 1.0}, {"loss": 0.5, "kl": 3.3e-6, "step": 2.0}]
    )
    assert behaviour_cases.differences("flow_grpo", noisy, want) == []
    moved = behaviour_cases.exact([{"loss": 0.25 * 1.01, "kl": 7.4e-9, "step": 1.0}, rows[1]])
    assert [d.split(":")[0] for d in behaviour_cases.differences("flow_grpo", moved, want)] == ["/loss"]
    assert behaviour_cases.differences("flow_grpo", behaviour_cases.exact(rows[:1]), want)  # a step went missing
    assert behaviour_cases.differences("flow_grpo_bf16", moved, want) == []  # bfloat16 rounds coarser
    render = {"sha256": "ab", "stats": {"image": [0.5, 0.2, 0.0, 1.0], "tokens": [3.0, 1.0, 2.0, 4.0]}}
    other_bits = {"sha256": "cd", "stats": {"image": [0.5 + 1e-6, 0.2, 0.0, 1.0], "tokens": [3.0, 1.0, 2.0, 4.0]}}
    assert behaviour_cases.differences("bundled_outputs", {"r": other_bits}, {"r": render}) == []
    other_tokens = {"sha256": "cd", "stats": {"image": [0.5, 0.2, 0.0, 1.0], "tokens": [3.25, 1.0, 2.0, 4.0]}}
    assert behaviour_cases.differences("bundled_outputs", {"r": other_tokens}, {"r": render})


def test_the_recording_environment_is_held_bit_for_bit():
    key = behaviour_cases.environment_key()
    data = {key: {"recorded": "2026-12-02", "cases": {"a": 1}}, "other": {"recorded": "2026-01-01", "cases": {"a": 2}}}
    assert behaviour_cases.reference(data) == (key, {"a": 1}, True)
    del data[key]
    assert behaviour_cases.reference(data) == ("other", {"a": 2}, False)
