"""Repeated blocks stored stacked and applied by one ``jax.lax.scan``, with a rematerialisation policy.

A network with ``n`` blocks of one structure keeps them either unrolled (an ``nnx.List``, one
parameter per block: diffusers' own layout, ``blocks/3/attn/to_q/kernel``) or ``Stacked`` (one
block whose every array has a leading ``(n,)`` axis, ``blocks/stacked/attn/to_q/kernel``). XLA
compiles a scanned stack's block once, not ``n`` times — the whole point at 57 FLUX blocks — and
``hf`` loads and saves diffusers' per-layer keys into and out of the stacked layout.

``apply`` runs either form with a ``remat`` policy: ``"none"`` keeps every activation for the
backward pass, ``"full"`` recomputes each block's, ``"dots"`` keeps only the outputs of matmuls
without batch dimensions (the projections; attention scores are recomputed), ``"offload"`` moves
those to pinned host memory instead of keeping them on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from jaxpipe import validate

__all__ = [
    "REMAT_POLICIES",
    "STACKED",
    "Stacked",
    "apply",
    "blocks",
    "check_layout",
    "check_remat",
    "prefix",
    "scan",
    "unstack",
]

STACKED = "stacked"  # the path part that marks a stacked block: hf and distributed map it to per-layer indices
REMAT_POLICIES = ("none", "full", "dots", "offload")

Carry = TypeVar("Carry")


class Stacked(nnx.Module):
    """``n`` blocks of one structure as one block (``self.stacked``) whose every array has a leading ``(n,)`` axis.

    Args:
      layers: the blocks, at least one, all with the same structure and static attributes (their
        arrays are stacked in order; the blocks themselves are not kept).

    Raises:
      ValueError: if there are no blocks or they differ in structure.
    """

    def __init__(self, layers: Sequence[nnx.Module]):
        if not layers:
            raise ValueError("Stacked needs at least one block (keep an empty nnx.List for zero)")
        graphdefs, states = zip(*(nnx.split(layer) for layer in layers))
        if any(g != graphdefs[0] for g in graphdefs[1:]):
            raise ValueError(f"Stacked: the {len(layers)} blocks differ in structure or static attributes")
        self.count = len(layers)
        self.stacked = nnx.merge(graphdefs[0], jax.tree.map(lambda *xs: jnp.stack(xs), *states))

    def __len__(self) -> int:
        return self.count

    def layer(self, i: int) -> nnx.Module:
        """Block ``i`` as its own module (a slice of every stacked array)."""
        graphdef, state = nnx.split(self.stacked)
        return nnx.merge(graphdef, jax.tree.map(lambda a: a[i], state))


def blocks(make: Callable[[], nnx.Module], n: int, *, scan: bool) -> nnx.List | Stacked:
    """``n`` blocks built by ``make()`` in order, as an ``nnx.List`` or (``scan`` and ``n > 0``) ``Stacked``.

    Both forms draw the same parameters from the same keys, so a scanned network equals its unrolled twin.

    Args:
      make: builds one block (drawing its init keys from a shared stream).
      n: how many.
      scan: store them stacked for ``apply``'s ``lax.scan``.

    Returns:
      The blocks.
    """
    layers = [make() for _ in range(n)]
    return Stacked(layers) if scan and layers else nnx.List(layers)


def unstack(layers: nnx.List | Stacked) -> nnx.List:
    """The blocks as an ``nnx.List`` (a ``Stacked`` sliced into its blocks; a list as it is).

    Args:
      layers: the blocks, in either layout.

    Returns:
      One module per block, in order.
    """
    if isinstance(layers, Stacked):
        return nnx.List([layers.layer(i) for i in range(len(layers))])
    return layers


def prefix(layers: nnx.List | Stacked, k: int) -> nnx.List | Stacked:
    """The first ``k`` blocks, in ``layers``' own layout (a ``Stacked`` of ``k`` slices, or a shorter list).

    Args:
      layers: the blocks.
      k: how many to keep, ``1 <= k <= len(layers)``.

    Returns:
      The first ``k`` blocks.

    Raises:
      ValueError: if ``k`` is out of range.
    """
    if not 1 <= k <= len(layers):
        raise ValueError(f"prefix: k must be in [1, {len(layers)}] (got {k})")
    if isinstance(layers, Stacked):
        return Stacked([layers.layer(i) for i in range(k)])
    return nnx.List(list(layers)[:k])


def check_remat(policy: str) -> str:
    """``policy`` if it is one of ``REMAT_POLICIES`` and the default backend can run it, else a ``ValueError``.

    Args:
      policy: ``"none"``, ``"full"``, ``"dots"`` or ``"offload"``.

    Returns:
      ``policy``.

    Raises:
      ValueError: on an unknown policy, or ``"offload"`` where the default device has no pinned host memory.
    """
    validate.rule(policy in REMAT_POLICIES, f"remat must be one of {REMAT_POLICIES} (got {policy!r})")
    if policy == "offload":
        kinds = {m.kind for m in jax.devices()[0].addressable_memories()}
        validate.rule(
            "pinned_host" in kinds,
            f"remat='offload' moves saved activations to pinned host memory, which the {jax.default_backend()} "
            f"backend's device does not have (memories: {sorted(kinds)}); use 'dots' or 'full'",
        )
    return policy


def check_layout(config) -> None:
    """Checks a network config's layer layout: ``scan_layers`` a bool and ``remat`` a policy this backend runs.

    Args:
      config: a config dataclass with ``scan_layers`` and ``remat`` fields.

    Raises:
      ValueError: naming ``Config.scan_layers`` or the ``remat`` policy that fails.
    """
    name = type(config).__name__
    validate.rule(
        isinstance(config.scan_layers, bool), f"{name}.scan_layers must be a bool (got {config.scan_layers!r})"
    )
    check_remat(config.remat)


def _policy(policy: str):
    if policy == "full":
        return jax.checkpoint_policies.nothing_saveable
    if policy == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")


def apply(
    layers: nnx.List | Stacked,
    fn: Callable[[nnx.Module, Carry], Carry],
    carry: Carry,
    *,
    remat: str = "none",
) -> Carry:
    """``carry = fn(block, carry)`` for every block in order: one ``lax.scan`` over a ``Stacked``, a loop over a list.

    Args:
      layers: the blocks.
      fn: one block's step, pure in ``carry`` (a pytree of arrays; closed-over arrays are constants).
      carry: the running value.
      remat: one of ``REMAT_POLICIES``: what each block keeps for the backward pass.

    Returns:
      The final ``carry``.
    """
    carry, _ = scan(layers, lambda block, c, _: (fn(block, c), None), carry, remat=remat)
    return carry


def scan(
    layers: nnx.List | Stacked,
    fn: Callable[[nnx.Module, Carry, Any], tuple[Carry, Any]],
    carry: Carry,
    inputs: Sequence[Any] | None = None,
    *,
    remat: str = "none",
) -> tuple[Carry, list]:
    """``carry, output_i = fn(block_i, carry, inputs[i])`` for every block: ``apply`` with per-layer inputs and outputs.

    Per-layer values (a block's KV-cache slab in, its keys and values out) are a sequence of one pytree per
    block on both sides, whichever layout the blocks have, so a caller's cache format does not depend on
    ``scan_layers``. Over a ``Stacked`` they travel with the params through one ``lax.scan``: ``inputs``
    stacked on a leading layer axis as its ``xs`` (a copy of them), its ``ys`` split back per block; over a
    list ``fn`` runs block by block on them as they are.

    Args:
      layers: the blocks.
      fn: one block's step ``(block, carry, input) -> (carry, output)``, pure in ``carry`` and ``input``
        (pytrees of arrays; ``input`` is ``None`` when ``inputs`` is); closed-over arrays are constants.
      carry: the running value.
      inputs: one pytree per block, all of one structure and shapes, or ``None``.
      remat: one of ``REMAT_POLICIES``: what each block keeps for the backward pass.

    Returns:
      The final ``carry`` and the list of the blocks' outputs, in block order.

    Raises:
      ValueError: if ``inputs`` does not hold one entry per block, or on an unknown ``remat``.
    """
    check_remat(remat)
    n = len(layers)
    if inputs is not None and len(inputs) != n:
        raise ValueError(f"scan: {len(inputs)} per-layer inputs for {n} blocks")
    per_layer = [None] * n if inputs is None else list(inputs)

    def step(state: Any, c: Carry, x: Any, graphdef) -> tuple[Carry, Any]:
        return fn(nnx.merge(graphdef, state), c, x)

    if isinstance(layers, Stacked):
        graphdef, state = nnx.split(layers.stacked)

        def body(c: Carry, state_and_input: Any) -> tuple[Carry, Any]:
            layer_state, x = state_and_input
            return step(layer_state, c, x, graphdef)

        if remat != "none":
            # inside a scan CSE cannot merge the recomputation back into the forward: prevent_cse=False is safe and faster
            body = jax.checkpoint(body, policy=_policy(remat), prevent_cse=False)
        xs = None if inputs is None else jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
        carry, ys = jax.lax.scan(body, carry, (state, xs))
        return carry, [jax.tree.map(lambda a, i=i: a[i], ys) for i in range(n)]
    outputs = []
    for layer, x in zip(layers, per_layer):
        if remat == "none":
            carry, y = fn(layer, carry, x)
        else:
            graphdef, state = nnx.split(layer)
            carry, y = jax.checkpoint(lambda s, c, x, g=graphdef: step(s, c, x, g), policy=_policy(remat))(
                state, carry, x
            )
        outputs.append(y)
    return carry, outputs
