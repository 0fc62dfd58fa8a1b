"""A disk that fills up in the middle of a run: one line naming the problem and the fix, exit code 2, no
traceback; the checkpoints written before stay usable and the run, restarted with space, finishes exactly
as an uninterrupted run. (Disk full when starting is in test_bad_inputs.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.reliability.conftest import reference_overrides
from tests.reliability.helpers_reliability import (
    REPO,
    Result,
    assert_one_line_user_error,
    assert_state_finite,
    checkpoint_step_of,
    committed_steps,
    eval_records,
    fp4lm_command,
    restore_checkpoint,
    run_cli,
    subprocess_env,
    summary_fields,
    train_records,
)

pytestmark = pytest.mark.slow

FULL_FROM_STEP = 6  # the reference run saves every 3 steps: step 3 is saved, step 6 finds the disk full
EXIT_WITHIN_S = 150  # a run that failed must also end: not wait for its background writers for minutes


def _train_on_filling_disk(run_dir, args: list[str]) -> Result:
    command = [
        sys.executable,
        "-m",
        "tests.reliability.disk_full_launcher",
        str(run_dir),
        str(FULL_FROM_STEP),
        "--",
        "train",
        *args,
    ]
    return _run_until_exit(command)


def _run_until_exit(command: list[str]) -> Result:
    try:
        done = subprocess.run(
            command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=EXIT_WITHIN_S
        )
    except subprocess.TimeoutExpired as timeout:
        err = timeout.stderr.decode() if isinstance(timeout.stderr, bytes) else (timeout.stderr or "")
        raise AssertionError(
            f"fp4lm did not exit within {EXIT_WITHIN_S} s of starting; stderr so far: {err[-1500:]}"
        ) from None
    return Result(done.returncode, done.stdout, done.stderr)


def _assert_earlier_checkpoints_usable(run_dir) -> int:
    steps = committed_steps(run_dir)
    assert steps and steps[-1] < FULL_FROM_STEP, steps
    restored = restore_checkpoint(run_dir, steps[-1])
    assert checkpoint_step_of(restored) == steps[-1]
    assert_state_finite(restored["state"])
    return steps[-1]


def test_disk_full_during_a_checkpoint_save(reference_run, corpus, compile_cache, tmp_path):
    run_dir = tmp_path / "run"
    args = reference_overrides(corpus, compile_cache, run_dir)
    line = assert_one_line_user_error(_train_on_filling_disk(run_dir, args), expect_in=("no space left",))
    assert "free disk space" in line or "another train.run_dir" in line
    assert _assert_earlier_checkpoints_usable(run_dir) == FULL_FROM_STEP - 3

    # Space again: the same command resumes and ends exactly where an uninterrupted run does.
    result = run_cli("train", *args)
    assert result.code == 0, result.stderr[-3000:]
    assert train_records(run_dir) == train_records(reference_run)
    assert eval_records(run_dir) == eval_records(reference_run)
    assert summary_fields(run_dir) == summary_fields(reference_run)


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 900 kB tmpfs (the start of a run plus one checkpoint fit, the second does not); root only."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=900k", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def test_real_disk_full_during_a_checkpoint_save(tiny_filesystem, reference_run, corpus, compile_cache):
    """The same on a real full file system, where TensorStore (C++) hits ENOSPC writing array data."""
    run_dir = tiny_filesystem / "run"
    result = _run_until_exit(fp4lm_command("train", *reference_overrides(corpus, compile_cache, run_dir)))
    line = assert_one_line_user_error(result, expect_in=("no space left",))
    assert "free disk space" in line or "another train.run_dir" in line
    steps = committed_steps(run_dir)
    assert steps, "not even the first checkpoint fitted: make the tmpfs larger"
    restored = restore_checkpoint(run_dir, steps[-1])
    assert checkpoint_step_of(restored) == steps[-1]
