"""`python -m tests.reliability.disk_full_launcher RUN_DIR STEP -- ARGS...` runs `fp4lm ARGS` on a disk that
fills up the moment the checkpoint of step STEP (or later) starts being written: from then on every file or
directory Python creates under RUN_DIR fails with ENOSPC, as on a full disk.

It uses an audit hook (sys.addaudithook), which sees every `open` and `os.mkdir` of the process, Orbax's
background writer threads included, without replacing any function.
"""

from __future__ import annotations

import errno
import os
import re
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def install(run_dir: str, full_from_step: int) -> None:
    root = os.path.realpath(run_dir)
    pending = re.compile(r"/checkpoints/(\d+)\.orbax-checkpoint-tmp")
    state = {"full": False}

    def hook(event: str, args: tuple) -> None:
        if event not in ("open", "os.mkdir") or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(os.fspath(args[0]))
        if not os.path.realpath(path).startswith(root + os.sep):
            return
        if event == "open":
            mode, flags = args[1], args[2]
            writes = (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & WRITE_FLAGS)
            if not writes:
                return
        match = pending.search(path)
        if match and int(match.group(1)) >= full_from_step:
            state["full"] = True
        if state["full"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    sys.addaudithook(hook)


def main() -> None:
    run_dir, step, separator, *args = sys.argv[1:]
    assert separator == "--", sys.argv
    install(run_dir, int(step))
    from fp4lm import cli

    cli.main(args)


if __name__ == "__main__":
    main()
