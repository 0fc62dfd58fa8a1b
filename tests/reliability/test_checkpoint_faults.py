"""A damaged newest checkpoint is detected, reported in one line and the previous one is used; the run then
replaces it, so the damage does not outlive the recovery. Re-running a finished run changes nothing."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest

from tests.reliability.conftest import REFERENCE_STEPS, reference_overrides
from tests.reliability.helpers_reliability import (
    assert_one_line_user_error,
    assert_states_bit_equal,
    committed_steps,
    eval_records,
    restore_checkpoint,
    run_cli,
    snapshot,
    summary_fields,
    train_records,
)

pytestmark = pytest.mark.slow

LATEST, PREVIOUS = REFERENCE_STEPS, REFERENCE_STEPS - 1  # the reference keeps steps 36, 39 and 40


def _largest_array_file(step_dir: pathlib.Path) -> pathlib.Path:
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in p.as_posix()]
    return max(files, key=lambda p: p.stat().st_size)


def truncate_array_file(step_dir: pathlib.Path) -> None:
    path = _largest_array_file(step_dir)
    os.truncate(path, path.stat().st_size // 2)


def garble_array_bytes(step_dir: pathlib.Path) -> None:
    """Flips 64 bytes in the middle of the array data: the file keeps its size and its framing."""
    path = _largest_array_file(step_dir)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def garble_json_item(step_dir: pathlib.Path) -> None:
    path = step_dir / "data_iter" / "metadata"
    path.write_text(path.read_text()[:15])


def delete_state_metadata(step_dir: pathlib.Path) -> None:
    (step_dir / "state" / "_METADATA").unlink()


@pytest.mark.parametrize(
    "damage",
    [truncate_array_file, garble_array_bytes, garble_json_item, delete_state_metadata],
    ids=lambda f: f.__name__,
)
def test_damaged_latest_checkpoint_falls_back_and_is_replaced(
    damage, copy_reference, reference_run, corpus, compile_cache
):
    run_dir = copy_reference()
    damage(run_dir / "checkpoints" / str(LATEST))

    result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir))
    assert result.code == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    reports = [line for line in output.splitlines() if f"checkpoint at step {LATEST}" in line]
    assert len(reports) == 1, output[-3000:]
    assert "unusable" in reports[0] and f"falling back to step {PREVIOUS}" in reports[0], reports[0]
    assert f"resuming from step {PREVIOUS}" in output

    # Retraining the lost step gives the reference's numbers, and a sound checkpoint replaces the damaged one.
    assert train_records(run_dir) == train_records(reference_run)
    assert eval_records(run_dir) == eval_records(reference_run)
    assert summary_fields(run_dir) == summary_fields(reference_run)
    assert committed_steps(run_dir)[-1] == LATEST
    assert_states_bit_equal(
        restore_checkpoint(run_dir, LATEST)["state"], restore_checkpoint(reference_run, LATEST)["state"]
    )


def test_rerunning_a_finished_run_changes_nothing(copy_reference, corpus, compile_cache):
    run_dir = copy_reference()
    # The copy's config.json names the reference's run_dir; give it this one, as a rerun in place would see.
    config = json.loads((run_dir / "config.json").read_text())
    config["train"]["run_dir"] = str(run_dir)
    (run_dir / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    before = snapshot(run_dir)
    result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir))
    assert result.code == 0, result.stderr[-3000:]
    assert "already finished" in result.stdout + result.stderr
    after = snapshot(run_dir)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert changed == [], f"a finished run's files changed: {changed}"


def test_killed_after_the_final_checkpoint_before_the_summary(copy_reference, reference_run, corpus, compile_cache):
    run_dir = copy_reference()
    (run_dir / "summary.json").unlink()
    result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir))
    assert result.code == 0, result.stderr[-3000:]
    assert summary_fields(run_dir) == summary_fields(reference_run)
    assert train_records(run_dir) == train_records(reference_run)
    assert eval_records(run_dir) == eval_records(reference_run)


def test_no_usable_checkpoint_refuses_to_start_over_and_keeps_everything(copy_reference, corpus, compile_cache):
    """Every checkpoint damaged: starting afresh would throw the run away (and its metrics with it). The run
    must stop with one line instead, deleting nothing."""
    run_dir = copy_reference()
    for step in committed_steps(run_dir):
        truncate_array_file(run_dir / "checkpoints" / str(step))
    before = snapshot(run_dir)
    result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir))
    assert_one_line_user_error(result, expect_in=("checkpoint",))
    after = snapshot(run_dir)
    lost = sorted(name for name in before if after.get(name) != before[name])
    assert not lost, f"files lost or changed: {lost[:5]} ..."


def test_checkpoints_without_a_fingerprint_still_restore(copy_reference, reference_run, corpus, compile_cache):
    """Checkpoints written before fingerprints existed (no `fingerprint` item) are read, not thrown away."""
    run_dir = copy_reference()
    for step in committed_steps(run_dir):
        shutil.rmtree(run_dir / "checkpoints" / str(step) / "fingerprint", ignore_errors=True)
    (run_dir / "summary.json").unlink()  # so the run restores its last checkpoint and finishes again
    steps_before = committed_steps(run_dir)
    result = run_cli("train", *reference_overrides(corpus, compile_cache, run_dir))
    assert result.code == 0, result.stderr[-3000:]
    assert "unusable" not in result.stdout + result.stderr
    assert committed_steps(run_dir) == steps_before
    assert summary_fields(run_dir) == summary_fields(reference_run)
