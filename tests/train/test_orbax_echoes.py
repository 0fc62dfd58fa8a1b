"""What a failed Orbax operation leaves on its closed event loop stays silent however late it ends or is
garbage-collected, and the same leftovers of anyone else's code are reported as usual."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time

import pytest
import tensorstore as ts

from fp4lm.train.orbax_echoes import OrbaxEchoes

# A save shaped like Orbax's: writes gathered, one fails, the loop is closed under the others (asyncio_utils.run_sync).
SAVE = """
import asyncio

async def write(tensorstore_future):
    try:
        await tensorstore_future
    finally:
        release_bytes()

def release_bytes():  # as Orbax's failed when its coroutine was closed at interpreter exit
    raise ImportError("sys.meta_path is None, Python is likely shutting down")

async def write_that_fails():
    raise ValueError("RESOURCE_EXHAUSTED: No space left on device")

async def save(tensorstore_future, leftovers):
    unretrieved = asyncio.get_running_loop().create_future()
    unretrieved.set_exception(ValueError("RESOURCE_EXHAUSTED: No space left on device"))
    leftovers.append(unretrieved)
    await asyncio.gather(write(tensorstore_future), write_that_fails())
"""


def _failed_save(filename: str, echoes: OrbaxEchoes) -> tuple[ts.Promise, list]:
    """Runs SAVE (as if defined in `filename`) until it fails; returns the promise of the write left waiting
    and the leftovers (a future with an error nobody retrieves)."""
    scope: dict = {}
    exec(compile(SAVE, filename, "exec"), scope)
    promise, tensorstore_future = ts.Promise.new()
    leftovers: list = []
    with pytest.raises(ValueError), echoes.settled_on_failure():
        _run_sync(scope["save"](tensorstore_future, leftovers))
    return promise, leftovers


def _run_sync(coroutine) -> None:
    """As Orbax runs a coroutine: in a loop of its own, closed when the coroutine ends, whatever it left."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(coroutine)
    finally:
        loop.close()


@pytest.fixture
def reported(monkeypatch, caplog):
    """What reaches the user after the filter is gone: unraisable exceptions and asyncio's error records."""
    unraisable: list[str] = []  # as text: holding the exception would keep what it refers to alive
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(f"unraisable {u.exc_value!r}"))
    caplog.set_level(logging.ERROR, logger="asyncio")

    def seen() -> list[str]:
        return unraisable + [r.getMessage() for r in caplog.records if r.name == "asyncio"]

    return seen


def _end_after_the_filter(promise: ts.Promise, leftovers: list) -> None:
    """The waiting write ends (TensorStore hands its result to the closed loop) and the leftovers die, both
    after the filter was removed, as at interpreter exit."""
    promise.set_exception(ValueError("the write ends late"))
    leftovers.clear()
    gc.collect()


def test_an_abandoned_orbax_save_is_silent_after_the_filter_is_removed(reported):
    echoes = OrbaxEchoes()
    echoes.install()
    try:
        promise, leftovers = _failed_save("/site-packages/orbax/checkpoint/_src/serialization/fake.py", echoes)
    finally:
        echoes.remove()
    _end_after_the_filter(promise, leftovers)
    assert reported() == []


def test_the_same_leftovers_of_other_code_are_reported_as_usual(reported):
    echoes = OrbaxEchoes()
    echoes.install()
    try:
        promise, leftovers = _failed_save("/home/user/my_training_loop.py", echoes)
    finally:
        echoes.remove()
    _end_after_the_filter(promise, leftovers)
    seen = reported()
    assert "unraisable RuntimeError('Event loop is closed')" in seen, seen
    assert any(line.startswith("unraisable ImportError('sys.meta_path is None") for line in seen), seen
    assert any(line.startswith("Future exception was never retrieved") for line in seen), seen


def test_a_worker_thread_failing_after_the_save_reports_while_the_filter_is_in_place(capsys):
    """Orbax's worker thread logs its failure with a traceback when it ends (absl's logger, from Orbax's own
    file); after a failed save, `drain` waits for it, so the record meets the filter, not the terminal."""
    from orbax.checkpoint._src.futures.future import _SignalingThread

    def write_that_fails_late():
        time.sleep(0.3)
        raise ValueError("RESOURCE_EXHAUSTED: No space left on device")

    echoes = OrbaxEchoes()
    echoes.install()
    worker = _SignalingThread(target=write_that_fails_late, send_signals=[], receive_signals=[])
    worker.start()
    echoes.drain(timeout_s=10)
    echoes.remove()
    assert not worker.is_alive()
    assert "Traceback" not in capsys.readouterr().err
    assert echoes.dropped >= 1
