"""The host's load, recorded with every benchmark figure: a ratio measured on a busy machine is compressed
(the baseline slows too), so figures meant for BENCHMARKS.md are taken only on an idle host."""

from __future__ import annotations

import os

IDLE_LOAD = 1.5  # one-minute load average above which a host is not idle enough to publish figures


def load_average() -> float | None:
    """The one-minute load average, or None where the platform has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def describe(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "load average unknown"
    state = "idle" if max(before, after) <= IDLE_LOAD else "LOADED"
    return f"load average {before:.2f} before, {after:.2f} after ({state}; idle means <= {IDLE_LOAD})"


def is_idle(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and max(before, after) <= IDLE_LOAD
