"""The training API's names: each class beside its config, one home each, the renamed names answering with a warning."""

import importlib

import pytest

import jaxpipe.training as training

RENAMED = [
    ("jaxpipe.training", "JointRLConfig", "JointMultiExpertRLConfig"),
    ("jaxpipe.training", "MoTRLConfig", "SharedMoTRLConfig"),
    ("jaxpipe.training", "Supervised", "LossTrainer"),
    ("jaxpipe.training.methods.joint_rl", "JointRLConfig", "JointMultiExpertRLConfig"),
    ("jaxpipe.training.methods.mot_rl", "MoTRLConfig", "SharedMoTRLConfig"),
    ("jaxpipe.training.supervised", "Supervised", "LossTrainer"),
    ("jaxpipe.training.grpo", "FlowGRPOConfig", "FlowGRPOConfig"),
    ("jaxpipe.training.eval_ema", "EvalEMA", "EvalEMA"),
]


@pytest.mark.parametrize(("module", "old", "new"), RENAMED)
def test_a_renamed_name_still_answers_with_a_deprecation_warning(module, old, new):
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use .*{new}"):
        got = getattr(importlib.import_module(module), old)
    assert got is getattr(training, new)


def test_unknown_names_are_still_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchTrainer'"):
        training.NoSuchTrainer  # noqa: B018


def test_each_method_sits_beside_its_config():
    """``X`` and ``XConfig`` come from one module: the method's own."""
    for name in training.__all__:
        if name.endswith("Config") and name[: -len("Config")] in training.__all__:
            method = name[: -len("Config")]
            assert training._LAZY[name] == training._LAZY[method], name
    assert training._LAZY["FlowGRPOConfig"] == "jaxpipe.training.methods.flow_grpo"
    assert training._LAZY["EMA"] == training._LAZY["EvalEMA"] == "jaxpipe.training.ema"
