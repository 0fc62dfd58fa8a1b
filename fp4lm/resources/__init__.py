"""Files shipped inside the package: the bundled corpus and the default run's config.

A config names a bundled corpus as `bundled:<name>` (e.g. `data.path=bundled:shakespeare`), which means the
same file from any working directory and any install (editable or not); `data_file` turns a data path into the
file to read. `DEFAULT_CONFIG` is what `fp4lm train` trains when given no arguments (`make run`);
configs/default.yaml in the repository is a link to it.
"""

from __future__ import annotations

import importlib.resources
import pathlib

from fp4lm.errors import UserError

BUNDLED_PREFIX = "bundled:"
# name -> file in this package
BUNDLED_CORPORA = {"shakespeare": "shakespeare.txt.xz"}
DEFAULT_CONFIG_NAME = "default.yaml"


def _packaged(filename: str) -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files(__package__) / filename))


def default_config() -> pathlib.Path:
    """The packaged default config (the quick CPU run)."""
    return _packaged(DEFAULT_CONFIG_NAME)


def is_bundled(path: str) -> bool:
    return path.startswith(BUNDLED_PREFIX)


def check_bundled_name(path: str) -> None:
    """A `bundled:<name>` path must name a corpus shipped with the package."""
    name = path.removeprefix(BUNDLED_PREFIX)
    if name not in BUNDLED_CORPORA:
        raise UserError(
            f"unknown bundled corpus {path!r}; bundled corpora: "
            + ", ".join(BUNDLED_PREFIX + known for known in BUNDLED_CORPORA),
            settings=("path",),
        )


def data_file(path: str) -> pathlib.Path:
    """The file or directory a data path names: a bundled corpus, or the path itself."""
    if not is_bundled(path):
        return pathlib.Path(path)
    check_bundled_name(path)
    return _packaged(BUNDLED_CORPORA[path.removeprefix(BUNDLED_PREFIX)])
