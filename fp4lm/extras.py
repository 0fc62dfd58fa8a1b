"""Optional dependencies: each heavy package only some commands need belongs to an extra of the fp4lm package.

    report       matplotlib     the PNG plots of `fp4lm compare`
    progress     rich           the progress bar (`metrics.progress=auto` falls back to plain lines without it)
    tensorboard  tensorboardX   TensorBoard event files next to metrics.jsonl
    sentencepiece sentencepiece data.tokenizer=<a SentencePiece .model>
    all          all of the above (the `dev` extra, which `make` installs, includes it)

`require` imports one where it is needed, so that a missing extra stops only the command that needs it, with
the pip command that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from fp4lm.errors import UserError


def install_hint(extra: str) -> str:
    """The command that installs `extra` (quoted for the shell: the brackets are glob characters)."""
    return f"pip install 'fp4lm[{extra}]'"


def require(module: str, extra: str, *, purpose: str) -> ModuleType:
    """Import `module` (e.g. "matplotlib.figure") or raise a UserError naming the extra that provides it.

    `purpose` says what needs it, e.g. "drawing the comparison's plots". Only a missing module counts: an
    installed package that fails while importing raises its own error.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top_level = module.partition(".")[0]
        if error.name is not None and error.name.partition(".")[0] != top_level:
            raise  # the package is there, but something it imports is not: its own error says more
        raise UserError(
            f"{purpose} needs the Python package {top_level!r}, which is not installed; "
            f"install the {extra!r} extra: {install_hint(extra)}"
        ) from error


def available(module: str) -> bool:
    """Whether `module` can be imported (for optional features that fall back, e.g. the rich progress bar)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        return False
    return True
