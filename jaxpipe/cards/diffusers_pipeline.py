"""What the real families (``flux``, ``wan``) share: reading a diffusers pipeline folder.

A pipeline folder (``FLUX.1-dev/``, ``Wan2.1-T2V-1.3B-Diffusers/``) holds ``model_index.json``
(the pipeline class and its components), one sub-folder per component (``transformer/``,
``vae/``, ``text_encoder/`` ...; each a ``config.json`` plus safetensors weights, loaded by the
component's own ``nn`` module) and ``scheduler/scheduler_config.json``. The schedule of a
flow-matching scheduler maps onto jaxpipe's one: FLUX's dynamic shift ``μ`` is the flow-shift
``exp(μ)`` (``exp(μ)·σ / (exp(μ)·σ + 1 − σ)`` is ``shift·σ / (1 + (shift − 1)·σ)``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from jaxpipe import validate

__all__ = ["PipelineFolder", "FlowSchedule", "read_pipeline", "load_components"]


@dataclasses.dataclass(frozen=True)
class FlowSchedule:
    """A diffusers ``FlowMatchEulerDiscreteScheduler``'s shift settings (FLUX.1's values by default).

    ``dynamic``: the shift depends on the image's token count ``n``: ``μ`` interpolates linearly
    from ``base_shift`` at ``base_seq_len`` tokens to ``max_shift`` at ``max_seq_len`` and the
    flow-shift is ``exp(μ)``; otherwise the shift is ``shift``.

    Attributes:
      shift: the fixed flow-shift (> 0), used when not ``dynamic``.
      dynamic: whether the shift depends on the token count.
      base_shift: ``μ`` at ``base_seq_len`` tokens.
      max_shift: ``μ`` at ``max_seq_len`` tokens.
      base_seq_len: the token count of ``base_shift``.
      max_seq_len: the token count of ``max_shift``.

    Raises:
      ValueError: on ``shift <= 0`` or a dynamic schedule with ``max_seq_len == base_seq_len``.
    """

    shift: float = 3.0
    dynamic: bool = True
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_seq_len: int = 256
    max_seq_len: int = 4096

    def __post_init__(self):
        validate.positive(self, "shift")
        validate.rule(
            not (self.dynamic and self.max_seq_len == self.base_seq_len),
            "a dynamic schedule needs max_seq_len != base_seq_len",
        )

    def flow_shift(self, tokens: int) -> float:
        """The flow-shift for an image of ``tokens`` transformer tokens.

        Args:
          tokens: the image's transformer token count.

        Returns:
          ``exp(μ(tokens))`` when ``dynamic``, else ``shift``.
        """
        if not self.dynamic:
            return float(self.shift)
        slope = (self.max_shift - self.base_shift) / (self.max_seq_len - self.base_seq_len)
        mu = tokens * slope + self.base_shift - slope * self.base_seq_len
        return float(math.exp(mu))

    @classmethod
    def from_json(cls, config: dict[str, Any]) -> FlowSchedule:
        """From a ``scheduler_config.json``; refuses schedulers whose sigmas jaxpipe's Euler loop would not reproduce.

        Args:
          config: the parsed ``scheduler_config.json``.

        Returns:
          The ``FlowSchedule``.

        Raises:
          ValueError: on a scheduler other than ``FlowMatchEulerDiscreteScheduler`` /
            ``UniPCMultistepScheduler``, or settings that change the sigmas (Karras, exponential or beta
            sigmas, inverted sigmas, stochastic sampling, a terminal shift, a non-exponential time shift).
        """
        name = config.get("_class_name", "FlowMatchEulerDiscreteScheduler")
        if name not in ("FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler"):
            raise ValueError(f"scheduler {name!r} is not a flow-matching scheduler jaxpipe can follow")
        unsupported = [
            k
            for k in (
                "use_karras_sigmas",
                "use_exponential_sigmas",
                "use_beta_sigmas",
                "invert_sigmas",
                "stochastic_sampling",
            )
            if config.get(k)
        ]
        if config.get("shift_terminal"):
            unsupported.append("shift_terminal")
        if config.get("time_shift_type", "exponential") != "exponential":
            unsupported.append(f"time_shift_type={config['time_shift_type']!r}")
        if unsupported:
            raise ValueError(
                f"scheduler settings {unsupported} are not supported (jaxpipe samples linspace(1, 0) flow-shifted sigmas)"
            )
        return cls(
            shift=float(config.get("flow_shift", config.get("shift", 1.0)) or 1.0),
            dynamic=bool(config.get("use_dynamic_shifting", False)),
            base_shift=float(config.get("base_shift", 0.5)),
            max_shift=float(config.get("max_shift", 1.15)),
            base_seq_len=int(config.get("base_image_seq_len", 256)),
            max_seq_len=int(config.get("max_image_seq_len", 4096)),
        )


@dataclasses.dataclass(frozen=True)
class PipelineFolder:
    """A diffusers pipeline folder.

    Attributes:
      path: the folder.
      pipeline: the pipeline class name (``model_index.json``'s ``_class_name``; ``""`` if absent).
      index: the ``model_index.json`` entries.
    """

    path: Path
    pipeline: str
    index: dict[str, Any]

    def component(self, name: str) -> Path:
        """The sub-folder of component ``name``.

        Args:
          name: a component of ``model_index.json`` (``"transformer"``, ``"vae"``, ...).

        Returns:
          Its folder.

        Raises:
          FileNotFoundError: if the index lacks it, lists it as null, or its folder is absent (naming it).
        """
        entry = self.index.get(name)
        folder = self.path / name
        if entry is None or (isinstance(entry, list) and entry[0] is None) or not folder.is_dir():
            raise FileNotFoundError(f"{self.path}: the {self.pipeline} has no {name!r} component (no {name}/ folder)")
        return folder

    def has(self, name: str) -> bool:
        """Whether component ``name`` is listed (not null) in the index and its folder exists."""
        entry = self.index.get(name)
        return entry is not None and not (isinstance(entry, list) and entry[0] is None) and (self.path / name).is_dir()

    def schedule(self) -> FlowSchedule:
        """The folder's ``scheduler/scheduler_config.json`` as a ``FlowSchedule`` (FLUX.1's defaults when absent).

        Raises:
          ValueError: as ``FlowSchedule.from_json``.
        """
        path = self.path / "scheduler" / "scheduler_config.json"
        return FlowSchedule.from_json(json.loads(path.read_text())) if path.is_file() else FlowSchedule()


def read_pipeline(path: str | Path) -> PipelineFolder:
    """The pipeline folder at ``path``.

    Args:
      path: a diffusers pipeline folder.

    Returns:
      Its ``PipelineFolder``.

    Raises:
      FileNotFoundError: if it has no ``model_index.json``.
    """
    path = Path(path)
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise FileNotFoundError(f"{path} is not a diffusers pipeline folder (no model_index.json)")
    index = json.loads(index_file.read_text())
    return PipelineFolder(path, str(index.get("_class_name", "")), index)


def load_components(
    folder: PipelineFolder, loaders: dict[str, Any], dtype: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each component ``name`` of the pipeline loaded by ``loaders[name](sub-folder, dtype=dtype)``.

    Args:
      folder: the pipeline folder.
      loaders: component name -> ``load(folder, dtype=...) -> module`` (a module with ``.config``).
      dtype: the compute dtype's name, passed to every loader.

    Returns:
      ``(components, configs)``: ``{name: module}`` and ``{name: its network config}`` (as loaded, dtype
      included, for the card's config).

    Raises:
      FileNotFoundError: if a component is missing (``PipelineFolder.component``).
    """
    components = {name: load(folder.component(name), dtype=dtype) for name, load in loaders.items()}
    return components, {name: module.config for name, module in components.items()}
