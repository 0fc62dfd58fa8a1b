"""Errors a user can cause, and the exit codes of the `fp4lm` command (their one home).

The CLI prints a `UserError` or `TrainingDiverged` as one line and exits with its code; no traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_OK = 0
EXIT_USER_ERROR = 2  # a mistake in a config, a flag or the data: one line "error: <problem>; <fix>"
EXIT_DIVERGED = 3  # training cannot continue (too many consecutive non-finite steps)
EXIT_INTERRUPTED = 130  # Ctrl-C; a training run resumes from its latest checkpoint
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): the run finished its step and saved a checkpoint first
# The reader of stdout went away (`fp4lm project ... | head -2`): no message, and the status a shell reports for
# `cat` killed by SIGPIPE (128 + 13), so `set -o pipefail` scripts see the same as with any other tool.
EXIT_BROKEN_PIPE = 141


class UserError(ValueError):
    """A mistake in the user's input (config, data, shapes, command line). Message: the problem, then the fix.

    An ordinary ``ValueError`` to library callers; the CLI prints it as one line and exits with `exit_code`.
    Library code that does not know how its caller names a setting (fp4lm.data: `path`, `seq_len`, ...)
    says so in words and lists the parameter names in `settings`; the config layer names the keys
    (`fp4lm.config.describe_error`).
    """

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, *, settings: Sequence[str] = ()):
        super().__init__(message)
        self.settings = tuple(settings)


class TrainingDiverged(Exception):
    """Training cannot continue (e.g. too many consecutive non-finite steps)."""

    exit_code = EXIT_DIVERGED


class Terminated(Exception):
    """SIGTERM stopped a training run after it finished a step and saved it; the message says where."""

    exit_code = EXIT_TERMINATED
