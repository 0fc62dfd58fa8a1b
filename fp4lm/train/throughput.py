"""How fast training goes: the step-time meter and the throughput of a step time (MFU against
fp4lm.hardware's peaks).

JAX dispatches a step and returns at once; the step runs later. A clock read right after a dispatch
measures the dispatch, not the step. So the meter takes a `block` function (the loop passes
`jax.block_until_ready`) and blocks on a step's result before every clock read it makes: a window runs
from the completion of the step before its first step to the completion of its last step.

Imports nothing from jax: the meter is tested with a fake clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


def throughput(
    *, step_time_s: float, tokens_per_step: int, flops_per_step: float, num_devices: int, peak_tflops: float | None
) -> dict[str, float | None]:
    """Tokens/s, model TFLOP/s per device and MFU (None when the device's peak is unknown) of a step time.

    A step is one optimizer update: `tokens_per_step` and `flops_per_step` are those of its whole batch
    (train.batch_size x data.seq_len), all of its micro-batches when train.grad_accum_steps splits it.
    """
    tflops_per_device = flops_per_step / num_devices / step_time_s / 1e12
    return {
        "step_time_s": step_time_s,
        "tokens_per_sec": tokens_per_step / step_time_s,
        "tflops_per_sec": tflops_per_device,
        "mfu": None if peak_tflops is None else tflops_per_device / peak_tflops,
    }


class StepMeter:
    """Seconds per training step over windows of steps, and the run's steady tokens/s.

    Use: `step_taken()` after each dispatch; `with excluded(result):` around evaluation, telemetry and
    saving (not training time); `window_done(result)` on a log step returns the window's seconds per step
    and starts the next window; `compiles_next()` before a step that re-jits. A window that contains a
    compilation (the first one, and the one after a re-jit) does not count towards `steady_tokens_per_sec`.
    """

    def __init__(
        self, tokens_per_step: int, *, block: Callable[[Any], Any], clock: Callable[[], float] = time.perf_counter
    ):
        self.tokens_per_step = tokens_per_step
        self._block, self._clock = block, clock
        self._steady_steps, self._steady_seconds = 0, 0.0
        self._start, self._steps, self._excluded = clock(), 0, 0.0
        self._compiles = True  # the first window compiles the step

    def step_taken(self) -> None:
        self._steps += 1

    def compiles_next(self) -> None:
        self._compiles = True

    @contextlib.contextmanager
    def excluded(self, result: Any) -> Iterator[None]:
        """Time inside is not step time; `result` (of the last step) is waited for first."""
        self._block(result)
        start = self._clock()
        try:
            yield
        finally:
            self._excluded += self._clock() - start

    def window_done(self, result: Any) -> float:
        """Seconds per step of the window ending with the step that produced `result` (waited for)."""
        if self._steps == 0:
            raise ValueError("window_done called before any step_taken; count each step as it is dispatched")
        self._block(result)
        now = self._clock()
        seconds = now - self._start - self._excluded
        per_step = seconds / self._steps
        if not self._compiles:
            self._steady_steps += self._steps
            self._steady_seconds += seconds
        self._start, self._steps, self._excluded, self._compiles = now, 0, 0.0, False
        return per_step

    @property
    def steady_tokens_per_sec(self) -> float | None:
        """Tokens/s over the windows without a compilation; None when there was none."""
        if self._steady_seconds <= 0:
            return None
        return self._steady_steps * self.tokens_per_step / self._steady_seconds
