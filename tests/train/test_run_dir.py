"""What `inspect_run_dir` makes of a directory, and moving one aside (fp4lm/train/run_dir.py)."""

import fcntl
import json
from typing import Any

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
)
from fp4lm.train.run_lock import LOCK_FILE
from fp4lm.user_dirs import move_aside


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


# ---------------------------------------------------------------- resuming from the directory alone


def _run_with_checkpoint(run_dir, monkeypatch, *, latest: dict, trained: dict):
    """A run directory seen as RESUME: config.json holds `latest`, the newest checkpoint `trained`."""
    from fp4lm.train.run_dir import RunDir

    (run_dir / "checkpoints" / "3").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(latest))
    monkeypatch.setattr(RunDir, "saved_config", lambda self: trained if self.kind == RESUME else None)
    return run_dir


def test_the_base_of_a_resume_is_the_latest_config_not_the_checkpoints(tmp_path, monkeypatch):
    """Extended (train.steps 3 -> 6) or switched (precision.recipe) and killed before the next checkpoint:
    `train.run_dir=X` alone keeps the latest settings; the pending switch stays allowed, another is not."""
    from fp4lm.config import Config, from_dict
    from fp4lm.train.run_dir import load_train_config

    trained = from_dict({"train": {"steps": 3}, "precision": {"recipe": "nvfp4"}}).to_dict()
    latest = from_dict(
        {"train": {"steps": 6, "allow_recipe_change": True}, "precision": {"recipe": "fp8"}}, Config()
    ).to_dict()
    run_dir = _run_with_checkpoint(tmp_path / "run", monkeypatch, latest=latest, trained=trained)
    config = load_train_config(None, [f"train.run_dir={run_dir}"])
    assert config.train.steps == 6 and config.precision.recipe == "fp8" and config.train.allow_recipe_change
    other = load_train_config(None, [f"train.run_dir={run_dir}", "precision.recipe=bf16"])
    assert other.precision.recipe == "bf16" and not other.train.allow_recipe_change
    back = load_train_config(None, [f"train.run_dir={run_dir}", "precision.recipe=nvfp4"])
    assert not back.train.allow_recipe_change


def test_resume_overrides_are_validated_against_the_saved_config(tmp_path):
    """model.num_kv_heads=3 divides the saved run's 6 heads (not the defaults' 4): accepted."""
    from fp4lm.config import from_dict
    from fp4lm.train.run_dir import load_train_config

    saved = from_dict({"model": {"d_model": 96, "num_heads": 6, "num_kv_heads": 6}}).to_dict()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(saved))  # a RESTART directory
    config = load_train_config(None, [f"train.run_dir={run_dir}", "model.num_kv_heads=3"])
    assert config.model.num_heads == 6 and config.model.num_kv_heads == 3
    with pytest.raises(UserError, match="num_kv_heads"):
        load_train_config(None, [f"train.run_dir={tmp_path / 'new'}", "model.num_kv_heads=3"])


def _stub_run(run_dir, *, steps: int, start_step: int, recipe_change=None):
    """A `_Run` with only what `loop()` reads before it builds the step functions."""
    from fp4lm.config import from_dict
    from fp4lm.train.bf16_switch import Bf16Switch
    from fp4lm.train.loop import _Run

    run: Any = object.__new__(_Run)  # attributes set by hand, not by __init__
    run.config = from_dict({"train": {"steps": steps}, "metrics": {"tensorboard": False}})
    run.run_dir, run.start_step, run.main, run.recipe_change = run_dir, start_step, True, recipe_change
    run.quantized_policy = None
    run.switch = Bf16Switch(None)
    run.checkpointer = None
    messages: list[str] = []
    run.reporter = type("R", (), {"message": lambda self, text: messages.append(text)})()
    run._report_summary = lambda summary: None
    return run, messages


def _write_records(run_dir, records) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_finished_run_drops_the_records_of_a_longer_run_killed_before_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    _write_records(run_dir, [{"step": s, "loss": 5.0} for s in range(1, 6)])
    (run_dir / "summary.json").write_text(json.dumps({"steps": 3}))
    run, messages = _stub_run(run_dir, steps=3, start_step=3)
    assert run.loop() == {"steps": 3}
    assert "already finished" in messages[0]
    assert [r["step"] for r in _records(run_dir)] == [1, 2, 3]


def test_a_resumed_recipe_switch_is_logged_once(tmp_path, monkeypatch):
    """Switch events at the resumed step are logged again by the resumed run (the bf16 switch before its first
    step, fp4lm.train.hooks.PrecisionSwitch); those of earlier steps are kept."""
    from fp4lm.train import model_setup

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    run_dir = tmp_path / "run"
    switch = {"step": 3, "event": "precision_switch", "setting": "precision.recipe", "from": "nvfp4", "to": "fp8"}
    bf16 = {"step": 3, "event": "precision_switch", "to": "bf16"}
    earlier = {**switch, "step": 1, "from": "fp8", "to": "nvfp4"}
    _write_records(run_dir, [earlier, {"step": 3, "loss": 5.0}, switch, bf16, {"step": 4, "loss": 5.0}])
    monkeypatch.setattr(model_setup, "policy_at", stop)  # stops loop() right after the switch is logged
    run, _ = _stub_run(run_dir, steps=6, start_step=3, recipe_change=("nvfp4", "fp8"))
    with pytest.raises(Stop):
        run.loop()
    assert _records(run_dir) == [earlier, {"step": 3, "loss": 5.0}, switch]


def test_without_checkpoints_sigterm_and_ctrl_c_say_to_start_again_with_force(tmp_path, monkeypatch, capsys):
    import fp4lm.train
    from fp4lm import cli
    from fp4lm.errors import Terminated

    run, _ = _stub_run(tmp_path / "run", steps=6, start_step=0)
    with pytest.raises(Terminated, match="--force") as stopped:
        run._stop_after(2, saved=False)
    assert "moves these results aside" in str(stopped.value)

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(fp4lm.train, "train", interrupted)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit):
        cli.main(["train", f"train.run_dir={run_dir}", "checkpoint.enabled=false"])
    line = capsys.readouterr().err.strip()
    assert "--force" in line and "checkpoint.enabled=false" in line and "resumes" not in line
    _marker(run_dir, checkpoints=False)  # what such a run leaves: refused, and moved aside by --force
    assert _kind(run_dir) == REFUSED and _kind(run_dir, overwrite=True) == MOVE_ASIDE


def test_a_failed_set_up_renames_a_moved_aside_directory_back(tmp_path, monkeypatch):
    import errno
    import os

    import fp4lm.train.run_dir as run_dir_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "config.json")

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    monkeypatch.setattr(run_dir_module, "write_json_atomically", full)
    claim = RunDirClaim(inspect_run_dir(str(run_dir), overwrite=True), {})
    with pytest.raises(UserError, match="no space left"), claim:
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (run_dir / "notes.txt").read_text() == "mine"
