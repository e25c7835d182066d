"""The XLA flags the test suite compiles with, set before JAX's backend starts (``conftest``, ``behaviour_cases``).

Compiling dominates the suite and its programs are tiny, so the tests compile for speed of compiling; the
subprocesses the tests start inherit the flags through the environment. A flag the caller set wins; the behaviour
recordings (``tests/data/behaviour.json``) are kept per ``XLA_FLAGS``.

- LLVM at ``-O0`` compiles them in ~60% of the time (measured: test_flow_grpo + test_denoise 1 min 42 s ->
  1 min 02 s from a cold cache) and runs them barely slower.
- XLA's loop emitters instead of its MLIR fusion emitters compile a FlowGRPO step and a tiny eager op in ~60% of the
  time again. They only change how kernels are emitted, not what they compute, with one exception the suite must
  see: under the fusion emitters users run, a fused SDE scan and the same steps driven one by one agree bit for bit,
  and capturing a trajectory changes no bits; under the loop emitters they differ in the last bits (4.8e-7). The
  tests of those guarantees compile their two contenders with ``USERS_EMITTERS`` (``jax.jit(...,
  compiler_options=USERS_EMITTERS)``), so they check what users run.
"""

import os

FAST_COMPILE = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}

USERS_EMITTERS = {"xla_cpu_use_fusion_emitters": True}
"""Per-executable compile options: XLA's default (MLIR fusion) emitters, for the tests that compare the bits of two
differently fused programs."""


def apply() -> str:
    """Add each of ``FAST_COMPILE`` to ``$XLA_FLAGS`` unless the caller set it; returns the result."""
    for flag, value in FAST_COMPILE.items():
        if flag not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{flag}={value}".strip()
    return os.environ["XLA_FLAGS"]


if __name__ == "__main__":  # prints the flags, for a shell that runs what the suite runs (.ci/run's docs build)
    print(apply())
