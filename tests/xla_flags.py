"""The XLA flags the test suite compiles with, set before JAX's backend starts (``conftest``, ``behaviour_cases``).

Compiling dominates the suite and its programs are tiny, so the tests compile for speed of compiling; the
subprocesses the tests start inherit the flags through the environment. LLVM at -O0 compiles them in ~60% of the
time (measured: test_flow_grpo + test_denoise 1 min 42 s -> 1 min 02 s from a cold cache) and runs them barely
slower, and the bit-for-bit guarantees the suite checks hold under it as under the default level. A flag the
caller set wins; the behaviour recordings (``tests/data/behaviour.json``) are kept per ``XLA_FLAGS``.

Not used: ``--xla_cpu_use_fusion_emitters=false`` (XLA's loop emitters) compiles a FlowGRPO step in ~60% of the time
again, but under it a fused SDE scan and the same steps driven one by one differ in the last bits (4.8e-7), so four
bit-for-bit tests of what users run (fused == driven, capture changes no bits) would no longer hold.
"""

import os

FAST_COMPILE = {"xla_backend_optimization_level": "0"}


def apply() -> str:
    """Add each of ``FAST_COMPILE`` to ``$XLA_FLAGS`` unless the caller set it; returns the result."""
    for flag, value in FAST_COMPILE.items():
        if flag not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{flag}={value}".strip()
    return os.environ["XLA_FLAGS"]
