"""One trainer per run directory: two would interleave metrics.jsonl and race for the same checkpoints.

The lock is an advisory `flock` on RUN_DIR/.fp4lm-train.lock (fp4lm/file_lock.py), held for the whole run; the
operating system drops it when the process ends, however it ends. `fp4lm eval` and `fp4lm sample` only read,
and take no lock.
"""

from __future__ import annotations

import pathlib

from fp4lm.file_lock import FileLock

LOCK_FILE = ".fp4lm-train.lock"


class RunDirLock(FileLock):
    def __init__(self, run_dir: pathlib.Path, *, run_dir_setting: str, create: bool = True):
        """`create=False`: only a lock file that exists is taken (a directory without one is in no one's use)."""
        busy = (
            f"train.run_dir={run_dir_setting} is in use by another `fp4lm train`; wait for it to finish, "
            "stop it, or choose another train.run_dir"
        )
        super().__init__(pathlib.Path(run_dir) / LOCK_FILE, busy, create=create)
        self.setting = run_dir_setting
