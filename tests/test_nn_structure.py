"""The network layers check their configs one way: the rules several configs share (a CLIP tower's sizes,
a layer layout, divisibility) are written once on ``jaxpipe.validate`` and name the field that fails. (The
repository-wide rules — no module over 500 lines, no ``__post_init__`` raising by hand — are in
``test_layers.py``.)"""

from __future__ import annotations

import pytest

from jaxpipe.nn import stacked
from jaxpipe.nn.clip import CLIPTextEncoderConfig
from jaxpipe.nn.clip_vision import CLIPVisionConfig
from jaxpipe.nn.layers import check_divisible


@pytest.mark.parametrize("tower", [CLIPTextEncoderConfig.tiny, CLIPVisionConfig.tiny])
def test_both_clip_towers_share_one_set_of_checks(tower):
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must be divisible by num_attention_heads \(4\)"):
        tower(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="hidden_act must be one of"):
        tower(hidden_act="swishy")
    with pytest.raises(ValueError, match="layer_norm_eps must be a finite number > 0"):
        tower(layer_norm_eps=0.0)
    with pytest.raises(ValueError, match=f"{tower().__class__.__name__}.scan_layers must be a bool"):
        tower(scan_layers="yes")


def test_the_layout_and_divisibility_checks_name_the_fields():
    class Config:
        scan_layers, remat, dim, heads = True, "none", 10, 4

    stacked.check_layout(Config())
    with pytest.raises(ValueError, match=r"dim \(10\) must be divisible by heads \(4\)"):
        check_divisible(Config(), "dim", "heads")
    Config.remat = "sometimes"
    with pytest.raises(ValueError, match="remat must be one of"):
        stacked.check_layout(Config())
