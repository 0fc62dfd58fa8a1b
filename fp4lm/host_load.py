"""The host's load average: speed measured on a busy host is slowed unevenly, so every speed figure (compare's
tokens/s, the benchmarks) records it and says whether the host was idle."""

from __future__ import annotations

import os

IDLE_LOAD = 1.5
"""The one-minute load average above which a host is busy."""


def load_average() -> float | None:
    """The host's one-minute load average, or None where the platform has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
