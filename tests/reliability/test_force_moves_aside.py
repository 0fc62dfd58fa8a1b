"""`fp4lm export --force` moves what --out holds aside and never deletes it; an --out that is or holds the
current directory or a training run is refused. Through the real command line."""

from __future__ import annotations

import os
import pathlib

import pytest

from fp4lm.errors import UserError
from fp4lm.export import output_dir
from tests.reliability.helpers_reliability import assert_one_line_user_error, run_cli_in_process, snapshot


def _users_files(path: pathlib.Path) -> pathlib.Path:
    (path / "notes").mkdir(parents=True)
    (path / "report.html").write_text("<p>my own report</p>\n")
    (path / "notes" / "plan.txt").write_text("export the final step\n")
    return path


def test_export_force_moves_the_old_contents_aside(reference_run, tmp_path):
    out = _users_files(tmp_path / "exported")
    before, run_before = snapshot(out), snapshot(reference_run)
    result = run_cli_in_process("export", str(reference_run), "--format", "hf", "--out", str(out), "--force")
    assert result.code == 0, result.stderr
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("exported.old-")]
    assert len(moved) == 1 and snapshot(moved[0]) == before, "the old contents must be moved aside unchanged"
    assert f"moved the old contents of {out} to {moved[0]}" in result.stdout
    assert (out / "config.json").is_file() and not (out / "report.html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["exported", moved[0].name]), "no staging left"
    assert snapshot(reference_run) == run_before


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("holds_files", [False, True])
def test_export_into_the_current_directory_is_refused(reference_run, tmp_path, monkeypatch, force, holds_files):
    monkeypatch.chdir(tmp_path)
    if holds_files:
        _users_files(tmp_path)
    before = snapshot(tmp_path)
    result = run_cli_in_process("export", str(reference_run), "--format", "hf", "--out", ".", *["--force"] * force)
    assert_one_line_user_error(result, expect_in=("--out .", "the current directory"))
    assert snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == (["notes", "report.html"] if holds_files else [])


def test_a_failed_final_move_leaves_the_old_directory_in_place(tmp_path, monkeypatch):
    out = _users_files(tmp_path / "exported")
    before = snapshot(out)
    real_replace = os.replace

    def failing_replace(source, target):
        if pathlib.Path(source).name.startswith(".exported.export-"):
            raise OSError(28, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(output_dir.os, "replace", failing_replace)
    with pytest.raises(UserError, match="No space left"), output_dir.staged_output(out) as staging:
        (staging / "model.safetensors").write_bytes(b"weights")
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"], "no staging or moved-aside copy remains"
