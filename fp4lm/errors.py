"""Errors a user can cause. The CLI prints them as one line and exits with their code; no traceback."""


class UserError(ValueError):
    """A mistake in the user's input (config, data, shapes, command line). Message: the problem, then the fix.

    An ordinary ``ValueError`` to library callers; the CLI prints it as one line and exits with `exit_code`.
    """

    exit_code = 2


class TrainingDiverged(Exception):
    """Training cannot continue (e.g. too many consecutive non-finite steps)."""

    exit_code = 3
