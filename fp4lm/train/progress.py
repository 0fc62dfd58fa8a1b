"""What the user sees while training: a rich progress bar on a terminal, plain lines otherwise.

Only the main process reports; other processes get a `Reporter(enabled=False)` that prints nothing.
The ETA comes from steady-state steps only: the steps that compile (the first, and the first after the late
switch to bf16) take tens of seconds and would make it read hours; until a steady step is done it reads
"ETA after warm-up".
"""

from __future__ import annotations

import sys
import time

from fp4lm.extras import available, require


def _eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def eta_text(eta_s: float | None) -> str:
    return "ETA after warm-up" if eta_s is None else f"ETA {_eta(eta_s)}"


class EtaClock:
    """Remaining time from the pace of steady steps: time spent compiling is left out.

    `compiling(step)` before the step after `step` compiles, `compiled(step)` once that step is done;
    `eta(step)` is None until a step after the first compilation is done.
    """

    def __init__(self, total: int, clock=time.perf_counter):
        self.total, self._clock = total, clock
        self._steps, self._seconds = 0, 0.0  # closed steady segments
        self._segment: tuple[int, float] | None = None  # (step, time) where the open steady segment began

    def compiling(self, step: int) -> None:
        if self._segment is not None:
            self._steps, self._seconds = self._totals(step)
        self._segment = None

    def compiled(self, step: int) -> None:
        self._segment = (step, self._clock())

    def _totals(self, step: int) -> tuple[int, float]:
        if self._segment is None:
            return self._steps, self._seconds
        first, start = self._segment
        return self._steps + step - first, self._seconds + self._clock() - start

    def eta(self, step: int) -> float | None:
        steps, seconds = self._totals(step)
        if steps <= 0:
            return None
        return seconds / steps * (self.total - step)


def format_step_line(step: int, total: int, record: dict, eta_s: float | None) -> str:
    loss = record.get("loss")
    parts = [
        f"step {step}/{total}",
        f"loss {loss:.4f}" if loss is not None else "loss nan",
        f"lr {record['lr']:.2e}" if record.get("lr") is not None else "lr -",
        f"{record['tokens_per_sec']:,.0f} tok/s",
        f"{record['tflops_per_sec']:.3f} TFLOP/s",
        f"skipped {record['skipped_steps']}",
        eta_text(eta_s),
    ]
    return " | ".join(parts)


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{_eta(seconds)}"


class Reporter:
    """`message(text)` for one-off lines; `start`/`advance`/`logged`/`finish` drive the progress display;
    `compiling`/`compiled` around a step that compiles say so (and keep it out of the ETA)."""

    def __init__(self, mode: str = "auto", *, enabled: bool = True, stream=None, clock=time.perf_counter):
        self.enabled = enabled
        self.stream = stream or sys.stdout
        is_terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        # `auto` falls back to plain lines when rich (the `progress` extra) is missing; `rich` asks for it.
        self.rich = enabled and (mode == "rich" or (mode == "auto" and is_terminal and available("rich")))
        if self.rich:
            require("rich.progress", "progress", purpose="metrics.progress=rich")
        self._clock = clock
        self._progress = None
        self._task = None
        self._total = 0
        self._eta_clock = EtaClock(0, clock)
        self._compile_start = 0.0

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def start(self, *, first_step: int, total: int) -> None:
        self._total = total
        self._eta_clock = EtaClock(total, self._clock)
        self._eta_clock.compiled(first_step)  # a loop that never says `compiling` is timed from its first step
        if not self.rich:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tokens]} tok/s"),
            TextColumn("{task.fields[eta]}"),
            console=Console(file=self.stream),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "train", total=total, completed=first_step, loss="-", tokens="-", eta=eta_text(None)
        )

    def compiling(self, step: int, what: str = "the training step") -> None:
        """The step after `step` compiles `what`: say so; its time is left out of the ETA."""
        self._eta_clock.compiling(step)
        self._compile_start = self._clock()
        self.message(f"compiling {what}…")

    def compiled(self, step: int) -> float:
        """The compiling step, `step`, is done: say how long it took; returns the seconds."""
        seconds = self._clock() - self._compile_start
        self._eta_clock.compiled(step)
        self.message(f"compiled in {_seconds(seconds)}")
        return seconds

    def advance(self, step: int) -> None:
        if self._progress is not None:
            assert self._task is not None  # start() sets both
            self._progress.update(self._task, completed=step, eta=eta_text(self._eta_clock.eta(step)))

    def logged(self, step: int, record: dict) -> None:
        """A logged training step: refresh the bar's fields, or print one plain line."""
        if not self.enabled:
            return
        if self._progress is not None:
            assert self._task is not None  # start() sets both
            loss = record.get("loss")
            self._progress.update(
                self._task,
                completed=step,
                loss=f"{loss:.4f}" if loss is not None else "nan",
                tokens=f"{record['tokens_per_sec']:,.0f}",
            )
            return
        self.message(format_step_line(step, self._total, record, self._eta_clock.eta(step)))

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
