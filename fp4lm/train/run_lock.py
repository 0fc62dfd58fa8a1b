"""One trainer per run directory: two would interleave metrics.jsonl and race for the same checkpoints.

The lock is an advisory `flock` on RUN_DIR/.fp4lm-train.lock, held for the whole run. The operating system
drops it when the process ends, however it ends (kill -9 included), so a stale lock never blocks a restart.
`fp4lm eval` and `fp4lm sample` only read, and take no lock.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

from fp4lm.errors import UserError

LOCK_FILE = ".fp4lm-train.lock"


class RunDirLock:
    def __init__(self, run_dir: pathlib.Path, *, run_dir_setting: str, create: bool = True):
        """`create=False`: only a lock file that exists is taken (a directory without one is in no one's use)."""
        self.path = pathlib.Path(run_dir) / LOCK_FILE
        self.setting = run_dir_setting
        self.create = create
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        if not self.create and not self.path.is_file():
            return self
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if self.create else 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"train.run_dir={self.setting} is in use by another `fp4lm train`; wait for it to finish, "
                "stop it, or choose another train.run_dir"
            ) from None
        self._fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
