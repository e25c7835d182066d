"""LoRA adapter files: diffusers' ``save_lora_weights`` layout and peft's ``save_pretrained`` layout, written
(``save_adapters``) and read (``load_adapters``) under the PyTorch key names both libraries use."""

from __future__ import annotations

import collections
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxpipe.nn import hf
from jaxpipe.nn.lora.layer import LoRA, LoRAParam
from jaxpipe.nn.lora.tree import (
    _check_linear,
    _layers,
    _linears,
    _name,
    _named_wrappers,
    _replace,
    has_adapters,
    unload,
)

__all__ = ["DIFFUSERS_FILE", "FORMATS", "PEFT_CONFIG", "PEFT_FILE", "load_adapters", "save_adapters"]

FORMATS = ("diffusers", "peft")
"""The adapter file layouts ``save_adapters`` writes and ``load_adapters`` reads."""
DIFFUSERS_FILE = "pytorch_lora_weights.safetensors"
"""The file diffusers' ``save_lora_weights`` writes and ``load_lora_weights`` looks for in a folder."""
PEFT_FILE = "adapter_model.safetensors"
"""The weights file of peft's ``save_pretrained`` folder."""
PEFT_CONFIG = "adapter_config.json"
"""The config file of peft's ``save_pretrained`` folder."""
PEFT_PREFIX = "base_model.model."
METADATA_KEY = "lora_adapter_metadata"  # diffusers' LORA_ADAPTER_METADATA_KEY


def _pattern(value_of: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The most common value and, for names with another, a peft ``*_pattern`` (escaped full names)."""
    common = collections.Counter(value_of.values()).most_common(1)[0][0]
    return common, {re.escape(n): v for n, v in sorted(value_of.items()) if v != common}


def _lora_config(module: Any, renames: tuple) -> dict[str, Any]:
    """The adapters' peft ``LoraConfig`` fields: ``r``, ``lora_alpha``, ``target_modules`` and the patterns."""
    named = dict(_named_wrappers(module, renames))
    r, rank_pattern = _pattern({n: w.rank for n, w in named.items()})
    alpha, alpha_pattern = _pattern({n: w.alpha for n, w in named.items()})
    return {
        "r": int(r),
        "lora_alpha": float(alpha),
        "target_modules": sorted(named),
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
    }


def save_adapters(
    module: Any,
    folder: str | Path,
    *,
    format: str = "diffusers",
    prefix: str | None = "transformer",
    renames: hf.Renames = (),
) -> Path:
    """Write ``module``'s adapters (float32, per-layer keys) to ``folder`` in diffusers' or peft's layout.

    ``"diffusers"``: ``folder/pytorch_lora_weights.safetensors`` with ``<prefix>.<name>.lora_A.weight`` /
    ``lora_B.weight`` keys and the ``LoraConfig`` fields (prefixed) as JSON in its ``lora_adapter_metadata``:
    what ``FluxPipeline.save_lora_weights`` writes and ``load_lora_weights`` / ``load_lora_adapter`` read.
    ``"peft"``: ``folder/adapter_model.safetensors`` (``base_model.model.<name>...`` keys) and
    ``folder/adapter_config.json``: what ``PeftModel.save_pretrained`` writes and ``from_pretrained`` reads.

    Args:
      module: a network with adapters.
      folder: the output folder (created if missing).
      format: ``"diffusers"`` or ``"peft"``.
      prefix: diffusers' component prefix (``"transformer"``; ``None``: bare names).
      renames: the network's ``hf`` renames, as it loads with.

    Returns:
      The weights file written.

    Raises:
      ValueError: on an unknown ``format``, or a module without adapters.
    """
    if format not in FORMATS:
        raise ValueError(f"save_adapters: format must be one of {FORMATS} (got {format!r})")
    if not has_adapters(module):
        raise ValueError(f"save_adapters: {type(module).__name__} has no LoRA adapters (lora.apply adds them)")
    renames = tuple(renames)
    tensors = {
        k: np.ascontiguousarray(v, np.float32)
        for k, v in hf.torch_state(module, renames=renames, only=LoRAParam).items()
    }
    config = _lora_config(module, renames)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if format == "peft":
        path = folder / PEFT_FILE
        save_file({PEFT_PREFIX + k: v for k, v in tensors.items()}, str(path), metadata={"format": "pt"})
        full = {
            "peft_type": "LORA",
            "task_type": None,
            "base_model_name_or_path": None,
            "inference_mode": True,
            "bias": "none",
            "lora_dropout": 0.0,
            "fan_in_fan_out": False,
            "init_lora_weights": True,
            "use_rslora": False,
            "use_dora": False,
            "modules_to_save": None,
            **config,
        }
        (folder / PEFT_CONFIG).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
        return path
    lead = f"{prefix}." if prefix else ""
    metadata = {
        "format": "pt",
        METADATA_KEY: json.dumps({lead + k: v for k, v in config.items()}, indent=2, sort_keys=True),
    }
    path = folder / DIFFUSERS_FILE
    save_file({lead + k: v for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str], dict | None, Path]:
    """An adapter file's tensors, its safetensors metadata and (peft) its ``adapter_config.json``."""
    if path.is_dir():
        for name in (PEFT_FILE, DIFFUSERS_FILE):
            if (path / name).is_file():
                path = path / name
                break
        else:
            files = sorted(path.glob("*.safetensors"))
            if len(files) != 1:
                raise FileNotFoundError(
                    f"{path}: no {PEFT_FILE} or {DIFFUSERS_FILE}, and {len(files)} other *.safetensors files "
                    "(pass the adapter file itself)"
                )
            path = files[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such adapter file or folder")
    with safe_open(str(path), framework="flax") as f:  # not "np": adapters are often stored in bfloat16
        metadata = f.metadata() or {}
        tensors = {k: np.asarray(f.get_tensor(k)) for k in f.keys()}
    config_file = path.parent / PEFT_CONFIG
    peft_config = json.loads(config_file.read_text()) if config_file.is_file() else None
    return tensors, metadata, peft_config, path


def _unsupported(config: Mapping[str, Any], where: Path) -> None:
    bad = {"use_dora": False, "lora_bias": False, "fan_in_fan_out": False}
    for field, fine in bad.items():
        if config.get(field, fine) != fine:
            raise ValueError(f"{where}: {field}={config[field]!r} adapters are not supported (plain LoRA only)")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{where}: bias={config['bias']!r} adapters train biases too, which jaxpipe's LoRA does not")
    if config.get("modules_to_save"):
        raise ValueError(f"{where}: modules_to_save {config['modules_to_save']} holds full weights, not adapters")


def _pattern_value(patterns: Mapping[str, float], name: str) -> float | None:
    for key, value in (patterns or {}).items():  # peft's get_pattern_key: the pattern ends the name
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return None


def _alpha(name: str, rank: int, config: Mapping[str, Any] | None, alphas: Mapping[str, float]) -> float:
    """``name``'s alpha as a plain LoRA's (scale ``alpha / rank``): an ``.alpha`` tensor, the config, or ``rank``."""
    if name in alphas:
        return float(alphas[name])
    if config is None or config.get("lora_alpha") is None:
        return float(rank)  # diffusers: no alpha stored means scale 1
    alpha = _pattern_value(config.get("alpha_pattern"), name)
    alpha = float(config["lora_alpha"] if alpha is None else alpha)
    return alpha * math.sqrt(rank) if config.get("use_rslora") else alpha  # rsLoRA's alpha/√r as alpha'/r


def load_adapters(
    module: Any,
    path: str | Path,
    *,
    prefix: str | None = "transformer",
    renames: hf.Renames = (),
) -> Any:
    """A copy of ``module`` with the adapters of a diffusers or peft LoRA file (replacing any it has).

    ``path`` is a folder (peft's ``save_pretrained``: ``adapter_model.safetensors`` + ``adapter_config.json``;
    diffusers': ``pytorch_lora_weights.safetensors``; or one ``*.safetensors``) or the file itself. Keys
    may carry peft's ``base_model.model.`` or diffusers' ``<prefix>.`` (other components' keys, e.g.
    ``text_encoder.``, are left out). Ranks come from the tensors; alphas from ``.alpha`` tensors, the
    diffusers metadata or peft config (``lora_alpha``, ``alpha_pattern``, ``use_rslora``), else the rank.

    Args:
      module: the base network.
      path: the adapter folder or file.
      prefix: diffusers' component prefix of this network's keys (``None``: bare names).
      renames: the network's ``hf`` renames.

    Returns:
      The copy with the file's adapters, values as stored (cast to the base kernels' dtype).

    Raises:
      FileNotFoundError: if there is no adapter file.
      ValueError: on unsupported adapter kinds (DoRA, trained biases, modules_to_save), no adapter keys, or
        a stacked block whose layers differ in rank or alpha or are not all in the file.
      hf.KeyMappingError: on keys that name no linear layer, or mis-shaped tensors.
    """
    renames = tuple(renames)
    tensors, metadata, peft_config, file = _read(Path(path))
    config = peft_config if any(k.startswith(PEFT_PREFIX) for k in tensors) else None
    if config is None and METADATA_KEY in metadata:
        meta = json.loads(metadata[METADATA_KEY])
        lead = f"{prefix}." if prefix else ""
        config = {k.removeprefix(lead): v for k, v in meta.items() if k.startswith(lead)}
    if config is not None:
        _unsupported(config, file)
    tensors = _strip(tensors, prefix, file)
    alphas = {k.removesuffix(".alpha"): float(np.asarray(v)) for k, v in tensors.items() if k.endswith(".alpha")}
    tensors = {k: v for k, v in tensors.items() if not k.endswith(".alpha")}
    if any("lora_magnitude_vector" in k or "dora_scale" in k for k in tensors):
        raise ValueError(f"{file}: DoRA adapters are not supported (plain LoRA only)")
    new = unload(module)
    for where, layer in _linears(new):
        layers = _layers(where, layer.kernel.shape)
        names = [hf.torch_key((*p, "lora_A", "kernel"), 2, renames).removesuffix(".lora_A.weight") for p in layers]
        present = [f"{n}.lora_A.weight" in tensors for n in names]
        if not any(present):
            continue
        if not all(present):
            raise ValueError(
                f"{file}: adapters for {sum(present)} of the {len(names)} layers of the stacked block "
                f"{_name(where)}; a stacked block takes adapters in every layer or none"
            )
        _check_linear(where, layer)
        ranks = {n: int(tensors[f"{n}.lora_A.weight"].shape[0]) for n in names}
        shapes = {(r, _alpha(n, r, config, alphas)) for n, r in ranks.items()}
        if len(shapes) != 1:
            raise ValueError(
                f"{file}: the layers of the stacked block {_name(where)} differ in (rank, alpha): "
                f"{sorted(shapes)}; one stacked adapter has one of each"
            )
        ((rank, alpha),) = shapes
        shape = (*layer.kernel.shape[:-2], layer.kernel.shape[-2], rank)
        _replace(new, where, LoRA(layer, rank, alpha, jnp.zeros(shape, layer.kernel.dtype)))
    if not has_adapters(new):
        raise hf.KeyMappingError(str(file), unexpected=tensors)
    return hf.load_into(new, tensors, renames=renames, where=str(file), only=LoRAParam)


def _strip(tensors: dict[str, np.ndarray], prefix: str | None, file: Path) -> dict[str, np.ndarray]:
    """The tensors under bare module names: peft's ``base_model.model.`` or diffusers' ``<prefix>.`` removed."""
    if tensors and all(k.startswith(PEFT_PREFIX) for k in tensors):
        return {k.removeprefix(PEFT_PREFIX): v for k, v in tensors.items()}
    lead = f"{prefix}." if prefix else ""
    if lead and any(k.startswith(lead) for k in tensors):
        return {k.removeprefix(lead): v for k, v in tensors.items() if k.startswith(lead)}
    if not tensors:
        raise ValueError(f"{file}: holds no tensors")
    return tensors
