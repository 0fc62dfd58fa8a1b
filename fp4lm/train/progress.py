"""What the user sees while training: a rich progress bar on a terminal, plain lines otherwise.

Only the main process reports; other processes get a `Reporter(enabled=False)` that prints nothing.
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


def format_step_line(step: int, total: int, record: dict, eta_s: float | None) -> str:
    loss = record.get("loss")
    parts = [
        f"step {step}/{total}",
        f"loss {loss:.4f}" if loss is not None else "loss nan",
        f"lr {record['lr']:.2e}" if record.get("lr") is not None else "lr -",
        f"{record['tokens_per_sec']:,.0f} tok/s",
        f"{record['tflops_per_sec']:.3f} TFLOP/s",
        f"skipped {record['skipped_steps']}",
    ]
    if eta_s is not None:
        parts.append(f"ETA {_eta(eta_s)}")
    return " | ".join(parts)


class Reporter:
    """`message(text)` for one-off lines; `start`/`advance`/`logged`/`finish` drive the progress display."""

    def __init__(self, mode: str = "auto", *, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stdout
        is_terminal = hasattr(self.stream, "isatty") and self.stream.isatty()
        # `auto` falls back to plain lines when rich (the `progress` extra) is missing; `rich` asks for it.
        self.rich = enabled and (mode == "rich" or (mode == "auto" and is_terminal and available("rich")))
        if self.rich:
            require("rich.progress", "progress", purpose="metrics.progress=rich")
        self._progress = None
        self._task = None
        self._total = 0
        self._start_step = 0
        self._start_time = 0.0

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def start(self, *, first_step: int, total: int) -> None:
        self._total, self._start_step, self._start_time = total, first_step, time.perf_counter()
        if not self.rich:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tokens]} tok/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=self.stream),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=total, completed=first_step, loss="-", tokens="-")

    def advance(self, step: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step)

    def logged(self, step: int, record: dict) -> None:
        """A logged training step: refresh the bar's fields, or print one plain line."""
        if not self.enabled:
            return
        if self._progress is not None:
            loss = record.get("loss")
            self._progress.update(
                self._task,
                completed=step,
                loss=f"{loss:.4f}" if loss is not None else "nan",
                tokens=f"{record['tokens_per_sec']:,.0f}",
            )
            return
        done = step - self._start_step
        elapsed = time.perf_counter() - self._start_time
        eta = elapsed / done * (self._total - step) if done > 0 else None
        self.message(format_step_line(step, self._total, record, eta))

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
