"""`fp4lm prepare`'s progress display: units done, tokens, tokens/s."""

from __future__ import annotations

import time

from fp4lm.data.prepared import SPLITS


class Progress:
    """A rich progress bar (units done, tokens, tokens/s) on a terminal; plain lines every few seconds
    otherwise; nothing with mode "off". Workers report tokens as they go (`tokens`), units when done."""

    def __init__(self, mode: str, stream, total_units: int, *, every_s: float = 5.0):
        from fp4lm.extras import available

        self.stream, self.total_units, self.every_s = stream, total_units, every_s
        self.enabled = mode != "off"
        terminal = hasattr(stream, "isatty") and stream.isatty()
        self.rich = self.enabled and mode != "plain" and terminal and available("rich.progress")
        self.units = self.earlier_tokens = self.new_tokens = 0
        self.start = self.last = time.perf_counter()
        self._bar = self._task = None
        if self.rich:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]prepare"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("units {task.fields[tokens]} tokens {task.fields[rate]} tok/s"),
                TimeElapsedColumn(),
                console=Console(file=stream),
            )
            self._bar.start()
            self._task = self._bar.add_task("prepare", total=total_units, tokens="0", rate="-")

    def tokens(self, count: int) -> None:
        self.new_tokens += count
        self._show()

    def done(self, record: dict, *, resumed: bool = False) -> None:
        self.units += 1
        if resumed:  # an earlier run's unit: counted, but not in this run's rate
            self.earlier_tokens += sum(part["tokens"] for split in SPLITS for part in record["parts"][split])
        self._show()

    def _show(self) -> None:
        rate = self.new_tokens / max(time.perf_counter() - self.start, 1e-9)
        tokens = self.earlier_tokens + self.new_tokens
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.units, tokens=f"{tokens:,}", rate=f"{rate:,.0f}")
        elif self.enabled and time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            line = f"prepare: {self.units}/{self.total_units} units, {tokens:,} tokens, {rate:,.0f} tok/s"
            print(line, file=self.stream, flush=True)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
