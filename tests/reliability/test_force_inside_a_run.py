"""`--force` never moves part of a training run: an export, a training run or a comparison
aimed at a folder inside a run (its checkpoints/ above all) is refused with or without --force, and so is a
--force onto a folder that holds other runs. Before, `export RUN --out RUN/checkpoints --force` moved the
run's checkpoints aside and the run could no longer be resumed, evaluated or exported. Through the real CLI:
one line, exit 2, every file unchanged. And where a run's checkpoints were moved aside all the same (by an
fp4lm from before this check), `eval` and `train` name the folder to move back."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.reliability.helpers_reliability import assert_one_line_user_error, run_cli_in_process, snapshot


def _fake_run(path: pathlib.Path) -> pathlib.Path:
    """What makes a directory an fp4lm training run: fp4lm's config.json (written first by every run) and a
    committed checkpoint step."""
    (path / "checkpoints" / "3").mkdir(parents=True)
    (path / "checkpoints" / "3" / "state").write_text("weights\n")
    (path / "config.json").write_text(json.dumps({"train": {"steps": 3}, "model": {}}))
    return path


def _assert_refused(result, parent: pathlib.Path, before: dict, *expect_in: str) -> None:
    line = assert_one_line_user_error(result, expect_in=expect_in)
    assert "training run" in line
    assert snapshot(parent) == before, "a refusal moves nothing and writes nothing"


@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("target", ["checkpoints", "checkpoints/3", "exports/hf"])
def test_export_into_the_exported_run_is_refused(copy_reference, tmp_path, force, target):
    run = copy_reference()
    before = snapshot(tmp_path)
    out = run / target
    result = run_cli_in_process("export", str(run), "--format", "hf", "--out", str(out), *["--force"] * force)
    _assert_refused(result, tmp_path, before, f"--out {out}", "inside the fp4lm training run", str(run.resolve()))


def test_export_into_another_runs_checkpoints_is_refused(copy_reference, tmp_path):
    run, other = copy_reference(), _fake_run(tmp_path / "other")
    before = snapshot(tmp_path)
    out = other / "checkpoints"
    result = run_cli_in_process("export", str(run), "--format", "nvfp4", "--out", str(out), "--force")
    _assert_refused(result, tmp_path, before, str(other.resolve()))


@pytest.mark.parametrize("target", ["checkpoints", "fresh"])
@pytest.mark.parametrize("force", [True, False])
def test_a_run_dir_inside_a_run_is_refused(copy_reference, tmp_path, target, force):
    run = copy_reference()
    before = snapshot(tmp_path)
    setting = f"train.run_dir={run / target}"
    result = run_cli_in_process("train", setting, "train.steps=2", *["--force"] * force)
    _assert_refused(result, tmp_path, before, setting, "inside the fp4lm training run")


def test_force_onto_a_folder_that_holds_runs_is_refused(copy_reference, tmp_path):
    copy_reference("runs/first")
    _fake_run(tmp_path / "runs" / "second")
    before = snapshot(tmp_path)
    result = run_cli_in_process("train", f"train.run_dir={tmp_path / 'runs'}", "train.steps=2", "--force")
    _assert_refused(result, tmp_path, before, "holds the fp4lm training run", "train.overwrite")


def test_force_onto_the_run_itself_still_moves_it_aside(tmp_path):
    """What --force is for: starting over in a run's own directory (refused only before compiling here, by a
    config the saved run never had, so that nothing trains)."""
    run = _fake_run(tmp_path / "run")
    result = run_cli_in_process("train", f"train.run_dir={run}", "model.d_model=-1", "--force")
    line = assert_one_line_user_error(result, expect_in=("model.d_model",))
    assert "training run" not in line


@pytest.mark.parametrize("target", ["checkpoints", "compare"])
def test_compare_inside_a_run_is_refused(copy_reference, tmp_path, target):
    run = copy_reference()
    before = snapshot(tmp_path)
    out = run / target
    result = run_cli_in_process("compare", "--recipes", "bf16", "--out", str(out), "--force")
    _assert_refused(result, tmp_path, before, f"--out {out}", "inside the fp4lm training run")


def test_compare_force_onto_a_folder_that_holds_a_run_is_refused(copy_reference, tmp_path):
    copy_reference("results/run")
    (tmp_path / "results" / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    out = tmp_path / "results"
    result = run_cli_in_process("compare", "--recipes", "bf16", "--out", str(out), "--force")
    _assert_refused(result, tmp_path, before, "holds the fp4lm training run", "--force will not move")


def test_a_folder_named_checkpoints_of_another_tool_is_no_run(tmp_path):
    """A user's own project folder with a checkpoints/ of another tool is not taken for a run: a run below it
    is not refused for lying inside one."""
    from fp4lm.train.run_dir import enclosing_training_run

    (tmp_path / "project" / "checkpoints" / "model.pt").mkdir(parents=True)
    (tmp_path / "project" / "metrics.jsonl").write_text("{}\n")
    assert enclosing_training_run(tmp_path / "project" / "runs" / "mine") is None
    assert enclosing_training_run(_fake_run(tmp_path / "run") / "checkpoints") == (tmp_path / "run").resolve()


@pytest.mark.parametrize("export_in_place", [False, True])
def test_eval_and_train_name_checkpoints_moved_aside(copy_reference, export_in_place):
    """The state an earlier fp4lm left after `export RUN --out RUN/checkpoints --force`: the checkpoints
    moved to checkpoints.old-<date-time> (and an export in their place), or only moved."""
    run = copy_reference()
    moved = run / "checkpoints.old-20261207-101500"
    (run / "checkpoints").rename(moved)
    if export_in_place:
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "model.safetensors").write_text("export\n")
    before = snapshot(run)
    line = assert_one_line_user_error(run_cli_in_process("eval", str(run)), expect_in=(str(moved), "rename"))
    assert "wait for the first save" not in line
    assert_one_line_user_error(run_cli_in_process("train", f"train.run_dir={run}"), expect_in=(str(moved), "rename"))
    assert snapshot(run) == before
