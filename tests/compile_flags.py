"""XLA flags for the tests' programs, in this process and in the subprocesses tests start.

The programs are small and each is compiled once or twice, so compiling, not running, is most of the suite's
time: XLA's CPU backend skips its costly code optimisations (FAST_COMPILE; about a sixth of the suite's time).
Both sides of every comparison in the tests are compiled alike, and the bit-exact vectors hold with it.
"""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def xla_flags(*flags: str) -> str:
    """XLA_FLAGS for a test's subprocess: `flags` (e.g. the fake device count) and FAST_COMPILE."""
    return " ".join([*flags, FAST_COMPILE])
