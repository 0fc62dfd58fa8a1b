"""Directories a user names (`train.run_dir`, `export --out`, `compare --out`): fp4lm never deletes one.

`--force` (train, export, compare) renames what is there to DIR.old-<YYYYmmdd-HHMMSS> beside it
(`move_aside`) and starts afresh; a directory that holds the current directory, or the run being read,
is never moved (`refuse_holding`), since the shell or the command itself would lose its footing.
"""

from __future__ import annotations

import os
import pathlib
import time

from fp4lm.errors import UserError


def move_aside(path: str | os.PathLike) -> pathlib.Path:
    """Renames `path` to PATH.old-<YYYYmmdd-HHMMSS> (with -2, -3, ... when taken); returns the new name."""
    path = pathlib.Path(os.path.abspath(path))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, number = path.with_name(f"{path.name}.old-{stamp}"), 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.old-{stamp}-{number}")
    os.rename(path, target)
    return target


def holds(directory: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether `path` is `directory` or lies inside it (symbolic links resolved)."""
    return pathlib.Path(path).resolve().is_relative_to(pathlib.Path(directory).resolve())


def refuse_holding(directory: str | os.PathLike, flag: str, *, protected: dict[str, str | os.PathLike]) -> None:
    """A one-line UserError when `directory` (named by `flag`, e.g. "--out runs/x") is or holds the current
    directory or one of `protected` (a description -> a path, e.g. {"the run being exported": run_dir})."""
    for what, path in {"the current directory": pathlib.Path.cwd(), **protected}.items():
        if holds(directory, path):
            raise UserError(f"{flag} is or holds {what}, which fp4lm will not replace; name a directory of its own")
