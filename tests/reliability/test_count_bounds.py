"""Counts beyond what there is are clamped with a note, never silently: `fp4lm eval
--batches N` past the validation data evaluates all of it and says so. (Counts with an upper bound are refused
in the catalogue: bad_inputs.py.)"""

from __future__ import annotations

from tests.reliability.helpers_reliability import run_cli_in_process, snapshot


def test_eval_batches_beyond_the_validation_data_are_clamped_with_a_note(reference_run):
    before = snapshot(reference_run)
    done = run_cli_in_process("eval", str(reference_run), "--batches", "100000")
    assert done.code == 0, done.stderr[-3000:]
    assert "val_loss" in done.stdout
    assert "note: --batches 100,000: the validation data holds" in done.stderr and "evaluated all" in done.stderr
    assert snapshot(reference_run) == before
