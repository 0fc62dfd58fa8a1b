"""SIGTERM, what a scheduler (or `kill`) sends before it kills a job, handled for the length of a `with` block.

`fp4lm train` turns it into "finish the step, save, stop" (fp4lm/train/stop_signal.py); `fp4lm compare` into
Ctrl-C's path, so its training child is stopped too (fp4lm/compare/runner.py). Signals reach only the main
thread: elsewhere nothing is installed and SIGTERM keeps its default action.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def sigterm_handled_by(handler: Callable, *, enabled: bool = True) -> Iterator[None]:
    """Within the block SIGTERM calls `handler(signum, frame)`; the previous handler is restored on the way out,
    also on an error. Installs nothing when not `enabled` or off the main thread."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
