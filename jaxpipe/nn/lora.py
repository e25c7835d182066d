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

Files (``save_adapters`` / ``load_adapters``): diffusers' ``FluxPipeline.save_lora_weights`` layout,
``pytorch_lora_weights.safetensors`` with ``transformer.<name>.lora_A.weight`` keys and the adapter's
``LoraConfig`` fields (``r``, ``lora_alpha``, ``target_modules``, per-module ``rank_pattern`` /
``alpha_pattern``) as JSON in the file's ``lora_adapter_metadata`` entry, which ``load_lora_weights``
reads; or peft's ``save_pretrained`` layout, ``adapter_model.safetensors`` with
``base_model.model.<name>.lora_A.weight`` keys next to ``adapter_config.json``. Loading also takes
diffusers files with per-module ``<name>.alpha`` tensors or no alpha at all (``alpha = rank``, diffusers'
convention), and peft's ``use_rslora`` (scale ``alpha/√rank``, kept as the equivalent ``alpha·√rank``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxpipe.nn import hf
from jaxpipe.nn.stacked import STACKED

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

BASE_LAYER = "base_layer"
"""The path part of a wrapped layer inside its ``LoRA`` (peft's name); ``distributed`` shards through it."""
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


class LoRAParam(nnx.Param):
    """An adapter array (a LoRA ``A`` or ``B``): an ``nnx.Param``, told apart from the base weights by filters."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Which layers get adapters, and their shape and scale (hashable: static under ``jit``).

    Attributes:
      rank: the adapters' rank r, >= 1.
      alpha: the scale numerator (``None``: ``rank``, scale 1); each adapter adds ``(alpha / rank)·x @ A @ B``.
      target_modules: the layers to wrap, as peft's: a tuple of module names, each matching a name equal to
        it or ending with ``"." + it`` (``("to_q", "attn.to_out.0")``), or one regex string ``re.fullmatch``ed
        against the whole name; ``None``: the network's own ``LORA_TARGETS`` (FLUX: ``flux.LORA_TARGETS``).
      seed: seeds the ``A`` draws (each layer's from its own name, so stacked and unrolled layouts agree).

    Raises:
      ValueError: on construction, if ``rank`` is not an int >= 1, ``alpha`` is not a finite number > 0, or
        ``target_modules`` is empty, holds a non-string, or is a regex that does not compile.
    """

    rank: int
    alpha: float | None = None
    target_modules: tuple[str, ...] | str | None = None
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRAConfig.rank must be an int >= 1 (got {self.rank!r})")
        if self.alpha is not None and (
            isinstance(self.alpha, bool)
            or not isinstance(self.alpha, (int, float))
            or not math.isfinite(self.alpha)
            or self.alpha <= 0
        ):
            raise ValueError(f"LoRAConfig.alpha must be a finite number > 0, or None for the rank (got {self.alpha!r})")
        targets = self.target_modules
        if isinstance(targets, str):
            try:
                re.compile(targets)
            except re.error as err:
                raise ValueError(f"LoRAConfig.target_modules {targets!r} is not a valid regex: {err}") from None
        elif targets is not None:
            targets = tuple(targets)
            if not targets or not all(isinstance(t, str) and t for t in targets):
                raise ValueError(
                    f"LoRAConfig.target_modules must be non-empty module names, a regex or None (got {self.target_modules!r})"
                )
            object.__setattr__(self, "target_modules", targets)

    @property
    def scale(self) -> float:
        """``alpha / rank``: what the adapters' product is multiplied by."""
        return (self.rank if self.alpha is None else self.alpha) / self.rank


class _Factor(nnx.Module):
    """One factor of an adapter (peft's ``lora_A`` / ``lora_B`` linear, without bias): its ``kernel``."""

    def __init__(self, kernel: jax.Array):
        self.kernel = LoRAParam(kernel)


class LoRA(nnx.Module):
    """A linear layer plus a low-rank update: ``base_layer(x) + (alpha / rank)·(x @ A) @ B``.

    Built by ``apply`` (or ``load_adapters``). ``base_layer`` is the wrapped module (its ``kernel`` is
    ``(*layers, din, dout)``: ``layers`` is ``(n,)`` in a stacked block, else empty); ``lora_A.kernel``
    is ``(*layers, din, rank)``, ``lora_B.kernel`` ``(*layers, rank, dout)``, both ``LoRAParam`` s in the
    base kernel's dtype.

    Args:
      base: the linear layer.
      rank: r.
      alpha: the scale numerator (scale ``alpha / rank``).
      a: the ``A`` array.
      b: the ``B`` array (``None``: zeros, a no-op adapter).
    """

    def __init__(self, base: nnx.Module, rank: int, alpha: float, a: jax.Array, b: jax.Array | None = None):
        *layers, _, dout = base.kernel.shape
        self.base_layer = base
        self.rank, self.alpha = int(rank), float(alpha)
        self.lora_A = _Factor(a)
        self.lora_B = _Factor(jnp.zeros((*layers, rank, dout), base.kernel.dtype) if b is None else b)

    @property
    def scale(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank

    def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
        """The base layer's output plus the scaled adapter product, in the base output's dtype.

        Args:
          x: the input ``(..., din)``.
          *args: passed on to the base layer.
          **kwargs: passed on to the base layer.

        Returns:
          ``(..., dout)``.
        """
        y = self.base_layer(x, *args, **kwargs)
        h = jnp.matmul(x.astype(y.dtype), self.lora_A.kernel[...].astype(y.dtype))
        return y + (self.scale * jnp.matmul(h, self.lora_B.kernel[...].astype(y.dtype))).astype(y.dtype)


# ------------------------------------------------------------------------------------------ the graph
NodePath = tuple[Any, ...]


def _child(node: Any, part: Any) -> Any:
    return node[part] if isinstance(part, int) or isinstance(node, Mapping) else getattr(node, part)


def _set_child(node: Any, part: Any, value: Any) -> None:
    if isinstance(part, int) or isinstance(node, Mapping):
        node[part] = value
    else:
        setattr(node, part, value)


def _replace(root: Any, path: NodePath, value: Any) -> None:
    node = root
    for part in path[:-1]:
        node = _child(node, part)
    _set_child(node, path[-1], value)


def _wrappers(root: Any) -> list[tuple[NodePath, LoRA]]:
    """The ``LoRA`` modules of ``root`` with their paths, outermost first."""
    return [(tuple(path), node) for path, node in nnx.iter_graph(root) if isinstance(node, LoRA)]


def _linears(root: Any) -> list[tuple[NodePath, nnx.Module]]:
    """Every linear-like module (a ``kernel`` ``nnx.Param``) of ``root`` (which has no adapters), with its path."""
    return [
        (tuple(path), node)
        for path, node in nnx.iter_graph(root)
        if path and isinstance(node, nnx.Module) and isinstance(getattr(node, "kernel", None), nnx.Param)
    ]


def _layers(path: NodePath, kernel_shape: Sequence[int]) -> list[NodePath]:
    """The per-layer paths a module at ``path`` stands for: itself, or one per layer of its stacked block."""
    if STACKED not in path:
        return [path]
    at = path.index(STACKED)
    return [(*path[:at], i, *path[at + 1 :]) for i in range(kernel_shape[0])]


def _name(path: NodePath) -> str:
    return ".".join(map(str, path))


def _matches(targets: tuple[str, ...] | str, name: str) -> bool:
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _check_linear(path: NodePath, module: nnx.Module) -> None:
    expected = 2 + (STACKED in path)
    shape = tuple(module.kernel.shape)
    if len(shape) != expected:
        what = "a stacked linear layer's (n, din, dout)" if STACKED in path else "a linear layer's (din, dout)"
        raise ValueError(
            f"LoRA: {_name(path)} ({type(module).__name__}) has a kernel of shape {shape}, not {what}: only linear "
            "layers take adapters"
        )


def _draw_a(key: jax.Array, names: Sequence[str], din: int, rank: int, dtype, stacked: bool) -> jax.Array:
    """``A`` for each layer named ``names``, each from its own name's key: ``(din, rank)``, or stacked
    ``(L, din, rank)`` for a scanned stack's kernel ``(L, din, dout)`` (also when ``L == 1``)."""
    bound = 1.0 / math.sqrt(din)  # peft: kaiming_uniform_(a=sqrt(5)) on the (rank, din) weight
    draws = [
        jax.random.uniform(jax.random.fold_in(key, zlib.crc32(n.encode())), (din, rank), dtype, -bound, bound)
        for n in names
    ]
    return jnp.stack(draws) if stacked else draws[0]


def _targets_of(module: Any, config: LoRAConfig) -> tuple[str, ...] | str:
    if config.target_modules is not None:
        return config.target_modules
    targets = getattr(module, "LORA_TARGETS", None)
    if targets is None:
        raise ValueError(
            f"LoRAConfig.target_modules is None and {type(module).__name__} declares no LORA_TARGETS: pass "
            "target_modules (module names, e.g. ('to_q', 'to_k', 'to_v'), or a regex)"
        )
    return targets


def _candidates(linears: Sequence[tuple[NodePath, nnx.Module]], limit: int = 10) -> str:
    names = [_name(_layers(path, m.kernel.shape)[0]) for path, m in linears]
    shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
    return shown or "none"


def apply(module: Any, config: LoRAConfig) -> Any:
    """A copy of ``module`` with a fresh ``LoRA`` adapter on every linear layer ``config`` targets.

    Works under ``nnx.eval_shape`` (an abstract FLUX.1-dev with adapters allocates nothing). The copy
    shares no ``Variable`` with ``module``; its base weights are the same arrays.

    Args:
      module: a network (or any ``nnx`` graph node, e.g. a card's components dict).
      config: the targets, rank, alpha and seed.

    Returns:
      The adapted copy: each targeted layer at its old path is a ``LoRA`` whose ``base_layer`` is the layer.

    Raises:
      ValueError: if ``module`` already has adapters, nothing matches the targets (naming them and some
        candidate layers), a matched module is not a linear layer, or a regex matches only some layers of
        a stacked block.
    """
    if has_adapters(module):
        raise ValueError("LoRA.apply: the module already has adapters: merge or unload them first")
    targets = _targets_of(module, config)
    new = nnx.clone(module)
    linears = _linears(new)
    chosen = []
    for path, layer in linears:
        names = [_name(p) for p in _layers(path, layer.kernel.shape)]
        hits = [_matches(targets, n) for n in names]
        if any(hits) and not all(hits):
            raise ValueError(
                f"LoRA: target_modules {targets!r} match only some layers of the stacked block {_name(path)} "
                f"({sum(hits)} of {len(hits)}); a stacked block takes adapters in every layer or none (build the "
                "network unrolled, scan_layers=False, to adapt single layers)"
            )
        if all(hits):
            _check_linear(path, layer)
            chosen.append((path, layer, names))
    if not chosen:
        raise ValueError(
            f"LoRA: target_modules {targets!r} match no linear layer of {type(module).__name__}; its linear layers "
            f"include: {_candidates(linears)}"
        )
    key = jax.random.key(config.seed)
    alpha = config.rank if config.alpha is None else config.alpha
    for path, layer, names in chosen:
        din = layer.kernel.shape[-2]
        a = _draw_a(key, names, din, config.rank, layer.kernel.dtype, stacked=layer.kernel.ndim > 2)
        _replace(new, path, LoRA(layer, config.rank, alpha, a))
    return new


def has_adapters(module: Any) -> bool:
    """Whether ``module`` holds any ``LoRA`` adapter.

    Args:
      module: a network or any ``nnx`` graph node.

    Returns:
      ``True`` if some layer is wrapped.
    """
    return any(isinstance(node, LoRA) for _, node in nnx.iter_graph(module))


def adapter_names(module: Any, *, renames: hf.Renames = ()) -> tuple[str, ...]:
    """The PyTorch names of the adapted layers, one per layer (a stacked block's layers each), sorted.

    Args:
      module: a network with adapters.
      renames: the network's ``hf`` renames (regex -> replacement on the PyTorch key).

    Returns:
      The names, e.g. ``("transformer_blocks.0.attn.to_q", ...)``.
    """
    return tuple(sorted(name for name, _ in _named_wrappers(module, tuple(renames))))


def param_count(module: Any) -> int:
    """The number of adapter elements (``LoRAParam`` s) of ``module``; works on an ``nnx.eval_shape`` build.

    Args:
      module: a network.

    Returns:
      The total element count of its adapters.
    """
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(module, LoRAParam)))


def merge(module: Any) -> Any:
    """peft's ``merge_and_unload``: a copy with every adapter folded into its base kernel and the wrappers gone.

    Each base kernel becomes ``kernel + (alpha / rank)·A @ B`` (computed in float32, stored in the kernel's
    dtype); the result has the parameter paths of the network before ``apply``. A module without
    adapters comes back as a copy.

    Args:
      module: a network (or graph node) with adapters.

    Returns:
      The merged copy.
    """
    new = nnx.clone(module)
    for path, wrapper in _wrappers(new):
        base = wrapper.base_layer
        kernel = base.kernel[...]
        a, b = wrapper.lora_A.kernel[...].astype(jnp.float32), wrapper.lora_B.kernel[...].astype(jnp.float32)
        base.kernel.set_value((kernel.astype(jnp.float32) + wrapper.scale * jnp.matmul(a, b)).astype(kernel.dtype))
        _replace(new, path, base)
    return new


def unload(module: Any) -> Any:
    """peft's ``unload``: a copy with every adapter dropped, the base weights as they were.

    Args:
      module: a network (or graph node) with adapters.

    Returns:
      The copy without adapters.
    """
    new = nnx.clone(module)
    for path, wrapper in _wrappers(new):
        _replace(new, path, wrapper.base_layer)
    return new


# ------------------------------------------------------------------------------------------- files
def _named_wrappers(module: Any, renames: tuple) -> Iterator[tuple[str, LoRA]]:
    """Per layer of every adapter: its PyTorch name (renames applied) and the wrapper."""
    for path, wrapper in _wrappers(module):
        for layer in _layers(path, wrapper.base_layer.kernel.shape):
            key = hf.torch_key((*layer, "lora_A", "kernel"), 2, renames)
            yield key.removesuffix(".lora_A.weight"), wrapper


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
