"""How the report tests run `fp4lm compare`: through the command line's own dispatch, in this process."""

from fp4lm import cli


def main_compare(argv: list[str]) -> int:
    """`fp4lm compare ARGV`: the exit code; a user mistake raises UserError (the CLI prints it as one line)."""
    return cli.run(["compare", *argv])
