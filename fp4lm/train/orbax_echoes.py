"""The echoes of a failed Orbax read or write, kept off the terminal: the Checkpointer reports the failure
itself, in one line.

Orbax runs each read, and each background write, in an asyncio event loop of its own, and closes that loop
as soon as the first error ends the operation, without cancelling or awaiting the rest of it. Left behind on
the closed loop:

- asyncio mirrors of TensorStore futures (and tasks) holding errors nobody retrieves. Whenever they are
  garbage-collected, asyncio reports "Future exception was never retrieved" to the loop's exception handler,
  which by default logs a traceback. That is often only at interpreter exit: Orbax keeps the error of a
  background write, and through its traceback the abandoned tasks, until the manager goes.
- TensorStore operations still in flight. When one ends (or is cancelled when its last reference goes),
  TensorStore hands the result to the closed loop, which raises "Event loop is closed" in TensorStore's
  thread: an unraisable exception, which Python prints.
- Orbax's coroutines suspended in those tasks. When one is garbage-collected Python closes it, running its
  cleanup, which can fail (at interpreter exit, on an import): another unraisable exception.

None of that waits for a moment that can be timed. So when an Orbax operation raises (`settled_on_failure`),
`settle()` ends it at once, while the filter below is in place: each loop Orbax abandoned gets an exception
handler that drops whatever the loop reports from then on, whenever that is; the TensorStore operations its
pending futures wait on are cancelled (TensorStore delivers a cancellation in the calling thread, so the
"Event loop is closed" it meets is dropped here, and nothing of the operation reaches the loop later); and
its suspended coroutines are closed. The one echo it cannot reach is an operation ending on its own during
`settle()` itself, its hand-over already under way in another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator

import tensorstore as ts

_log = logging.getLogger(__name__)

_FILTERED_LOGGERS = ("absl", "asyncio")  # Orbax logs through absl; abandoned operations' tasks through asyncio


def _in_orbax(filename: str) -> bool:
    return "/orbax/" in filename.replace("\\", "/")


def _traceback_in_orbax(error: BaseException | None) -> bool:
    """Whether `error`, or an exception it was raised from, passed through Orbax's own code."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        frame = error.__traceback__
        while frame is not None:
            if _in_orbax(frame.tb_frame.f_code.co_filename):
                return True
            frame = frame.tb_next
        error = error.__cause__ or error.__context__
    return False


def _raised_in_orbax(unraisable) -> bool:
    """Whether an unraisable exception comes from Orbax's own code (its coroutine or its traceback)."""
    code = getattr(unraisable.object, "cr_code", None)
    return (code is not None and _in_orbax(code.co_filename)) or _traceback_in_orbax(unraisable.exc_value)


def _runs_orbax_code(future: asyncio.Future) -> bool:
    code = getattr(future.get_coro(), "cr_code", None) if isinstance(future, asyncio.Task) else None
    return code is not None and _in_orbax(code.co_filename)


def abandoned_orbax_loops(futures: Iterable[asyncio.Future]) -> set[asyncio.AbstractEventLoop]:
    """The closed event loops among `futures`' that ran Orbax's coroutines: loops Orbax left after a failure."""
    return {future.get_loop() for future in futures if future.get_loop().is_closed() and _runs_orbax_code(future)}


def cancel_tensorstore_wait(future: asyncio.Future) -> None:
    """Cancels the TensorStore operation an asyncio future mirrors (its done-callback belongs to it), if any."""
    for callback, *_ in getattr(future, "_callbacks", None) or ():
        operation = getattr(callback, "__self__", None)
        if isinstance(operation, ts.Future):
            operation.cancel()


class _AbandonedLoopReports:
    """Exception handler of an event loop Orbax abandoned after a failure that was reported in one line: what
    the loop reports afterwards (errors never retrieved, tasks destroyed while pending) is an echo of it."""

    def __init__(self, log: logging.Logger):
        self.log = log  # held here: the handler may run at interpreter exit

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        self.log.debug("dropped from an event loop Orbax abandoned: %s", context.get("message"))


class OrbaxEchoes(logging.Filter):
    """Drops the echoes of a failed checkpoint read or write while installed (a Checkpointer's lifetime).

    - Orbax logs a failed background write as a traceback from its worker thread (through absl's logger)
      before `wait_until_finished` raises the same error: records of Orbax's own modules below CRITICAL
      are dropped.
    - Abandoned operations (module docstring) whose echoes arrive before `settle()` adopts their loop: asyncio's
      records of errors that passed through Orbax, and "Event loop is closed" or Orbax's own unraisable
      exceptions, are dropped; every other unraisable exception and asyncio record passes on.

    Both the log filter and the `sys.unraisablehook` are restored by `remove()`. What is dropped is counted
    and logged at debug level.
    """

    def __init__(self):
        super().__init__()
        self.dropped = 0
        self._previous_hook = None
        self._loop_reports = _AbandonedLoopReports(_log)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncio":  # "... exception was never retrieved" for one of Orbax's abandoned reads
            error = record.exc_info[1] if record.exc_info else None
            keep = not (_in_orbax(record.getMessage()) or _traceback_in_orbax(error))
        else:
            keep = not _in_orbax(record.pathname) or record.levelno >= logging.CRITICAL
        self.dropped += not keep
        return keep

    def _unraisable(self, unraisable) -> None:
        if self._previous_hook is None:  # removed, but still chained from a hook installed after this one
            sys.__unraisablehook__(unraisable)
            return
        error = unraisable.exc_value
        if (isinstance(error, RuntimeError) and str(error) == "Event loop is closed") or _raised_in_orbax(unraisable):
            self.dropped += 1
            return
        self._previous_hook(unraisable)

    def install(self) -> None:
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        for name in _FILTERED_LOGGERS:
            logging.getLogger(name).addFilter(self)

    @contextlib.contextmanager
    def settled_on_failure(self) -> Iterator[None]:
        """Settles (below) when the Orbax operation run inside raises, before its error goes on."""
        try:
            yield
        except BaseException:
            self.settle()
            raise

    def settle(self) -> None:
        """After a failed read or write: adopts the event loops Orbax abandoned (module docstring), cancels
        what they still wait on, and finalizes the failed operation's garbage now, while filtered (its "never
        awaited" RuntimeWarnings included: those are ignored here, for this call only)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
            futures = [o for o in gc.get_objects() if issubclass(type(o), asyncio.Future)]
            loops = abandoned_orbax_loops(futures)
            for loop in loops:
                loop.set_exception_handler(self._loop_reports)
            for future in futures:
                if future.get_loop() in loops and not future.done():
                    self._finish(future)
            del futures
            gc.collect()

    def _finish(self, pending: asyncio.Future) -> None:
        """Ends what a pending future of an abandoned loop stands for: a task's coroutine is closed (its
        cleanup runs now, as it would when garbage-collected, and what that raises is dropped); a TensorStore
        operation's mirror has the operation cancelled."""
        if not isinstance(pending, asyncio.Task):
            cancel_tensorstore_wait(pending)
            return
        close = getattr(pending.get_coro(), "close", None)
        try:
            if close is not None:
                close()
        except Exception as error:  # noqa: BLE001 - the cleanup of an operation that already failed
            self.dropped += 1
            _log.debug("closing a coroutine Orbax abandoned raised %r", error)

    def drain(self, timeout_s: float) -> None:
        """Waits up to `timeout_s` in all for Orbax's worker threads still running after a failure, so that what
        they log as they fail (the same error, with a traceback) arrives while the filter is in place."""
        deadline = time.monotonic() + timeout_s
        for thread in threading.enumerate():
            if type(thread).__module__.startswith("orbax.") and thread is not threading.current_thread():
                # threading's join, not Orbax's override, which raises the thread's error again
                threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))

    def remove(self) -> None:
        if self._previous_hook is None:
            return
        if sys.unraisablehook == self._unraisable:  # not replaced by someone else meanwhile
            sys.unraisablehook = self._previous_hook
        self._previous_hook = None
        for name in _FILTERED_LOGGERS:
            logging.getLogger(name).removeFilter(self)
        if self.dropped:
            _log.debug("dropped %d log records / unraisable errors echoing Orbax failures", self.dropped)
