"""What the pytest-xdist workers of one session share: a directory, and a lock to build a thing in it once.

A costly module fixture (a subprocess on 8 fake devices) is otherwise built by every worker that runs one of
its tests: `--dist loadgroup` cannot keep a module on one worker under pytest 9 (xdist 3.8 renames the tests'
`_nodeid`, which pytest 9 no longer reads), so the fixtures share their result through a file instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
from collections.abc import Callable


def shared_dir(tmp_path_factory, name: str) -> pathlib.Path:
    """A directory shared by all xdist workers of this session (their basetemps' parent)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    return root


class BlockingLock:
    """An exclusive flock on a file: one worker builds a shared artefact, the others wait for it (unlike
    fp4lm.file_lock.FileLock, which refuses at once when the lock is held)."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __enter__(self):
        self.handle = self.path.open("w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def computed_once(tmp_path_factory, name: str, compute: Callable[[], dict]) -> dict:
    """`compute()` (JSON-able) run by the first worker that asks, read back by the others."""
    root = shared_dir(tmp_path_factory, f"fp4lm_{name}")
    with BlockingLock(root / "result.lock"):
        path = root / "result.json"
        if not path.is_file():
            path.write_text(json.dumps(compute()))
        return json.loads(path.read_text())
