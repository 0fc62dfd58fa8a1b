"""The export's output directory: refused when it holds something (unless --force), written complete or not
at all. Files go into a hidden staging directory beside it, which is renamed into place at the end; what
--force replaces is moved aside (OUT.old-<date-time>), never deleted. A failure removes the staging directory
and leaves the output directory as it was; one left by an export that was killed (SIGKILL, power loss) is
removed by the next export to the same --out from this host."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator

from fp4lm.errors import UserError
from fp4lm.train.run_dir import find_training_run, refuse_inside_training_run
from fp4lm.user_dirs import move_aside, refuse_holding


def check_output_dir(out: str, *, force: bool, run_dir: str) -> pathlib.Path:
    """The output path, after refusing a file, the current directory, a directory that holds or lies inside a
    training run (the one being exported or any other), or a non-empty directory without `force`."""
    path = pathlib.Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file; pass a directory path (it is created)")
    refuse_holding(path, f"--out {out}", protected={"the run being exported": run_dir})
    refuse_inside_training_run(path, f"--out {out}")
    if not path.is_dir() or not any(path.iterdir()):
        return path
    run = find_training_run(path)
    if run is not None:
        raise UserError(f"--out {out} holds the fp4lm training run {run}; choose a new directory for the export")
    if not force:
        raise UserError(
            f"--out {out} is not empty; choose a new or empty directory, or pass --force, which moves its "
            f"contents to {path.name}.old-<date-time>/ beside it"
        )
    return path


@contextlib.contextmanager
def staged_output(path: pathlib.Path, log: Callable[[str], None] = print) -> Iterator[pathlib.Path]:
    """A fresh staging directory to write into; on success it takes the place of `path`, whose old contents
    (if any) are moved aside. On any failure nothing is left behind: the staging directory and the parent
    directories this created are removed, what was moved aside is renamed back, and a failed write (disk
    full, permissions) is one line naming --out."""
    path = path.absolute()
    host = socket.gethostname()
    _remove_abandoned_staging(path, host)
    staging = path.parent / f".{path.name}.export-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    created = _missing_parents(path)
    moved_to = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        yield staging
        if path.is_dir() and any(path.iterdir()):
            moved_to = move_aside(path)
        os.replace(staging, path)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if moved_to is not None and not path.exists():
            os.rename(moved_to, path)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(error, OSError):
            inside = error.filename and pathlib.Path(os.fsdecode(error.filename)).is_relative_to(staging)
            where = f" ({error.filename})" if error.filename and not inside else ""  # not the hidden staging
            raise UserError(
                f"cannot write the export to --out {path}{where}: {error.strerror or error}; nothing was written: "
                "free disk space or choose a writable --out"
            ) from None
        raise
    if moved_to is not None:
        log(f"moved the old contents of {path} to {moved_to}")


def _remove_abandoned_staging(path: pathlib.Path, host: str) -> None:
    """Removes the staging directories of exports to `path` from this host whose process is gone. (Another
    host's are left alone: its process ids mean nothing here.)"""
    prefix = f".{path.name}.export-{host}-"
    try:
        entries = [e for e in path.parent.iterdir() if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        return
    for entry in entries:
        pid = entry.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _missing_parents(path: pathlib.Path) -> pathlib.Path | None:
    """The top-most missing directory above `path` (what creating its parent makes), None when it exists."""
    missing = [parent for parent in path.parents if not parent.exists()]
    return missing[-1] if missing else None
