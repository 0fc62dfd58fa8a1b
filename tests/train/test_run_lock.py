"""One trainer per run directory; the lock goes away with its holder."""

import subprocess
import sys

import pytest

from fp4lm.errors import UserError
from fp4lm.train.run_lock import LOCK_FILE, RunDirLock


def test_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    with (
        RunDirLock(tmp_path, run_dir_setting="runs/x"),  # held while a second holder tries
        pytest.raises(UserError, match=r"train.run_dir=runs/x is in use by another `fp4lm train`"),
        RunDirLock(tmp_path, run_dir_setting="runs/x"),
    ):
        pass
    with RunDirLock(tmp_path, run_dir_setting="runs/x"):  # released: free again
        pass
    assert (tmp_path / LOCK_FILE).exists()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from fp4lm.train.run_lock import RunDirLock; "
            f"lock = RunDirLock({str(tmp_path)!r}, run_dir_setting='r').__enter__(); print('held', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError):
        RunDirLock(tmp_path, run_dir_setting="r").__enter__()
    holder.kill()
    holder.wait()
    holder.stdout.close()
    with RunDirLock(tmp_path, run_dir_setting="r"):
        pass
