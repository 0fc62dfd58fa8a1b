"""An advisory, exclusive `flock` on a file, held while a `with` block runs: one process at a time in a
directory. The operating system drops it when the process ends, however it ends (kill -9 included), so a stale
lock never blocks anyone. Used by training (fp4lm/train/run_lock.py) and by `fp4lm prepare`."""

from __future__ import annotations

import fcntl
import os
import pathlib

from fp4lm.errors import UserError


class FileLock:
    def __init__(self, path: str | os.PathLike, busy_message: str, *, create: bool = True):
        """`path`: a file (created unless `create=False`: then only one that exists is taken, a directory without
        one being in no one's use) or a directory (locked itself). `busy_message`: the UserError when another
        process holds it."""
        self.path = pathlib.Path(path)
        self.busy_message = busy_message
        self.create = create
        self._fd: int | None = None

    def __enter__(self):
        if not self.create and not self.path.is_file():
            return self
        flags = os.O_RDONLY if self.path.is_dir() else os.O_RDWR | (os.O_CREAT if self.create else 0)
        fd = os.open(self.path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(self.busy_message) from None
        self._fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
