"""Two `fp4lm prepare` runs on one --out: the second is refused while the first holds the directory's lock; and
a prepare killed outright (SIGKILL, no chance to clean up) leaves none of its worker processes running.
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from fp4lm.tokenizer import BPETokenizer
from tests.data.helpers_data import sample_text
from tests.reliability.helpers_reliability import (
    assert_one_line_user_error,
    run_cli_in_process,
    snapshot,
    subprocess_env,
)

pytestmark = pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="reads /proc for child pids")


def _children(pid: int) -> set[int]:
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: the parent's pid
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return (pathlib.Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(condition, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_second_prepare_is_refused_and_a_killed_ones_workers_end(tmp_path):
    BPETokenizer.train(sample_text(300), 400).save(tmp_path / "tok")
    text = sample_text(200)
    lines = "".join(json.dumps({"text": text}) + "\n" for _ in range(3000))  # 2 x 13 MB: a unit of 30 s of BPE
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text(lines)
    out = tmp_path / "out"
    args = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--tokenizer", str(tmp_path / "tok")]
    args += ["--out", str(out), "--progress", "off"]
    # prepare() itself with units of 12 MiB, so the two workers both have work (the command line's are 64 MiB)
    code = (
        "import sys; from fp4lm.data.prepare import Options, prepare; "
        "prepare(sys.argv[1:3], tokenizer=sys.argv[4], out=sys.argv[6], workers=2, progress='off', "
        "options=Options(piece_bytes=12 << 20))"
    )
    first = subprocess.Popen([sys.executable, "-c", code, *args], env=subprocess_env(), stdout=subprocess.DEVNULL)
    try:
        assert _wait(lambda: (out / ".prepare" / "request.json").is_file() and len(_children(first.pid)) >= 2)
        before = snapshot(tmp_path / "tok")
        second = run_cli_in_process("prepare", *args)
        assert_one_line_user_error(second, expect_in=(str(out), "in use by another `fp4lm prepare`"))
        assert snapshot(tmp_path / "tok") == before
        assert first.poll() is None, "the first prepare must still be running for the lock to be tested"
        workers = _children(first.pid)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        # A worker checks twice a second that its parent lives; unchecked, the busy one would finish its unit.
        assert _wait(lambda: not any(_alive(pid) for pid in workers), timeout=8), "workers outlived their parent"
    finally:
        if first.poll() is None:
            first.kill()
