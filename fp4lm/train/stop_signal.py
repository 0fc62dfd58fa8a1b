"""SIGTERM, what a scheduler sends before it kills a job: the loop finishes its step, saves and stops.

`sigterm_requests_stop()` installs a handler for the duration of a `with` block only (the previous one is
restored on the way out, also on an error); the handler just records the request, and the training loop
checks `requested` after each step. Signals reach only the main thread, so elsewhere (and in a multi-host
run, where one process seeing the signal and the others not would leave them waiting for each other in a
collective) nothing is installed and SIGTERM keeps its default action: single-host runs only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fp4lm.sigterm import sigterm_handled_by


class StopRequest:
    """Whether a SIGTERM arrived; set by the handler, read by the loop."""

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum, frame) -> None:
        self.requested = True


@contextlib.contextmanager
def sigterm_requests_stop(*, enabled: bool = True) -> Iterator[StopRequest]:
    """Within the block, SIGTERM sets `requested` on the request it yields instead of ending the process."""
    request = StopRequest()
    with sigterm_handled_by(request._handle, enabled=enabled):
        yield request
