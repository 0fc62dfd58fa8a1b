"""A run directory whose files were damaged after training: `fp4lm eval` and
`fp4lm export` answer one line naming the damaged checkpoint or file and a fix that applies to them (not a
training setting), never a library traceback, and change nothing."""

from __future__ import annotations

import pathlib

import pytest

from tests.reliability.helpers_reliability import assert_one_line_user_error, run_cli_in_process, snapshot

pytestmark = pytest.mark.slow


def _steps(run: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())


def _cut_arrays(run: pathlib.Path, step: int) -> None:
    """Truncates the TensorStore data files of checkpoint `step`'s train state to half their size."""
    for data in (run / "checkpoints" / str(step) / "state").rglob("d/*"):
        content = data.read_bytes()
        data.write_bytes(content[: len(content) // 2])


def test_damaged_checkpoints_are_named_and_nothing_changes(copy_reference, tmp_path):
    run = copy_reference()
    steps = _steps(run)
    for step in steps:
        _cut_arrays(run, step)
    before = snapshot(run)
    line = assert_one_line_user_error(run_cli_in_process("eval", str(run)), expect_in=("every checkpoint", "damaged"))
    assert f"checkpoints/{steps[-1]}" in line and "restore the run directory" in line and "train.run_dir" not in line
    out = tmp_path / "exported"
    done = run_cli_in_process("export", str(run), "--format", "hf", "--out", str(out), "--step", str(steps[-1]))
    line = assert_one_line_user_error(done, expect_in=(f"step {steps[-1]} is damaged", "--step"))
    assert ", ".join(map(str, steps[:-1])) in line
    assert snapshot(run) == before and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".exported")]  # no staging copy either


def test_a_damaged_newest_checkpoint_falls_back_with_a_note(copy_reference):
    run = copy_reference()
    steps = _steps(run)
    _cut_arrays(run, steps[-1])
    done = run_cli_in_process("eval", str(run))
    assert done.code == 0, done.stderr[-3000:]
    assert f"step {steps[-2]} val_loss" in done.stdout
    assert f"checkpoints/{steps[-1]} (" in done.stderr and "damaged; using step" in done.stderr


def test_a_damaged_tokenizer_of_the_run_is_named(copy_reference):
    run = copy_reference()
    (run / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    before = snapshot(run)
    line = assert_one_line_user_error(run_cli_in_process("eval", str(run)), expect_in=("tokenizer.json", "damaged"))
    assert "restore the run directory" in line and "data.tokenizer" not in line
    assert snapshot(run) == before
