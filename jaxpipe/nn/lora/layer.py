"""A LoRA adapter on one linear layer: its config (``LoRAConfig``), its arrays (``LoRAParam``) and the wrapper
(``LoRA``: peft's ``LoraLayer`` names, ``base_layer`` / ``lora_A`` / ``lora_B``); ``jaxpipe.nn.lora`` tells the story."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate

__all__ = ["BASE_LAYER", "LoRA", "LoRAConfig", "LoRAParam"]

BASE_LAYER = "base_layer"
"""The path part of a wrapped layer inside its ``LoRA`` (peft's name); ``distributed`` shards through it."""


class LoRAParam(nnx.Param):
    """An adapter array (a LoRA ``A`` or ``B``): an ``nnx.Param``, told apart from the base weights by filters."""


def _regex_error(pattern: str) -> str | None:
    """Why ``pattern`` does not compile as a regex, or ``None`` if it does."""
    try:
        re.compile(pattern)
    except re.error as err:
        return str(err)
    return None


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
        rank_ok = isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= 1
        validate.rule(rank_ok, f"LoRAConfig.rank must be an int >= 1 (got {self.rank!r})")
        validate.positive(self, "alpha", optional=True, prefix="LoRAConfig.")
        targets = self.target_modules
        if isinstance(targets, str):
            err = _regex_error(targets)
            validate.rule(err is None, f"LoRAConfig.target_modules {targets!r} is not a valid regex: {err}")
        elif targets is not None:
            targets = tuple(targets)
            validate.rule(
                bool(targets) and all(isinstance(t, str) and t for t in targets),
                f"LoRAConfig.target_modules must be non-empty module names, a regex or None (got {self.target_modules!r})",
            )
            object.__setattr__(self, "target_modules", targets)
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
