"""What `inspect_run_dir` makes of a directory, and moving one aside (fp4lm/train/run_dir.py)."""

import fcntl
import json

import pytest

from fp4lm.errors import UserError
from fp4lm.train.run_dir import (
    MOVE_ASIDE,
    NEW,
    REFUSED,
    RESTART,
    RESUME,
    RunDirClaim,
    inspect_run_dir,
    move_aside,
)
from fp4lm.train.run_lock import LOCK_FILE


def _marker(run_dir, *, checkpoints: bool = True):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"checkpoint": {"enabled": checkpoints}}))
    return run_dir


def _kind(path, **kwargs) -> str:
    return inspect_run_dir(str(path), **kwargs).kind


def test_new_directories(tmp_path):
    assert _kind(tmp_path / "absent") == NEW
    (tmp_path / "empty").mkdir()
    assert _kind(tmp_path / "empty") == NEW
    killed_at_start = tmp_path / "killed_at_start"  # the lock and an unfinished atomic write only
    killed_at_start.mkdir()
    (killed_at_start / LOCK_FILE).write_text("")
    (killed_at_start / ".config.json.0123abcd.tmp").write_text("{")
    assert _kind(killed_at_start) == NEW


def test_runs_that_continue(tmp_path):
    stopped = _marker(tmp_path / "stopped")  # before its first checkpoint
    (stopped / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    (stopped / "checkpoints" / "2.orbax-checkpoint-tmp-99").mkdir(parents=True)  # a save cut short
    assert _kind(stopped) == RESTART
    resumable = tmp_path / "resumable"
    (resumable / "checkpoints" / "3").mkdir(parents=True)
    (resumable / "summary.json").write_text("{}")
    assert _kind(resumable) == RESUME


def test_directories_that_training_would_overwrite(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    finished = _marker(tmp_path / "finished", checkpoints=False)
    (finished / "summary.json").write_text("{}")
    no_checkpoints = _marker(tmp_path / "no_checkpoints", checkpoints=False)
    finished_without_a_checkpoint = _marker(tmp_path / "finished_without_a_checkpoint")
    (finished_without_a_checkpoint / "summary.json").write_text("{}")
    for path, words in (
        (users, "notes.txt"),
        (finished, "finished run"),
        (no_checkpoints, "checkpoint.enabled=false"),
        (finished_without_a_checkpoint, "finished run"),
    ):
        run = inspect_run_dir(str(path))
        assert run.kind == REFUSED
        with pytest.raises(UserError, match="--force") as refused:
            run.check_accepted()
        assert words in str(refused.value) and "train.overwrite=true" in str(refused.value)
        assert _kind(path, overwrite=True) == MOVE_ASIDE
    assert _kind(tmp_path / "absent", overwrite=True) == NEW


def test_an_empty_setting_and_a_file_are_refused(tmp_path):
    with pytest.raises(UserError, match="train.run_dir is empty"):
        inspect_run_dir("")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="not a directory"):
        inspect_run_dir(str(tmp_path / "file"))


def test_move_aside_keeps_everything_under_a_new_name(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "sub").mkdir(parents=True)
    (run_dir / "sub" / "a.txt").write_text("a")
    first = move_aside(run_dir)
    run_dir.mkdir()
    second = move_aside(run_dir)
    assert first != second and first.name.startswith("run.old-") and second.name.startswith("run.old-")
    assert (first / "sub" / "a.txt").read_text() == "a" and not run_dir.exists()


def test_a_directory_in_use_is_not_moved_aside(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    with (run_dir / LOCK_FILE).open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(UserError, match="in use"), RunDirClaim(inspect_run_dir(str(run_dir), overwrite=True), {}):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_the_current_directory_is_never_moved_aside(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path / "work")
    assert _kind(".") == REFUSED
    for setting in (".", str(tmp_path)):
        with pytest.raises(UserError, match="holds the current directory"):
            inspect_run_dir(setting, overwrite=True)
