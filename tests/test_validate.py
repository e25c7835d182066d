"""The shared config checks: each refuses a bad field in one line naming the field, its value and the rule."""

from __future__ import annotations

import dataclasses
import math

import pytest

from jaxpipe import validate


@dataclasses.dataclass(frozen=True)
class _Config:
    steps: object = 4
    rate: object = 0.1
    share: object = 0.5
    kind: object = "ode"
    name: object = "x"
    extra: object = None


@pytest.mark.parametrize(
    ("check", "field", "value", "message"),
    [
        (lambda c: validate.counts(c, "steps"), "steps", 0, "steps must be a positive int (got 0)"),
        (lambda c: validate.counts(c, "steps"), "steps", True, "steps must be a positive int (got True)"),
        (lambda c: validate.counts(c, "steps", minimum=0), "steps", -1, "steps must be an int >= 0 (got -1)"),
        (lambda c: validate.counts(c, "steps", maximum=8), "steps", 9, "steps must be an int in [1, 8] (got 9)"),
        (lambda c: validate.positive(c, "rate"), "rate", 0.0, "rate must be a finite number > 0 (got 0.0)"),
        (lambda c: validate.positive(c, "rate"), "rate", math.inf, "rate must be a finite number > 0 (got inf)"),
        (lambda c: validate.non_negative(c, "rate"), "rate", -1, "rate must be a finite number >= 0 (got -1)"),
        (lambda c: validate.finite(c, "rate"), "rate", math.nan, "rate must be a finite number (got nan)"),
        (lambda c: validate.finite(c, "rate"), "rate", "1", "rate must be a finite number (got '1')"),
        (lambda c: validate.fractions(c, "share"), "share", 1.5, "share must be in [0.0, 1.0] (got 1.5)"),
        (
            lambda c: validate.within(c, "share", low=0, high=1, open_high=True),
            "share",
            1,
            "share must be in [0, 1) (got 1)",
        ),
        (
            lambda c: validate.one_of(c, "kind", ("ode", "sde")),
            "kind",
            "euler",
            "kind must be one of 'ode', 'sde' (got 'euler')",
        ),
        (
            lambda c: validate.counts(c, "steps", prefix="Request."),
            "steps",
            0,
            "Request.steps must be a positive int (got 0)",
        ),
    ],
)
def test_each_check_refuses_in_one_line(check, field, value, message):
    with pytest.raises(ValueError) as err:
        check(_Config(**{field: value}))
    assert str(err.value) == message


def test_good_fields_pass_and_optional_allows_none():
    config = _Config()
    validate.counts(config, "steps")
    validate.positive(config, "rate")
    validate.fractions(config, "share", "rate")
    validate.one_of(config, "kind", ("ode", "sde"))
    validate.instances(config, str, "name")
    for check in (validate.counts, validate.positive, validate.non_negative, validate.finite, validate.fractions):
        check(config, "extra", optional=True)
    with pytest.raises(ValueError, match="extra must be a positive int"):
        validate.counts(config, "extra")


def test_instances_raises_type_error_and_rule_raises_its_message():
    with pytest.raises(TypeError, match=r"^name must be an int or float \(got str\)$"):
        validate.instances(_Config(), (int, float), "name")
    validate.rule(True, "never")
    with pytest.raises(ValueError, match="^low must be < high$"):
        validate.rule(False, "low must be < high")
    with pytest.raises(TypeError, match="^wrong kind$"):
        validate.rule(False, "wrong kind", TypeError)
