"""Timing shared by the step benchmarks: entries timed in turn, so a change in machine load hits them alike."""

from __future__ import annotations

import statistics
import time


def median_seconds(steps: dict, repeats: int) -> dict:
    """{key: median wall seconds of `step.run()`} over `repeats` rounds, after one warm-up call each."""
    for step in steps.values():
        step.run()  # warm-up (already compiled)
    wall = {key: [] for key in steps}
    for _ in range(repeats):
        for key, step in steps.items():
            start = time.perf_counter()
            step.run()
            wall[key].append(time.perf_counter() - start)
    return {key: statistics.median(times) for key, times in wall.items()}
