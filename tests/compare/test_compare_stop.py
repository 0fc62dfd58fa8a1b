"""Stopping `fp4lm compare` stops its training child: SIGTERM (or Ctrl-C) reaches the child, which saves and
stops, and its last lines still reach the user. Before, the child trained on alone (or waited on a closed pipe)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A stand-in for `fp4lm train`: prints a step every 50 ms; on SIGTERM prints where it saved and exits 143.
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    def stop(signum, frame):
        print("terminated by SIGTERM; saved a checkpoint", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("child pid", __import__("os").getpid(), flush=True)
    for step in range(2000):
        print("step", step, flush=True)
        time.sleep(0.05)
    """
)

# The comparison's side: run the child through the runner, as comparison.py does.
PARENT = textwrap.dedent(
    """
    import pathlib, signal, sys
    from fp4lm.compare import runner
    # As in a terminal: a process that pytest-xdist (or nohup, or `&`) started may inherit SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        runner.run_training([sys.executable, "-c", sys.argv[1]], pathlib.Path(sys.argv[2]))
    except KeyboardInterrupt:
        print("parent interrupted", flush=True)
        sys.exit(130)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_compare_stops_its_training_child(tmp_path, signum):
    log = tmp_path / "run.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(log)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert parent.stdout is not None
    first = [parent.stdout.readline() for _ in range(4)]  # the child's pid, then steps 0-2, echoed by the parent
    child_pid = int(first[0].split()[-1])
    parent.send_signal(signum)  # the parent only, as `kill PID` or a scheduler's first signal does
    output, _ = parent.communicate(timeout=60)
    assert parent.returncode == 130
    assert output.index("terminated by SIGTERM; saved a checkpoint") < output.index("parent interrupted")
    assert "saved a checkpoint" in log.read_text()
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child_pid)
