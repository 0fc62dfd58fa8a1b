"""Errors a user can cause. The CLI prints them as one line and exits with their code; no traceback."""


class UserError(Exception):
    """A mistake in the user's input (config, data, command line). Message: the problem, then the fix."""

    exit_code = 2


class TrainingDiverged(Exception):
    """Training cannot continue (e.g. too many consecutive non-finite steps)."""

    exit_code = 3
