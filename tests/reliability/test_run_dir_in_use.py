"""Starting a second `fp4lm train` on a run directory that a running trainer uses is refused in one line:
two writers would interleave metrics.jsonl and race for the same checkpoint steps."""

from __future__ import annotations

from tests.reliability.conftest import reference_overrides
from tests.reliability.helpers_reliability import (
    TrainProcess,
    assert_one_line_user_error,
    metrics_records,
    run_cli,
)


def test_second_trainer_on_the_same_run_dir_is_refused(reference_run, corpus, compile_cache, tmp_path):
    """(reference_run: its compiled programs are in the shared cache by then.)"""
    run_dir = tmp_path / "run"
    args = reference_overrides(corpus, compile_cache, run_dir)
    first = TrainProcess(args, tmp_path, 1)
    try:
        assert first.wait_for(lambda: first.resumed_from() is not None, poll_s=0.05), first.stderr_path.read_text()
        line = assert_one_line_user_error(run_cli("train", *args), expect_in=("train.run_dir",))
        assert "in use" in line or "another" in line, line
        assert first.running(), "the first trainer must be left alone"
    finally:
        first.kill()
    steps = [r["step"] for r in metrics_records(run_dir) if "loss" in r]
    assert steps == sorted(set(steps)), "metrics.jsonl holds duplicate steps"
