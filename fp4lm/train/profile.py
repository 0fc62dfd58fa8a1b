"""A `jax.profiler` trace of a window of training steps: `profile.start_step` and `profile.steps`.

The trace is written to RUN_DIR/profile/ in TensorBoard's layout (`plugins/profile/<time>/<host>.xplane.pb`),
which TensorBoard's profile plugin and xprof open; the run summary names the files. The window covers
steps start_step .. start_step + steps - 1 (1-based, as the metrics count them): the trace starts before
the first of them is dispatched and stops once the last has finished on the device, so it holds their whole
device time. A resumed run that starts inside the window traces the rest of it.

Off (`profile.steps=0`, the default) the loop makes no profiler call at all.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax

from fp4lm.config import ProfileConfig
from fp4lm.train.throughput import StepMeter

PROFILE_DIR = "profile"  # inside the run directory


class ProfileWindow:
    """Starts and stops the trace around the configured steps; `close()` stops a trace left open (a stop).

    The loop calls `before_step` and `after_step` around every step; with profiling off they return at once.
    Starting and stopping the profiler is not step time: both happen inside the meter's `excluded` (which
    waits for the device first), so the trace holds only the window's steps and step_time_s stays honest.
    """

    def __init__(self, cfg: ProfileConfig, run_dir: pathlib.Path):
        self.enabled = cfg.steps > 0
        self.first, self.last = cfg.start_step, cfg.start_step + cfg.steps - 1
        self.run_dir = pathlib.Path(run_dir)
        self.directory = self.run_dir / PROFILE_DIR
        self._tracing = False

    def before_step(self, step_number: int, meter: StepMeter, previous: Any) -> None:
        """Before dispatching step `step_number` (1-based); `previous` is the last step's result."""
        if self.enabled and not self._tracing and self.first <= step_number <= self.last:
            with meter.excluded(previous):
                jax.profiler.start_trace(str(self.directory))
            self._tracing = True

    def after_step(self, step_number: int, meter: StepMeter, result: Any) -> None:
        """After dispatching step `step_number`; the trace stops once `result` is ready."""
        if self._tracing and step_number >= self.last:
            with meter.excluded(result):
                self.close()

    def close(self) -> None:
        if self._tracing:
            self._tracing = False
            jax.profiler.stop_trace()

    def summary(self) -> dict:
        """summary.json's "profile_traces" (the trace files, relative to the run directory) when profiling."""
        return {"profile_traces": self.trace_files()} if self.enabled else {}

    def trace_files(self) -> list[str]:
        """The trace files written so far, relative to the run directory (oldest first)."""
        if not self.directory.is_dir():
            return []
        found = sorted(self.directory.rglob("*.xplane.pb"), key=lambda path: (path.stat().st_mtime, str(path)))
        return [str(path.relative_to(self.run_dir)) for path in found]
