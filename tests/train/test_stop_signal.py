"""SIGTERM during a run only sets a flag, and only inside the block."""

import os
import signal
import threading

import pytest

from fp4lm.train.stop_signal import sigterm_requests_stop


def _previous_handler(signum, frame):
    raise AssertionError("the handler outside the block must not run inside it")


def test_sigterm_inside_the_block_is_a_request_and_the_handler_is_restored():
    before = signal.signal(signal.SIGTERM, _previous_handler)
    try:
        with sigterm_requests_stop() as stop:
            assert not stop.requested
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested
        assert signal.getsignal(signal.SIGTERM) is _previous_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_handler_is_restored_after_an_error():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError), sigterm_requests_stop():
        assert signal.getsignal(signal.SIGTERM) is not before
        raise RuntimeError("boom")
    assert signal.getsignal(signal.SIGTERM) is before


def test_nothing_is_installed_when_disabled_or_off_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_requests_stop(enabled=False):
        assert signal.getsignal(signal.SIGTERM) is before
    seen = []

    def worker():
        with sigterm_requests_stop() as stop:
            seen.append((signal.getsignal(signal.SIGTERM), stop.requested))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [(before, False)]
