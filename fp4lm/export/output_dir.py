"""The export's output directory: refused when it holds something (unless --force), written complete or not
at all. Files go into a hidden staging directory beside it, which is renamed into place at the end; a
failure removes the staging directory and leaves an existing output directory as it was."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import uuid
from collections.abc import Iterator

from fp4lm.errors import UserError


def check_output_dir(out: str, *, force: bool) -> pathlib.Path:
    """The output path, after refusing a file, or a non-empty directory without `force`."""
    path = pathlib.Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file; pass a directory path (it is created)")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise UserError(f"--out {out} is not empty; choose a new or empty directory, or pass --force to replace it")
    return path


@contextlib.contextmanager
def staged_output(path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A fresh staging directory to write into; on success it replaces `path` (whose contents are deleted)."""
    path = path.absolute()
    staging = path.parent / f".{path.name}.export-{uuid.uuid4().hex[:8]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if path.exists():
        shutil.rmtree(path)
    os.replace(staging, path)
