"""LoRA adapters (Hu et al. 2021) on a network's linear layers, interchangeable with peft's and diffusers'.

``apply(module, LoRAConfig(rank=16))`` returns a copy of ``module`` whose targeted linear layers (any
module with a ``kernel`` parameter ``(din, dout)`` and an optional ``bias``; inside a
``stacked.Stacked`` block ``(n, din, dout)``) are each wrapped in a ``LoRA`` module computing

    y = base(x) + (alpha / rank) · (x @ A) @ B

with ``A`` ``(din, rank)`` drawn like peft's default (``kaiming_uniform(a=√5)``: uniform on
``±1/√din``) and ``B`` ``(rank, dout)`` zeros, so a fresh adapter changes nothing, bit for bit. In a
stacked block ``A`` is ``(n, din, rank)`` and ``B`` ``(n, rank, dout)``: the scan hands each layer its
slice, exactly as it does the base kernel. The adapter arrays are ``LoRAParam`` s, an ``nnx.Param``
subtype, so a filter tells them from the base weights: ``training.parts.Parts`` trains only them.

Names are PyTorch module names (``hf.torch_key`` without the leaf: ``transformer_blocks.3.attn.to_q``;
a stacked block stands for each of its layers). ``LoRAConfig.target_modules`` selects them like
peft's ``target_modules``: a tuple of names, each matching a module whose name is it or ends with
``"." + it``, or one regex string matched (``re.fullmatch``) against the whole name; ``None`` takes the
network's own ``LORA_TARGETS`` (FLUX: diffusers' and peft's usual attention and feed-forward projections).
A stacked block is adapted in all its layers or none.

The wrapper mirrors peft's ``LoraLayer``: ``base_layer`` (the wrapped layer), ``lora_A`` and ``lora_B``
(each with a ``kernel``), so the adapters' ``hf.torch_key`` s are exactly the keys diffusers and peft
store (``<name>.lora_A.weight`` ``(rank, din)``, ``<name>.lora_B.weight`` ``(dout, rank)``).

Merging follows peft: ``merge`` is ``merge_and_unload`` (each base kernel becomes
``kernel + (alpha / rank)·A @ B`` and the wrappers go: the plain network, same parameter paths as
before ``apply``); ``unload`` is peft's ``unload`` (the wrappers go, the base weights as they were).
There is no in-place ``merge_adapter`` / ``unmerge_adapter`` pair: modules are values here, so the
unmerged module is still there after ``merge`` (``unmerge`` would only subtract what ``merge`` added,
with rounding error, from a module that no longer knows its adapters).

Files (``save_adapters`` / ``load_adapters``, in ``files``): diffusers' ``FluxPipeline.save_lora_weights`` layout,
``pytorch_lora_weights.safetensors`` with ``transformer.<name>.lora_A.weight`` keys and the adapter's
``LoraConfig`` fields (``r``, ``lora_alpha``, ``target_modules``, per-module ``rank_pattern`` /
``alpha_pattern``) as JSON in the file's ``lora_adapter_metadata`` entry, which ``load_lora_weights``
reads; or peft's ``save_pretrained`` layout, ``adapter_model.safetensors`` with
``base_model.model.<name>.lora_A.weight`` keys next to ``adapter_config.json``. Loading also takes
diffusers files with per-module ``<name>.alpha`` tensors or no alpha at all (``alpha = rank``, diffusers'
convention), and peft's ``use_rslora`` (scale ``alpha/√rank``, kept as the equivalent ``alpha·√rank``).
"""

from jaxpipe.nn.lora.files import (
    DIFFUSERS_FILE,
    FORMATS,
    PEFT_CONFIG,
    PEFT_FILE,
    load_adapters,
    save_adapters,
)
from jaxpipe.nn.lora.layer import BASE_LAYER, LoRA, LoRAConfig, LoRAParam
from jaxpipe.nn.lora.tree import adapter_names, apply, has_adapters, merge, param_count, unload

__all__ = [
    "BASE_LAYER",
    "DIFFUSERS_FILE",
    "FORMATS",
    "PEFT_CONFIG",
    "PEFT_FILE",
    "LoRA",
    "LoRAConfig",
    "LoRAParam",
    "adapter_names",
    "apply",
    "has_adapters",
    "load_adapters",
    "merge",
    "param_count",
    "save_adapters",
    "unload",
]
