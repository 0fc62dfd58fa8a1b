"""The trained runs these tests read (tests/trained_runs.py)."""

from tests.trained_runs import moe_run, trained_run

__all__ = ["moe_run", "trained_run"]
